"""One FedSoft-shaped local round on the authors' power-law A2 devices: the pull's cost.

FedSoft (and Ditto's personal models) train one pair per device, each pulled to its
own centre by a scalar a_k (``QuadraticPenalty``, one row per pair). The authors'
A2 devices hold 30 to about 3000 training samples, so in most steps of an epoch only
the largest few devices still train. The SGD step takes only those pairs
(``Minibatch.rows``); this measures what the pull costs beside it.

Times ``Engine.local_models`` on the authors' A2 (50 devices, the thesis' 784-128-10
MLP, batch 10, ``--epochs`` local epochs) with the pull (μ a_k = 0.1, centres drawn
once) and without it (plain SGD, the same pairs), interleaved, medians over
``--reps``. Run it under two checkouts' ``src`` to compare code; ``farm-bench`` pairs
the two processes:

    PYTHONPATH=src .venv/bin/python benchmarks/pull_power_law.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.scenarios.authors import build_authors_scenario


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    fed = build_authors_scenario(load_dataset("mnist", args.root), "A2", seed=10)
    engine = Engine(fed, hidden=128, training=TrainingConfig(lr=0.01, l2=0.0, batch_size=10), device="cpu")
    n = engine.n_devices
    start = engine.init_params(n, torch.Generator().manual_seed(0), distinct=True)
    centre = engine.init_params(n, torch.Generator().manual_seed(1), distinct=True)
    a = torch.full((n,), 0.1)
    pull = QuadraticPenalty({k: a.view(-1, *[1] * (v.dim() - 1)) for k, v in start.items()}, centre)
    pairs = np.arange(n)

    def run(penalty):
        return engine.local_models(start, pairs, pairs, torch.Generator().manual_seed(7), local_epochs=args.epochs,
                                   penalty=penalty)

    runs = {"with_pull": lambda: run(pull), "plain": lambda: run(None)}
    for fn in runs.values():  # warm-up
        fn()
    seconds = {name: [] for name in runs}
    for _ in range(args.reps):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(ts) for name, ts in seconds.items()}
    counts = engine.counts("train")
    result = {
        "devices": n, "train_samples": {"min": int(counts.min()), "median": int(np.median(counts)),
                                         "max": int(counts.max())},
        "epochs": args.epochs, "threads": args.threads, "reps": args.reps,
        "median_s": median, "pull_over_plain": median["with_pull"] / median["plain"],
        "load": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
