"""Continual accuracy by device size: how each method serves small and large devices.

Under the authors' construction device sizes follow FedProx's power law (7 to 397
test samples a device at a timestep of sequential S1), so the mean device accuracy
of Tables 4.1-4.4 weighs a device of 7 test samples as much as one of 397. This
splits the devices of every timestep t = 1..T into thirds by their test size and
prints each run's mean device accuracy within each third, averaged over t, beside
the overall mean device accuracy and the accuracy over all test samples. Runs come
from ``thesis_continual_mnist.py``'s layout; test sizes from its cached
``test_counts.json`` (built on first use with the same arguments).

    .venv/bin/python benchmarks/continual_by_size.py --construction authors --epochs 20 \\
        --setting sequential --scenario S1 --seeds 10 \\
        --runs benchmarks/out/authors_continual_s33_r20:fedprox_apd benchmarks/out/authors_continual_s32_r20:fedprox_ewc
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thesis_continual_mnist as tcm  # noqa: E402  (the benchmark whose runs are read)


def thirds(accuracy: np.ndarray, counts: np.ndarray) -> tuple[float, float, float]:
    """Mean accuracy of the smallest, middle and largest third of devices by test size
    (ties at a boundary go to the smaller third)."""
    low, high = np.quantile(counts, [1 / 3, 2 / 3])
    small, large = counts <= low, counts > high
    middle = ~small & ~large
    return float(accuracy[small].mean()), float(accuracy[middle].mean()), float(accuracy[large].mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, metavar="OUT:ALGORITHM",
                   help="a thesis_continual_mnist.py --out folder and an algorithm run there")
    tcm.cell_arguments(p, construction="authors")
    args = p.parse_args()
    from clusterfed.layout import RunLayout

    print(f"{args.setting} {args.scenario}, {args.construction} construction, seeds {args.seeds}: "
          f"mean device accuracy % by test-size third, averaged over t = 1..{args.timesteps}\n")
    print("| run | seed | smallest third | middle third | largest third | all devices | all test samples |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.runs:
        out, _, algorithm = spec.rpartition(":")
        if not out:
            raise SystemExit(f"--runs expects OUT:ALGORITHM, got {spec!r}")
        run_args = tcm.run_namespace(args, out=out, algorithm=algorithm, seeds=args.seeds)
        counts = np.asarray(tcm.test_counts(run_args, args.setting, args.scenario))
        for seed in args.seeds:
            path = RunLayout(Path(out) / f"{args.setting}_{args.scenario}").continual_run(algorithm, seed).timesteps
            if not path.is_file():
                print(f"| {out}:{algorithm} | {seed} | not run | | | | |")
                continue
            rows = json.loads(path.read_text())["rows"][1:]
            acc = [np.asarray(r["device_accuracy"]) for r in rows]
            n = [counts[r["t"]] for r in rows]
            by_third = np.mean([thirds(a, c) for a, c in zip(acc, n)], axis=0) * 100
            weighted = 100 * np.mean([np.dot(a, c) / c.sum() for a, c in zip(acc, n)])
            cells = " | ".join(f"{v:.2f}" for v in by_third)
            print(f"| {out}:{algorithm} | {seed} | {cells} | {100 * np.mean(acc):.2f} | {weighted:.2f} |")


if __name__ == "__main__":
    main()
