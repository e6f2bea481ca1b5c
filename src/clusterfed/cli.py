"""``clusterfed`` command line: validate params and run pipeline stages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clusterfed import pipeline
from clusterfed.config import ParamsError, load_params
from clusterfed.tracking import commands

PARTITIONS = Path("data/partitions")
COLDSTART = Path("data/coldstart")
METRICS = Path("metrics/metrics.json")
PLOTS = Path("plots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterfed", description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check params.yaml and exit")
    sub.add_parser("partition", help="stage 1: build the federations")
    sub.add_parser("coldstart", help="stage 2: cluster and train (FAACL and baselines)")
    sub.add_parser("evaluate", help="stage 3: metrics and plots")
    commands.add_parser(sub)  # `clusterfed models …` (MLflow registry)
    args = parser.parse_args(argv)
    if args.command == "models":
        return commands.run(args, args.params)
    try:
        params = load_params(args.params)
    except ParamsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "validate":
        print(f"{args.params}: ok")
    elif args.command == "partition":
        pipeline.partition(params, PARTITIONS)
    elif args.command == "coldstart":
        pipeline.coldstart(params, PARTITIONS, COLDSTART)
    elif args.command == "evaluate":
        metrics = pipeline.evaluate(params, PARTITIONS, COLDSTART, METRICS, PLOTS)
        _print_table(metrics)
    return 0


def _print_table(metrics: dict) -> None:
    print(f"{'algorithm':<12} {'accuracy':>18} {'clusters':>9} {'ARI':>6}")
    for name, m in metrics.items():
        acc = f"{100 * m['accuracy']:.2f} ± {100 * m['accuracy_stderr']:.2f}"
        print(f"{name:<12} {acc:>18} {m['n_clusters']:>9.1f} {m['ari']:>6.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
