"""Where the time of a full MNIST S2 FAACL run goes (issue 17 item 7).

The thesis run of ``thesis_mnist.py`` (S2, 20 devices in two groups of 10, MLP
784-128-10, lr 0.01, L2 0.001, batch 10, one local epoch per round, α 0.1, ε 0.7,
5 initial epochs, flat FAACL) for ``--rounds`` rounds, with wall time attributed to
(exclusive times, nested calls go to the inner category):

- training: local SGD (``local_sgd``), screening (``Engine.screen``), the rest of
  ``Engine.train`` / ``local_models`` (pair setup, weighted averaging);
- evaluation: ``Engine.losses`` / ``own_losses`` / ``mean_losses`` / ``accuracy``
  (the support test's validation losses and the driver's per-round test accuracy);
- statistics: FAACL's ``support_pvalues`` and ``significant`` (Wilcoxon tests);
- the rest: the driver, clustering bookkeeping, history, Python overhead.

FLOPs are counted analytically from the samples each call processes (per sample:
forward 2·(784·128 + 128·10), SGD step adds the weight gradients 2·(784·128 + 128·10)
and the hidden-layer gradient 2·128·10), so the training share of the machine's
measured matmul peak (``benchmarks/out/matmul_peak.json``, from
``benchmarks/matmul_peak.py``) follows. ``/proc/loadavg`` before and after.

    .venv/bin/python benchmarks/faacl_profile.py --rounds 150 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

OUT = Path(__file__).parent / "out"
IN, HIDDEN, K = 784, 128, 10
FORWARD = 2 * (IN * HIDDEN + HIDDEN * K)
STEP = 2 * FORWARD + 2 * HIDDEN * K


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Clock:
    """Exclusive wall time per category: entering a category pauses the enclosing one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []

    def wrap(self, category: str, fn, flops=None):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            now = time.perf_counter()
            if self.stack:
                outer = self.stack[-1]
                self.seconds[outer[0]] += now - outer[1]
            self.stack.append([category, now])
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                cat, since = self.stack.pop()
                self.seconds[cat] += end - since
                self.calls[cat] += 1
                if flops is not None:
                    self.flops[cat] += flops(*args, **kwargs)
                if self.stack:
                    self.stack[-1][1] = end

        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peak", default=str(OUT / "matmul_peak.json"))
    ap.add_argument("--out", default=str(OUT / "faacl_profile.json"))
    args = ap.parse_args()

    import torch
    from sklearn.metrics import adjusted_rand_score

    import clusterfed.algorithms.faacl as faacl
    import clusterfed.engine.engine as engine_module
    from clusterfed.algorithms import FAACL
    from clusterfed.data import load_dataset
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios import build_scenario

    torch.set_num_threads(args.threads)
    fed = build_scenario(load_dataset("mnist", args.root), "S2", group_sizes=[10, 10], seed=args.seed)
    eng = Engine(fed, model="mlp", training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10), hidden=HIDDEN, device="cpu")
    clock = Clock()
    n_split = {s: eng.counts(s) for s in ("train", "val", "test")}

    def sgd_flops(model, params, data, device_of_pair, *, epochs, **kw):
        return STEP * epochs * float(data.counts[device_of_pair].sum())

    def samples(split, devices=None) -> float:
        counts = n_split[split]
        return float((counts if devices is None else counts[np.asarray(devices)]).sum())

    def losses_flops(self, params, split="val", devices=None, **kw):
        return FORWARD * next(iter(params.values())).shape[0] * samples(split, devices)

    def own_flops(self, params, model_of_device, split="val", devices=None, **kw):
        return FORWARD * samples(split, devices)

    engine_module.local_sgd = clock.wrap("training: local SGD", engine_module.local_sgd, sgd_flops)
    Engine.screen = clock.wrap("training: screening", Engine.screen)
    Engine.train = clock.wrap("training: averaging, setup", Engine.train)
    Engine.local_models = clock.wrap("training: averaging, setup", Engine.local_models)
    Engine.losses = clock.wrap("evaluation", Engine.losses, losses_flops)
    Engine.own_losses = clock.wrap("evaluation", Engine.own_losses, own_flops)
    Engine.accuracy = clock.wrap("evaluation", Engine.accuracy, own_flops)
    Engine.mean_losses = clock.wrap("evaluation", Engine.mean_losses, losses_flops)
    faacl.support_pvalues = clock.wrap("statistics", faacl.support_pvalues)
    faacl.significant = clock.wrap("statistics", faacl.significant)

    method = FAACL(alpha=0.1, epsilon=0.7, init_epochs=5, rounds=args.rounds, variant="flat")
    before = loadavg()
    t0 = time.perf_counter()
    res = method.fit(eng, seed=args.seed, ground_truth=fed.groups)
    wall = time.perf_counter() - t0
    after = loadavg()

    timed = sum(clock.seconds.values())
    seconds = {**clock.seconds, "rest (driver, bookkeeping, Python)": wall - timed}
    peak = None
    if Path(args.peak).exists():
        peak = json.loads(Path(args.peak).read_text())["threads"][str(args.threads)]["peak_gflops"]
    train_s = clock.seconds["training: local SGD"]
    train_flops = clock.flops["training: local SGD"]
    all_flops = sum(clock.flops.values())
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_before": before, "load_after": after, "threads": args.threads, "torch": torch.__version__,
        "rounds": args.rounds, "seed": args.seed, "wall_s": wall,
        "accuracy": float(res.device_accuracy.mean()), "n_clusters": int(res.n_clusters),
        "ari": float(adjusted_rand_score(fed.groups, res.model_of_device)),
        "clustering_rounds": sum(h["phase"] == "clustering" for h in res.history),
        "seconds": seconds, "calls": dict(clock.calls),
        "gflop": {k: v / 1e9 for k, v in clock.flops.items()},
        "local_sgd_gflops": train_flops / train_s / 1e9,
        "run_gflops": all_flops / wall / 1e9,
        "matmul_peak_gflops": peak,
        "local_sgd_share_of_peak": None if peak is None else train_flops / train_s / 1e9 / peak,
        "run_share_of_peak": None if peak is None else all_flops / wall / 1e9 / peak,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
