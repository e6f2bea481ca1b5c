"""Train the clusters the authors' FAACL script found, with our engine and their schedule.

``run_authors_faacl.py`` stops their script after clustering (``--rounds 1``): their
300 TensorFlow training rounds would take most of a day on two cores. This trains the
clustering they printed (``<out>.json``) to the end instead, on the same federation
(our authors' construction, device d = their client d), so the accuracy their clusters
reach can be set beside the thesis and beside our FAACL's own clusters. Each cluster
trains one model from a fresh start by FedAvg over its devices (300 rounds × 10 local
epochs, lr 0.01, L2 0.001, batch 10: their schedule); a device listed in two clusters
(their overlapping merge) trains and is served in the first. The figure is accuracy
over all test samples, the authors' own figure.

    .venv/bin/python benchmarks/authors_code/train_given_clusters.py \
        --clusters benchmarks/out/authors_code/a1_eps0.5_seed10.json --threads 1 \
        --out benchmarks/out/authors_code/a1_eps0.5_seed10_trained.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def given_groups(clusters: list[dict], n_devices: int) -> list[list[int]]:
    """Each device in the first cluster that lists it; a device no cluster lists is an error."""
    seen: set[int] = set()
    groups = []
    for c in clusters:
        g = [d for d in c["devices"] if d not in seen]
        seen.update(g)
        if g:
            groups.append(g)
    missing = sorted(set(range(n_devices)) - seen)
    if missing:
        raise SystemExit(f"devices {missing} are in no cluster of the given clustering")
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", required=True, help="<out>.json of run_authors_faacl.py")
    ap.add_argument("--root", default="../shared/datasets")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--local-epochs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=None, help="training seed (default: the run's seed)")
    ap.add_argument("--data-seed", type=int, default=None,
                    help="the draw the clusters were found on, as given to export_fedprox_json.py "
                         "(their JSON does not record it; default: the construction's own draw)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.algorithms.baselines import FedAvg
    from clusterfed.data import load_dataset
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios import build_authors_scenario
    from clusterfed.scenarios.authors import DATA_SEED

    torch.set_num_threads(args.threads)
    given = json.loads(Path(args.clusters).read_text())
    seed = given["seed"] if args.seed is None else args.seed
    data_seed = DATA_SEED if args.data_seed is None else args.data_seed
    fed = build_authors_scenario(load_dataset("mnist", args.root), given["scenario"], seed=seed,
                                 data_seed=data_seed)
    groups = given_groups(given["clusters"], len(fed.devices))

    class GivenClusters(FedAvg):
        """FedAvg within each of the given clusters."""

        def groups(self, n_devices: int) -> list[list[int]]:
            return groups

    eng = Engine(fed, model="mlp", training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10,
                                                           local_epochs=args.local_epochs),
                 hidden=128)
    t0 = time.perf_counter()
    res = GivenClusters(rounds=args.rounds).fit(eng, seed=seed, progress=True, ground_truth=fed.groups)
    wall = time.perf_counter() - t0
    acc = np.asarray(res.device_accuracy, dtype=float)
    n_test = np.array([len(d.y_test) for d in fed.devices])
    label = np.empty(len(fed.devices), dtype=int)
    for i, g in enumerate(groups):
        label[g] = i
    row = {
        "clusters_from": args.clusters,
        "scenario": given["scenario"],
        "seed": seed,
        "data_seed": data_seed,
        "rounds": args.rounds,
        "local_epochs": args.local_epochs,
        "n_clusters": len(groups),
        "ari": float(adjusted_rand_score(fed.groups, label)),
        "accuracy_all_test": float((acc * n_test).sum() / n_test.sum()),
        "accuracy_mean": float(acc.mean()),
        "accuracy_group_all_test": {
            int(g): float((acc * n_test)[fed.groups == g].sum() / n_test[fed.groups == g].sum())
            for g in np.unique(fed.groups)
        },
        "accuracy_device": [round(float(a), 4) for a in acc],
        "wall_s": wall,
    }
    Path(args.out).write_text(json.dumps(row, indent=1))
    print(f"{given['scenario']}: {len(groups)} clusters, ARI {row['ari']:.3f}, "
          f"all test samples {100 * row['accuracy_all_test']:.2f} %, wall {wall:.0f} s")


if __name__ == "__main__":
    main()
