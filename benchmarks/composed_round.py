"""Seconds per training round of the continual baselines vs FedAvg (issue 15, RESULTS §12).

The §12 setting at one timestep (MNIST sequential S1, t = 1: 20 devices with 1000
new samples each, thesis MLP 784-128-10, batch 10, lr 0.01, L2 0.001, one local
epoch): one ``train`` of each method with ``--rounds`` rounds, after its
``initial_state`` and ``arrive`` at t = 1 (so FedWeIT's knowledge base is the
pruned A of task 0, not zeros). Interleaved repetitions, medians; ``uptime`` load
recorded before and after. ``--profile`` prints torch's operator profile of one
round per method instead. Writes ``benchmarks/out/composed_round.json``.

``--construction authors`` times t = 1 of a cell of ``thesis_continual_mnist.py``'s
authors' construction instead (``--scenario``, default A2: 50 devices of power-law
sizes, sparse-input kernel), where devices finish their local epoch at very
different steps.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/composed_round.py --threads 1
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/composed_round.py --threads 1 --construction authors

``--chunk-floats N`` sets the composed loop's chunk size (``CHUNK_FLOATS``) to compare sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from clusterfed.algorithms.base import generators
from clusterfed.algorithms.protocol import Context
from clusterfed.build import build_continual_algorithm, build_schedule, timestep_engines
from clusterfed.config import parse_params

METHODS = ("fedavg", "fedweit", "fedprox_apd", "fedprox_ssgd")


def setup(args):
    if args.construction == "authors":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import thesis_continual_mnist as tcm

        cell = argparse.Namespace(construction="authors", timesteps=10, root=args.root, epochs=args.rounds)
        run = tcm.run_namespace(cell, out="", algorithm=args.methods[0], seeds=[10],
                                settings=["training.sparse_inputs=true"])
        run.algorithms = list(args.methods)
        params = tcm.params_for(run, "sequential", args.scenario)
        return params, timestep_engines(params, build_schedule(params), seed=10)(1)
    params = parse_params(
        {
            "seeds": [10],
            "data": {"dataset": "mnist", "root": args.root},
            "scenario": {"name": "S1", "group_sizes": [10, 10]},
            "training": {"lr": 0.01, "l2": 0.001, "batch_size": 10, "device": "cpu"},
            "continual": {"setting": "sequential", "timesteps": 10, "samples_per_device": 1000,
                          "test_samples_per_device": 200, "algorithms": list(args.methods), "rounds": args.rounds},
        },
        source="benchmark",
    )
    engine = timestep_engines(params, build_schedule(params), seed=10)(1)
    return params, engine


def one_train(params, engine, name: str) -> float:
    """Wall seconds of one ``train`` (``rounds`` rounds) of ``name`` at t = 1."""
    method = build_continual_algorithm(name, params)
    ctx = Context(*generators(0))
    state = method.arrive(method.initial_state(engine, ctx), engine, 1, ctx)
    start = time.perf_counter()
    method.train(state, engine, 1, ctx)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--construction", choices=["thesis", "authors"], default="thesis")
    p.add_argument("--scenario", choices=["S1", "S2", "A2"], default="A2",
                   help="--construction authors: the sequential cell timed (A1 has no sparse-input kernel)")
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    p.add_argument("--chunk-floats", type=int, default=None,
                   help="variables a chunk of the composed loop holds (engine default: CHUNK_FLOATS), to compare sizes")
    p.add_argument("--out", default="benchmarks/out/composed_round.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.chunk_floats is not None:
        import clusterfed.engine.composed as composed

        composed.CHUNK_FLOATS = args.chunk_floats
    params, engine = setup(args)
    if args.profile:
        for name in args.methods:
            with torch.profiler.profile() as prof:
                one_train(params, engine, name)
            print(f"== {name}\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return
    load_before = os.getloadavg()
    times = {name: [] for name in args.methods}
    for name in args.methods:  # warm-up
        one_train(params, engine, name)
    for _ in range(args.repeats):
        for name in args.methods:
            times[name].append(one_train(params, engine, name) / args.rounds)
    load_after = os.getloadavg()
    base = statistics.median(times["fedavg"]) if "fedavg" in times else None
    result = {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
        "construction": args.construction, "scenario": args.scenario if args.construction == "authors" else "S1",
        "chunk_floats": args.chunk_floats,
        "load_before": load_before, "load_after": load_after,
        "s_per_round": {k: statistics.median(v) for k, v in times.items()},
        "all": times,
    }
    for name, v in times.items():
        ratio = f"  {statistics.median(v) / base:.2f}x fedavg" if base else ""
        print(f"{name:14s} {statistics.median(v):.3f} s/round{ratio}")
    print(f"load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
