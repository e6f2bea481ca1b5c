"""The machine's measured fp32 matmul peak (issue 17 item 7): the yardstick of
``faacl_profile.py``'s share.

Peak = the best GFLOP/s of ``torch.mm`` on square fp32 matrices (n = 512 … 4096,
2n³ FLOPs each) with 1 and with 2 torch threads: the fastest of ``--reps`` timed calls
per size after a warm-up (on a shared machine the fastest call is the one that had the
cores; the median is recorded too), the maximum over sizes. Also reported: the batched shapes of
the engine's MNIST MLP step (``torch.bmm`` of [M, 10, 784] × [M, 784, 128], M = 10)
so the gap between the peak and small-batch SGD is visible. ``/proc/loadavg`` is
recorded before and after. Writes ``benchmarks/out/matmul_peak.json``.

    .venv/bin/python benchmarks/matmul_peak.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def gflops(fn, flops: float, reps: int) -> tuple[float, float]:
    """(best, median) GFLOP/s over ``reps`` timed calls after a warm-up."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return flops / min(times) / 1e9, flops / statistics.median(times) / 1e9


def measure(threads: int, reps: int) -> dict:
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    square = {}
    for n in (512, 1024, 2048, 4096):
        a, b = torch.rand(n, n, generator=g), torch.rand(n, n, generator=g)
        out = torch.empty(n, n)
        square[n] = gflops(lambda: torch.mm(a, b, out=out), 2 * n**3, reps)
    m = 10
    x, w = torch.rand(m, 10, 784, generator=g), torch.rand(m, 784, 128, generator=g)
    mlp = gflops(lambda: torch.bmm(x, w), 2 * m * 10 * 784 * 128, reps * 50)
    return {"mm_gflops_best_median": square, "peak_gflops": max(b for b, _ in square.values()),
            "mlp_step_bmm_gflops_best_median": mlp}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "matmul_peak.json"))
    args = ap.parse_args()
    before = loadavg()
    result = {str(t): measure(t, args.reps) for t in (1, 2)}
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "load_before": before, "load_after": loadavg(), "threads": result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
