"""Vectorised engine vs a device-by-device PyTorch loop: one local epoch on MNIST.

Setup (thesis B.3/B.4): S0 scenario, 20 devices (each ~2250 train samples), MLP
784-128-10, batch 10, one local epoch, lr 0.01, L2 0.001 on the kernels.

- loop: for each device a plain ``build_model("mlp", ...)`` nn.Module, ``torch.optim.SGD``,
  loss = cross_entropy + 0.001 * Σ‖*.weight‖², shuffled batches of 10 (the ordinary way).
- vectorised: ``clusterfed.engine.local_sgd.local_sgd`` over all 20 devices at once.

Both start from the same initial θ. Each path gets one warm-up run, then the median
of ``--reps`` timed repetitions. Mean test accuracy after the epoch is reported for
both as a sanity check. Writes ``benchmarks/out/engine_speed.json``.

    .venv/bin/python benchmarks/engine_speed.py
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import local_sgd
from clusterfed.models import build_model
from clusterfed.scenarios import build_scenario

LR, L2, BATCH, EPOCHS, N_DEVICES = 0.01, 0.001, 10, 1, 20


def loop_train(fed, x_train, y_train, init_state, seed):
    """The ordinary way: one nn.Module + torch.optim.SGD per device, one after another."""
    g = torch.Generator().manual_seed(seed)
    models = []
    for d in range(fed.n_devices):
        model = build_model("mlp", fed.input_shape, fed.n_classes)
        model.load_state_dict(init_state)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = x_train[d], y_train[d]
        for _ in range(EPOCHS):
            perm = torch.randperm(len(y), generator=g)
            for start in range(0, len(y), BATCH):
                idx = perm[start : start + BATCH]
                opt.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss = loss + L2 * sum((p**2).sum() for n, p in model.named_parameters() if n.endswith("weight"))
                loss.backward()
                opt.step()
        models.append(model)
    return models


@torch.no_grad()
def loop_accuracy(models, x_test, y_test):
    return np.array(
        [float((m(x).argmax(1) == y).float().mean()) for m, x, y in zip(models, x_test, y_test)]
    )


def vector_train(eng, init_params, seed):
    g = torch.Generator().manual_seed(seed)
    return local_sgd(
        eng.model,
        init_params,
        eng.data.train,
        torch.arange(N_DEVICES),
        epochs=EPOCHS,
        lr=LR,
        l2=L2,
        batch_size=BATCH,
        generator=g,
    )


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "engine_speed.json"))
    args = ap.parse_args()

    ds = load_dataset("mnist", args.root)
    fed = build_scenario(ds, "S0", group_sizes=[N_DEVICES], seed=args.seed)
    eng = Engine(
        fed,
        model="mlp",
        training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH, local_epochs=EPOCHS),
        hidden=128,
        device="cpu",
    )
    g = torch.Generator().manual_seed(args.seed)
    params = eng.init_params(N_DEVICES, g, distinct=False)
    init_state = {k: v[0].clone() for k, v in params.items()}  # the shared θ every device starts from

    x_train = [torch.as_tensor(d.x_train) for d in fed.devices]
    y_train = [torch.as_tensor(d.y_train) for d in fed.devices]
    x_test = [torch.as_tensor(d.x_test) for d in fed.devices]
    y_test = [torch.as_tensor(d.y_test) for d in fed.devices]

    # warm-up (not timed)
    loop_train(fed, x_train, y_train, init_state, args.seed)
    vector_train(eng, params, args.seed)

    loop_times, vec_times = [], []
    loop_acc, vec_acc = [], []
    for r in range(args.reps):  # interleaved, so background load hits both alike
        t, models = timed(lambda: loop_train(fed, x_train, y_train, init_state, args.seed + 1 + r))
        loop_times.append(t)
        loop_acc.append(float(loop_accuracy(models, x_test, y_test).mean()))
        t, trained = timed(lambda: vector_train(eng, params, args.seed + 1 + r))
        vec_times.append(t)
        vec_acc.append(float(eng.accuracy(trained, np.arange(N_DEVICES)).mean()))

    loop_s, vec_s = statistics.median(loop_times), statistics.median(vec_times)
    ratio = loop_s / vec_s
    n_train = [len(y) for y in y_train]
    steps = sum(-(-n // BATCH) for n in n_train)
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "device": "cpu",
        },
        "setup": {
            "dataset": "mnist",
            "scenario": "S0",
            "n_devices": N_DEVICES,
            "train_samples_per_device": n_train,
            "model": "mlp 784-128-10",
            "batch_size": BATCH,
            "local_epochs": EPOCHS,
            "lr": LR,
            "l2": L2,
            "sgd_steps_total": steps,
            "reps": args.reps,
            "seed": args.seed,
        },
        "loop_seconds": loop_times,
        "vectorised_seconds": vec_times,
        "loop_median_s": loop_s,
        "vectorised_median_s": vec_s,
        "ratio": ratio,
        "loop_mean_test_accuracy": loop_acc,
        "vectorised_mean_test_accuracy": vec_acc,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))

    print(f"MNIST S0, {N_DEVICES} devices x ~{n_train[0]} samples, MLP 784-128-10, batch {BATCH}, "
          f"{EPOCHS} local epoch, {steps} SGD steps in all, torch threads {torch.get_num_threads()}")
    print()
    print("| path | median s (of %d) | all runs s | mean test acc |" % args.reps)
    print("|---|---|---|---|")
    print(f"| device loop (nn.Module + optim.SGD) | {loop_s:.3f} | "
          f"{', '.join(f'{t:.3f}' for t in loop_times)} | {np.mean(loop_acc):.4f} |")
    print(f"| vectorised local_sgd | {vec_s:.3f} | "
          f"{', '.join(f'{t:.3f}' for t in vec_times)} | {np.mean(vec_acc):.4f} |")
    print()
    print(f"speed-up (loop / vectorised): {ratio:.1f}x   (target >= 5x: {'met' if ratio >= 5 else 'NOT met'})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
