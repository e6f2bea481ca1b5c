"""What a cold-start snapshot costs beside the rounds it saves (``clusterfed.snapshot``).

On the authors' A1 (100 devices of MNIST, the thesis MLP, 10 local epochs a round),
times one FedAvg round, then saving and loading the snapshot of three states a fit
carries: FedAvg's one model, FAACL's 100 initial cluster models (its largest, before
any merge) and the oracle's pooled training data (Centralize). Medians of
``--repeats`` runs; snapshot bytes on disk. A snapshot every ``--every`` rounds costs
``save / (every x round)`` of the fit.

    .venv/bin/python benchmarks/snapshot_cost.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = str(Path(__file__).resolve().parents[2] / "shared" / "datasets")


def timed(f, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--every", type=int, default=25, help="rounds between snapshots (coldstart.checkpoint_every)")
    ap.add_argument("--root", default=ROOT)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from clusterfed.algorithms import Cluster, Clustering
    from clusterfed.algorithms.base import generators
    from clusterfed.data import load_dataset
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios import build_authors_scenario
    from clusterfed.snapshot import load_snapshot, save_snapshot

    fed = build_authors_scenario(load_dataset("mnist", args.root), "A1", seed=10)
    engine = Engine(fed, model="mlp", hidden=128, device="cpu",
                    training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10, local_epochs=10))
    rng, gen = generators(10)
    one = engine.init_params(1, gen, distinct=False)
    devices = np.arange(engine.n_devices)
    round_s = timed(lambda: engine.train(one, np.zeros(engine.n_devices, dtype=np.int64), devices, gen), 1)

    groups = fed.groups
    states = {
        "fedavg (1 model)": Clustering((Cluster(0, frozenset(range(engine.n_devices))),), one),
        "faacl (100 models)": Clustering(
            tuple(Cluster(d, frozenset({d})) for d in range(engine.n_devices)),
            engine.init_params(engine.n_devices, gen, distinct=True)),
        "centralized (2 models + pooled data)": (
            Clustering((Cluster(0, frozenset(np.flatnonzero(groups == 0).tolist())),
                        Cluster(1, frozenset(np.flatnonzero(groups == 1).tolist()))),
                       engine.init_params(2, gen, distinct=False)),
            engine.pooled([np.flatnonzero(groups == g) for g in (0, 1)])),
    }
    print(f"one FedAvg round on A1 (100 devices x 10 local epochs, {args.threads} thread): {round_s:.2f} s")
    print("| state | snapshot MB | save s | load s | save / (every x round) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, state in states.items():
            where = Path(tmp) / "ckpt"
            tree = {"state": state, "rng": rng, "generator": gen, "done": 1, "rows": []}
            save = timed(lambda: save_snapshot(where, tree, {"fingerprint": "x", "round": 1}), args.repeats)
            load = timed(lambda: load_snapshot(where), args.repeats)
            mb = sum(p.stat().st_size for p in where.iterdir()) / 1e6
            print(f"| {name} | {mb:.1f} | {save:.3f} | {load:.3f} | {save / (args.every * round_s):.2%} |")


if __name__ == "__main__":
    main()
