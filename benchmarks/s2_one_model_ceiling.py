"""The best accuracy one model can reach on S2, over all test samples.

S2's group c sees every label shifted by c (group 1: y + 1 mod 10), in train and test,
and one model sees only the image. For each true digit d it can answer d (right on
group 0's test samples of d) or d + 1 (right on group 1's), so even error-free it
scores at most Σ_d max(n_0(d), n_1(d)) / N. A FedAvg figure above that is impossible;
one far below it is FedAvg's mixture, not the construction's cap (RESULTS §8,
session 25).

    .venv/bin/python benchmarks/s2_one_model_ceiling.py --construction authors thesis
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = str(Path(__file__).resolve().parents[2] / "shared" / "datasets")


def ceiling(construction: str, seed: int) -> dict:
    from clusterfed.data import load_dataset
    from clusterfed.scenarios import build_authors_scenario, build_scenario

    ds = load_dataset("mnist", ROOT)
    fed = (build_authors_scenario(ds, "S2", seed=seed) if construction == "authors"
           else build_scenario(ds, "S2", group_sizes=[10, 10], seed=seed))
    k = ds.n_classes
    counts = np.zeros((2, k))  # [group, true digit]
    for device, group in zip(fed.devices, fed.groups):
        true = (np.asarray(device.y_test) - group) % k  # undo the shift c of group c
        np.add.at(counts[group], true, 1)
    n = counts.sum()
    return {"construction": construction, "devices": len(fed.devices), "test_samples": int(n),
            "share_unshifted": counts[0].sum() / n, "ceiling": np.maximum(counts[0], counts[1]).sum() / n}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--construction", nargs="+", default=["authors", "thesis"], choices=["authors", "thesis"])
    p.add_argument("--seed", type=int, default=10)
    args = p.parse_args()
    for c in args.construction:
        r = ceiling(c, args.seed)
        print(f"{c}: {r['devices']} devices, {r['test_samples']} test samples, "
              f"{100 * r['share_unshifted']:.2f} % unshifted; one-model ceiling {100 * r['ceiling']:.2f} %")


if __name__ == "__main__":
    main()
