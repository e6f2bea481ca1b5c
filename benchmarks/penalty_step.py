"""Batched training with a per-model pull vs a plain per-model loop (issue 17 item 5).

StoCFL's bi-level round (§3.2) on MNIST with its 784-2048-10 MLP, full batch: every
sampled client trains θ_k of its cluster, pulled to the global ω by λ/2‖θ_k − ω‖²,
and ω itself (weight 0), so K = 2 cluster models + ω and 2 pairs per client.

- batched: ``Engine.local_models`` with the ``QuadraticPenalty`` given one row per
  model (the engine's path);
- loop: the ordinary way, one ``nn.Module`` per (model, client) pair, one after the
  other, loss = CE + L2 + λ/2‖θ − ω‖² by autograd and ``torch.optim.SGD`` (the centre
  is the model's, never copied per pair).

Same data, same initial models, same number of steps (``--epochs`` full-batch steps per
pair). Interleaved repetitions, medians; ``uptime`` load recorded before and after.
``--memory`` also runs each path once in a fresh subprocess and records its peak RSS
growth during the call (``/proc/self/statm`` sampled every 2 ms, minus the RSS before). Writes ``benchmarks/out/penalty_step.json``.

    .venv/bin/python benchmarks/penalty_step.py --memory
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.models import build_model, is_regularized
from clusterfed.scenarios import build_scenario

LR, L2, LAM, HIDDEN, K = 0.1, 0.0, 0.05, 2048, 2


def setup(args):
    ds = load_dataset("mnist", args.root)
    fed = build_scenario(ds, "S0", group_sizes=[args.clients], seed=10,
                         samples_per_device=args.samples, val_fraction=0.2, test_samples_per_device=10)
    n = max(len(d.y_train) for d in fed.devices)
    eng = Engine(fed, hidden=HIDDEN, device="cpu", training=TrainingConfig(lr=LR, l2=L2, batch_size=n))
    params = eng.init_params(K + 1, torch.Generator().manual_seed(0), distinct=True)  # θ_0, θ_1, ω
    ω = {k: v[K:] for k, v in params.items()}
    penalty = QuadraticPenalty(
        weight={k: torch.cat([torch.full_like(v, LAM).expand(K, *v.shape[1:]), torch.zeros_like(v)]) for k, v in ω.items()},
        center={k: v.expand(K + 1, *v.shape[1:]) for k, v in ω.items()},
    )
    clients = np.arange(args.clients)
    cluster_of = np.random.default_rng(0).integers(0, K, args.clients)  # interleaved, as sampling leaves them
    models = np.concatenate([cluster_of, np.full(args.clients, K)])
    devices = np.concatenate([clients, clients])
    return fed, eng, params, penalty, models, devices


def batched(eng, params, penalty, models, devices, epochs):
    return eng.local_models(params, models, devices, torch.Generator().manual_seed(1), local_epochs=epochs, penalty=penalty)


def loop(fed, eng, params, penalty, models, devices, epochs):
    """One nn.Module per pair; the pull λ/2‖θ − c_m‖² to its model's centre by autograd."""
    out = []
    for m, d in zip(models.tolist(), devices.tolist()):
        net = build_model("mlp", fed.input_shape, fed.n_classes, hidden=HIDDEN)
        net.load_state_dict({k: v[m].clone() for k, v in params.items()})
        opt = torch.optim.SGD(net.parameters(), lr=LR)
        x = torch.as_tensor(fed.devices[d].x_train)
        y = torch.as_tensor(fed.devices[d].y_train)
        w = {k: v[m] for k, v in penalty.weight.items()}
        c = {k: v[m] for k, v in penalty.center.items()}
        for _ in range(epochs):  # full batch: one step per epoch
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            named = dict(net.named_parameters())
            loss = loss + L2 * sum(p.pow(2).sum() for k, p in named.items() if is_regularized(k))
            if bool(w["hidden.weight"].any()):
                loss = loss + 0.5 * sum((w[k] * (p - c[k]).pow(2)).sum() for k, p in named.items())
            loss.backward()
            opt.step()
        out.append(net)
    return out


def uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_growth_mib(fn) -> float:
    """Peak RSS during ``fn()`` minus the RSS before it, sampled by a thread."""
    before, peak, done = rss_mib(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    fn()
    done.set()
    t.join()
    return max(peak[0], rss_mib()) - before


def child_memory(args, path: str) -> float:
    """Peak RSS growth (MiB) of one call of ``path`` in a fresh process."""
    cmd = [sys.executable, __file__, "--child", path, "--clients", str(args.clients), "--samples",
           str(args.samples), "--epochs", str(args.epochs), "--threads", str(args.threads), "--root", args.root]
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1250, help="train + val samples per client (80%% train)")
    ap.add_argument("--epochs", type=int, default=3, help="full-batch steps per pair")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--child", choices=["batched", "loop"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "penalty_step.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fed, eng, params, penalty, models, devices = setup(args)
    run = {
        "batched": lambda: batched(eng, params, penalty, models, devices, args.epochs),
        "loop": lambda: loop(fed, eng, params, penalty, models, devices, args.epochs),
    }
    if args.child:
        print(peak_growth_mib(run[args.child]))
        return

    load_before = uptime()
    for fn in run.values():  # warm-up
        fn()
    times = {name: [] for name in run}
    for _ in range(args.reps):
        for name, fn in run.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    load_after = uptime()
    pairs = len(models)
    per_step = {name: statistics.median(ts) / (args.epochs * pairs) for name, ts in times.items()}
    memory = {name: child_memory(args, name) for name in run} if args.memory else None
    n_train = int(eng.data.train.counts.max())
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_before": load_before, "load_after": load_after,
        "torch": torch.__version__, "threads": args.threads,
        "setup": {"clients": args.clients, "train_samples_per_client": n_train, "pairs": pairs,
                  "models": "K=2 θ_k pulled to ω by λ, and ω", "mlp": f"784-{HIDDEN}-10", "batch": "full",
                  "steps_per_pair": args.epochs, "lr": LR, "lambda": LAM, "reps": args.reps},
        "seconds": times,
        "median_s_per_pair_step": per_step,
        "loop_over_batched": per_step["loop"] / per_step["batched"],
        "peak_rss_growth_mib": memory,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main()
