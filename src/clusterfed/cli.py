"""``clusterfed`` command line: validate params and run pipeline stages."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clusterfed import pipeline
from clusterfed.config import ParamsError, load_params
from clusterfed.tracking import commands

PARTITIONS = Path("data/partitions")
COLDSTART = Path("data/coldstart")
CONTINUAL = Path("data/continual")
METRICS = Path("metrics/metrics.json")
PLOTS = Path("plots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterfed", description=__doc__)
    parser.add_argument("--params", default="params.yaml", help="parameters file (default: params.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("validate", help="check params.yaml and exit")
    sub.add_parser("partition", help="stage 1: build the federations")
    sub.add_parser("coldstart", help="stage 2: cluster and train (FAACL and baselines)")
    sub.add_parser("continual", help="stage 3: continual timesteps (C-FAACL and baselines), resumable")
    sub.add_parser("evaluate", help="stage 4: metrics and plots")
    sub.add_parser("summary", help="print the tables of metrics/metrics.json")
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
    elif args.command == "continual":
        if params.continual.enabled:
            pipeline.continual(params, CONTINUAL)
        else:
            CONTINUAL.mkdir(parents=True, exist_ok=True)
            print("continual.enabled is false: nothing to run")
    elif args.command == "summary":
        if not METRICS.is_file():
            print(f"error: {METRICS} not found: run the pipeline first (make run)", file=sys.stderr)
            return 2
        _print_report(json.loads(METRICS.read_text()), params)
    elif args.command == "evaluate":
        report = pipeline.evaluate(params, PARTITIONS, COLDSTART, METRICS, PLOTS, CONTINUAL)
        _print_report(report, params)
    return 0


def _print_report(report: dict, params) -> None:
    _print_table("cold start (final round)", report["coldstart"])
    if "continual" in report:
        _print_table(f"continual (mean over t = 1..{params.continual.timesteps})", report["continual"])


def _print_table(title: str, metrics: dict) -> None:
    print(f"\n{title}")
    print(f"{'algorithm':<12} {'accuracy':>18} {'clusters':>9} {'ARI':>6} {'reuse':>6}")
    for name, m in metrics.items():
        acc = f"{100 * m['accuracy']:.2f} ± {100 * m['accuracy_stderr']:.2f}"
        clusters = m.get("n_clusters", m.get("n_clusters_per_timestep", [0])[-1])
        ari = f"{m['ari']:.2f}" if "ari" in m else "-"
        reuse = m.get("concept_reuse_rate")
        reuse = "-" if reuse is None else f"{reuse:.2f}"
        print(f"{name:<12} {acc:>18} {clusters:>9.1f} {ari:>6} {reuse:>6}")


if __name__ == "__main__":
    raise SystemExit(main())
