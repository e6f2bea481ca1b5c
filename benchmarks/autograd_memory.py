"""Peak memory of one full-batch autograd step of many CNNs (Per-FedAvg's
personalisation, ``PerFedAvg.personalize``): all pairs at once against pairs in chunks
within ``AUTOGRAD_BUDGET_BYTES``. FLACC's rotated-MNIST federation and FLACC's CNN
(5x5 convolutions 32/64, FC 512), the first ``--devices`` clients, one step on each
client's whole training set, in a fresh process per setting (peak RSS). RESULTS.md §11.

    .venv/bin/python benchmarks/autograd_memory.py --devices 20
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def one(devices: int, budget: int | None) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from seed_methods_mnist import params_for

    import clusterfed.engine.local_sgd as local_sgd_module
    from clusterfed import build

    torch.set_num_threads(1)
    if budget is not None:
        local_sgd_module.AUTOGRAD_BUDGET_BYTES = budget
    params = params_for("flacc_rotated", 10, "cpu", "paper")
    engine = build.build_engine(params, build.build_federation(params, 10))
    rows = torch.arange(devices)
    full = int(engine.data.train.counts[rows].max())
    start = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    start = {k: v.expand(devices, *v.shape[1:]).clone() for k, v in start.items()}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    out = local_sgd_module.local_sgd(engine.model, start, engine.data.train, rows, epochs=1, lr=0.01, l2=0.0,
                                     batch_size=full, generator=torch.Generator().manual_seed(1))
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"devices": devices, "budget_bytes": local_sgd_module.AUTOGRAD_BUDGET_BYTES, "batch": full,
            "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024, "wall_s": wall,
            "checksum": float(sum(v.double().sum() for v in out.values()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=20)
    ap.add_argument("--one", choices=["all", "budget"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.devices, 2**62 if args.one == "all" else None)))
        return
    for mode in ("all", "budget"):
        res = subprocess.run([sys.executable, __file__, "--devices", str(args.devices), "--one", mode],
                             capture_output=True, text=True, check=True)
        print(mode, res.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
