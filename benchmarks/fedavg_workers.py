"""clusterfed's FedAvg round (``peer_flower.py``'s job) with chunks trained on worker
threads or one after another (issue 17 item 6).

Configurations, interleaved per repetition: 2 intra-op threads with ``workers=1`` (the
chunk-after-chunk loop before ``Engine(workers=)``), 2 threads with the default
``workers`` (= 2: one chunk per thread), and 1 thread. Reports the median round time
(round 1 dropped) per configuration, the accuracy, ``/proc/loadavg`` and whether the
final models equal the first configuration's bit for bit.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/fedavg_workers.py --clients 20 100 --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import peer_flower  # noqa: E402

CONFIGS = (("2 threads, workers=1 (before)", 2, 1), ("2 threads, workers=2", 2, None), ("1 thread", 1, None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(peer_flower.OUT / "fedavg_workers.json"))
    args = ap.parse_args()
    data = peer_flower.prepare(args.root, seed=10)
    rows = []
    for n in args.clients:
        times: dict[str, list[float]] = {name: [] for name, _, _ in CONFIGS}
        final, accuracy, loads = {}, {}, []
        for _ in range(args.reps):
            for name, threads, workers in CONFIGS:
                before = peer_flower.loadavg()
                out = peer_flower.clusterfed_run(str(data), n, args.rounds + 1, threads, workers)
                times[name].append(statistics.median(out["round_s"][1:]))
                final[name], accuracy[name] = out["params"], out["accuracy"]
                loads.append((before, peer_flower.loadavg()))
        base = final[CONFIGS[0][0]]
        for name, _, _ in CONFIGS:
            rows.append({"clients": n, "config": name, "round_s": statistics.median(times[name]), "reps": times[name],
                         "accuracy": accuracy[name],
                         "bitwise_equal_to_before": all(torch.equal(final[name][k], base[k]) for k in base),
                         "loads": loads})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "loads"}), flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
