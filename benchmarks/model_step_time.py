"""What the papers' own networks cost per SGD step on this CPU (RESULTS.md §5).

Times one forward + backward + SGD update of a batch of MNIST-shaped images for the
thesis MLP (every RESULTS figure), StoCFL's 2048-unit MLP, the library's default CNN
and FLACC's CNN, on ``--threads`` torch threads, and extrapolates the compute of one
FLACC round of ``seed_methods_mnist.py``'s ``flacc_rotated`` (20 clients × E = 5
epochs × ~500 samples at B = 32) and of 100 rounds. The extrapolation counts local
training only (no evaluation, no similarity), so real runs take longer.

    .venv/bin/python benchmarks/model_step_time.py --threads 1
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch.nn import functional as F

from clusterfed.models import build_model

ARCHITECTURES = {
    "thesis MLP (784-128-10)": ("mlp", {"hidden": 128}),
    "StoCFL MLP (784-2048-10)": ("mlp", {"hidden": 2048}),
    "default CNN (3x3, 16/32, 128)": ("cnn", {}),
    "FLACC CNN (5x5, 32/64, 512)": ("cnn", {"conv_channels": (32, 64), "kernel_size": 5, "hidden": 512}),
}
# flacc_rotated: 100 clients, fraction 0.2, E = 5, samples uniform in [200, 800] of
# which 85% train, batch 32.
FLACC_STEPS_PER_ROUND = 20 * 5 * math.ceil(0.85 * 500 / 32)


def step_seconds(name: str, shape: dict, *, batch: int, reps: int) -> float:
    model = build_model(name, (1, 28, 28), 10, **shape)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.rand(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}; "
          f"one flacc_rotated round = {FLACC_STEPS_PER_ROUND} local steps\n")
    print("| network | parameters | ms per step | FLACC round s | 100 rounds min |\n|---|---|---|---|---|")
    for label, (name, shape) in ARCHITECTURES.items():
        n_params = sum(p.numel() for p in build_model(name, (1, 28, 28), 10, **shape).parameters())
        s = step_seconds(name, shape, batch=args.batch, reps=args.reps)
        round_s = s * FLACC_STEPS_PER_ROUND
        print(f"| {label} | {n_params:,} | {1000 * s:.1f} | {round_s:.0f} | {100 * round_s / 60:.0f} |", flush=True)


if __name__ == "__main__":
    main()
