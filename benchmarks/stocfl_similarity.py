"""How StoCFL's client representations separate the rotations at |D| = 50 and 200 (issue 17, item 3).

StoCFL merges two sampled clusters when the cosine of their mean representations
exceeds τ (§2.2; τ = 0.5 in its Table 1). This script measures, on the federations of
``stocfl_scale.py`` (rotated MNIST, |D| = 50 at N = 4800 and |D| = 200 at N = 1200,
5 % of each client's data held out), the cosine between the representations of
``--sample`` random clients, split into pairs of the same rotation and of different
rotations, for both readings of Ψ: the paper's gradient of the anchor ψ (§2.1) and
the authors' code's anchor movement after 20 epochs of local SGD at batch 50
(``StoCFL(representation="movement")``). The anchor is ω_0 drawn as ``StoCFL.init``
draws it (``Engine.init_params`` under the run's seed). One JSON line per
(setting, seed, representation) goes to ``--out``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/stocfl_similarity.py --seeds 10 55 2077
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from clusterfed.algorithms import StoCFL
from clusterfed.algorithms.stocfl import cosine_similarity
from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios.partitions import build_partition

SETTINGS = {"4800x50": (4800, 50), "1200x200": (1200, 200)}
PERCENTILES = (1, 5, 50, 95, 99)


def measure(ds, clients: int, samples: int, seed: int, representation: str, n_sample: int, tau: float) -> dict:
    fed = build_partition(ds, "rotated", seed=seed, group_sizes=[clients // 4] * 4, samples_per_device=samples,
                          test_samples_per_device=8, val_fraction=0.05)
    engine = Engine(fed, model="mlp", hidden=128, device="cpu",
                    training=TrainingConfig(lr=0.1, l2=0.0, batch_size=samples, local_epochs=5))
    generator = torch.Generator().manual_seed(seed)
    ψ = engine.init_params(1, generator, distinct=False)
    devices = np.sort(np.random.default_rng(seed).choice(engine.n_devices, n_sample, replace=False))
    Ψ = StoCFL(representation=representation).represent(engine, ψ, devices, generator)
    upper = np.triu_indices(len(devices), 1)
    cos = cosine_similarity(Ψ)[upper]
    group = np.asarray(fed.groups)[devices]
    a, b = group[upper[0]], group[upper[1]]
    same = a == b
    by_pair = {f"{i}-{j}": round(float(np.median(cos[((a == i) & (b == j)) | ((a == j) & (b == i))])), 3)
               for i in range(4) for j in range(i + 1, 4)}
    return {
        "setting": f"{clients}x{samples}", "seed": seed, "representation": representation, "clients_sampled": n_sample,
        "same_rotation": [round(float(v), 3) for v in np.percentile(cos[same], PERCENTILES)],
        "other_rotation": [round(float(v), 3) for v in np.percentile(cos[~same], PERCENTILES)],
        "share_same_above_tau": round(float(np.mean(cos[same] > tau)), 4),
        "share_other_above_tau": round(float(np.mean(cos[~same] > tau)), 5),
        "median_by_rotation_pair": by_pair, "tau": tau,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[10])
    ap.add_argument("--representations", nargs="+", choices=("gradient", "movement"), default=["gradient", "movement"])
    ap.add_argument("--sample", type=int, default=400, help="clients whose pairwise cosines are measured")
    ap.add_argument("--tau", type=float, default=0.5)
    ap.add_argument("--root", default="../shared/datasets")
    ap.add_argument("--out", default="benchmarks/out/stocfl_similarity.jsonl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("mnist", args.root)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    print(f"| setting | seed | Ψ | same rotation: 1/5/50/95/99 % | other rotations: 1/5/50/95/99 % "
          f"| share same > τ | share other > τ |\n|---|---|---|---|---|---|---|")
    for name in args.settings:
        for seed in args.seeds:
            for representation in args.representations:
                row = measure(ds, *SETTINGS[name], seed, representation, args.sample, args.tau)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"| {name} | {seed} | {representation} | {row['same_rotation']} | {row['other_rotation']} | "
                      f"{row['share_same_above_tau']:.3f} | {row['share_other_above_tau']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
