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
    .venv/bin/python benchmarks/s2_one_model_ceiling.py --construction authors --data-seeds 0 1 2 3 4
    .venv/bin/python benchmarks/s2_one_model_ceiling.py --continual --seeds 10 55 2077
    .venv/bin/python benchmarks/s2_one_model_ceiling.py --continual --construction authors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = str(Path(__file__).resolve().parents[2] / "shared" / "datasets")


def ceiling(construction: str, seed: int, data_seed: int = 0) -> dict:
    from clusterfed.data import load_dataset
    from clusterfed.scenarios import build_authors_scenario, build_scenario

    ds = load_dataset("mnist", ROOT)
    fed = (build_authors_scenario(ds, "S2", seed=seed, data_seed=data_seed) if construction == "authors"
           else build_scenario(ds, "S2", group_sizes=[10, 10], seed=seed))
    k = ds.n_classes
    counts = np.zeros((2, k))  # [group, true digit]: test samples
    trained = np.zeros((2, k))  # [group, true digit]: training samples (FedAvg weighs each alike)
    for device, group in zip(fed.devices, fed.groups):
        true = (np.asarray(device.y_test) - group) % k  # undo the shift c of group c
        np.add.at(counts[group], true, 1)
        np.add.at(trained[group], (np.concatenate([device.y_train, device.y_val]) - group) % k, 1)
    n = counts.sum()
    return {"construction": construction, "devices": len(fed.devices), "test_samples": int(n),
            "share_unshifted": counts[0].sum() / n, "ceiling": np.maximum(counts[0], counts[1]).sum() / n,
            "training_majority": np.where(trained[0] >= trained[1], counts[0], counts[1]).sum() / n}


def continual_ceiling(seed: int, timesteps: int = 10, construction: str = "thesis") -> tuple[list[float], list[float]]:
    """Per timestep t = 1..T, the error-free one-model ceiling of multi-task S2 under the
    mean device accuracy, on the data the continual stage draws, and the error-free
    score of the model the training data can teach: each digit answered with the
    labelling that has more *training* samples (FedAvg's pooled objective, every sample
    weighted alike), scored on the test samples."""
    from clusterfed.continual.schedules import multitask_schedule
    from clusterfed.continual.state import timestep_seed
    from clusterfed.data import load_dataset
    from clusterfed.scenarios import build_authors_scenario, federation_from_concepts

    ds = load_dataset("mnist", ROOT, seed=seed)
    k = ds.n_classes
    schedule = multitask_schedule(100 if construction == "authors" else 20, timesteps)
    out, learnable = [], []
    for t in range(1, timesteps + 1):
        fed = (build_authors_scenario(ds, "S2", seed=seed, concepts=schedule[:, t], timestep=t)
               if construction == "authors" else
               federation_from_concepts(ds, "S2", schedule[:, t], n_concepts=2, seed=timestep_seed(seed, t),
                                        samples_per_device=1000, test_samples_per_device=200))
        worth = np.zeros((2, k))  # [shift, true digit]: summed share of each device's test samples
        trained = np.zeros((2, k))  # [shift, true digit]: training samples
        for device, shift in zip(fed.devices, schedule[:, t]):
            y = np.asarray(device.y_test)
            np.add.at(worth[shift], (y - shift) % k, 1.0 / len(y))
            np.add.at(trained[shift], (np.concatenate([device.y_train, device.y_val]) - shift) % k, 1)
        out.append(float(np.maximum(worth[0], worth[1]).sum() / len(fed.devices)))
        taught = np.where(trained[0] >= trained[1], worth[0], worth[1])
        learnable.append(float(taught.sum() / len(fed.devices)))
    return out, learnable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--construction", nargs="+", default=None, choices=["authors", "thesis"],
                   help="default: both for the cold start, the thesis reading with --continual")
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--data-seeds", nargs="+", type=int, default=[0],
                   help="authors' construction: draws of the FedProx power law (scenario.data_seed)")
    p.add_argument("--continual", action="store_true",
                   help="the continual multi-task S2 cell (the first --construction; thesis reading by default)")
    p.add_argument("--seeds", nargs="+", type=int, default=[10], help="with --continual")
    args = p.parse_args()
    args.construction = args.construction or (["thesis"] if args.continual else ["authors", "thesis"])
    if args.continual:
        means, taught = [], []
        for seed in args.seeds:
            per_t, learnable = continual_ceiling(seed, construction=args.construction[0])
            means.append(np.mean(per_t))
            taught.append(np.mean(learnable))
            print(f"multi-task S2 ({args.construction[0]}), seed {seed}: ceiling per timestep t = 1..10 "
                  f"{', '.join(f'{100 * c:.2f}' for c in per_t)}; mean {100 * means[-1]:.2f} %")
            print(f"    training majority per timestep {', '.join(f'{100 * c:.2f}' for c in learnable)}; "
                  f"mean {100 * taught[-1]:.2f} %")
        print(f"mean over seeds: ceiling {100 * np.mean(means):.2f} %, training majority {100 * np.mean(taught):.2f} %")
        return
    runs = [(c, d) for c in args.construction for d in (args.data_seeds if c == "authors" else [0])]
    for c, d in runs:
        r = ceiling(c, args.seed, d)
        draw = f" (data seed {d})" if c == "authors" else ""
        print(f"{c}{draw}: {r['devices']} devices, {r['test_samples']} test samples, "
              f"{100 * r['share_unshifted']:.2f} % unshifted; one-model ceiling {100 * r['ceiling']:.2f} %, "
              f"training majority {100 * r['training_majority']:.2f} %")

if __name__ == "__main__":
    main()
