"""The best accuracy one model can reach on S2, over all test samples.

S2's group c sees every label shifted by c (group 1: y + 1 mod 10), in train and test,
and one model sees only the image. For each true digit d it can answer d (right on
group 0's test samples of d) or d + 1 (right on group 1's), so even error-free it
scores at most Σ_d max(n_0(d), n_1(d)) / N. A FedAvg figure above that is impossible;
one far below it is FedAvg's mixture, not the construction's cap (RESULTS §8,
session 25).

``--continual`` does the same for the continual multi-task S2 cell of thesis Table 4.3
(thesis reading, §4: two halves of 10 devices hold opposite shifts at every
timestep), scored as the continual stage scores it: the mean over devices of each
device's accuracy, averaged over t = 1..T. There a digit's answer is worth
Σ_devices n_dev(d) / n_dev in the group it is right for (RESULTS §12, session 26).

    .venv/bin/python benchmarks/s2_one_model_ceiling.py --construction authors thesis
    .venv/bin/python benchmarks/s2_one_model_ceiling.py --continual --seeds 10 55 2077
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


def continual_ceiling(seed: int, timesteps: int = 10) -> list[float]:
    """Per timestep t = 1..T, the error-free one-model ceiling of multi-task S2 (thesis
    reading) under the mean device accuracy, on the data the continual stage draws."""
    from clusterfed.continual.schedules import multitask_schedule
    from clusterfed.continual.state import timestep_seed
    from clusterfed.data import load_dataset
    from clusterfed.scenarios import federation_from_concepts

    ds = load_dataset("mnist", ROOT, seed=seed)
    k = ds.n_classes
    schedule = multitask_schedule(20, timesteps)
    out = []
    for t in range(1, timesteps + 1):
        fed = federation_from_concepts(ds, "S2", schedule[:, t], n_concepts=2, seed=timestep_seed(seed, t),
                                       samples_per_device=1000, test_samples_per_device=200)
        worth = np.zeros((2, k))  # [shift, true digit]: summed share of each device's test samples
        for device, shift in zip(fed.devices, schedule[:, t]):
            y = np.asarray(device.y_test)
            np.add.at(worth[shift], (y - shift) % k, 1.0 / len(y))
        out.append(float(np.maximum(worth[0], worth[1]).sum() / len(fed.devices)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--construction", nargs="+", default=["authors", "thesis"], choices=["authors", "thesis"])
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--continual", action="store_true", help="the continual multi-task S2 cell (thesis reading)")
    p.add_argument("--seeds", nargs="+", type=int, default=[10], help="with --continual")
    args = p.parse_args()
    if args.continual:
        means = []
        for seed in args.seeds:
            per_t = continual_ceiling(seed)
            means.append(np.mean(per_t))
            print(f"multi-task S2, seed {seed}: ceiling per timestep t = 1..10 "
                  f"{', '.join(f'{100 * c:.2f}' for c in per_t)}; mean {100 * means[-1]:.2f} %")
        print(f"mean over seeds {100 * np.mean(means):.2f} %")
        return
    for c in args.construction:
        r = ceiling(c, args.seed)
        print(f"{c}: {r['devices']} devices, {r['test_samples']} test samples, "
              f"{100 * r['share_unshifted']:.2f} % unshifted; one-model ceiling {100 * r['ceiling']:.2f} %")


if __name__ == "__main__":
    main()
