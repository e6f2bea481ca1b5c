"""Reproduce the MNIST columns of the thesis' continual tables (Tables 4.1-4.4).

Each (setting, scenario) runs the pipeline's own ``continual`` stage function with
the thesis' MNIST settings (Table B.4: 20 devices in two halves, lr 0.01, T = 10,
100 epochs per timestep, δ = 3, ε 0.5 for S1/S2, 0.3 for A1, 0.2 for A2) into
``--out/<setting>_<scenario>/``. The stage checkpoints every timestep, so rerunning
the same command resumes where it stopped. ``--summarize`` prints the table: mean
device accuracy, or with ``--weight samples`` accuracy over all test samples (the
figure of the authors' cold-start code; each device's test size is cached as
``test_counts.json`` beside its runs).

    .venv/bin/python benchmarks/thesis_continual_mnist.py --settings sequential multitask \\
        --scenarios S1 S2 A1 A2 --algorithms cfaacl feddrift fedprox_ewc fedavg --seeds 10
    .venv/bin/python benchmarks/thesis_continual_mnist.py --summarize ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

EPSILON = {"S1": 0.5, "S2": 0.5, "A1": 0.3, "A2": 0.2}
# Thesis Tables 4.1-4.4, MNIST: (sequential, multi-task) accuracy %.
THESIS = {
    "cfaacl": {"S1": (97.00, 94.73), "S2": (97.67, 96.41), "A1": (91.97, 88.15), "A2": (90.96, 87.06)},
    "feddrift": {"S1": (96.55, 95.94), "S2": (97.83, 95.25), "A1": (89.83, 84.49), "A2": (89.26, 85.58)},
    "fedprox_ewc": {"S1": (93.51, 90.21), "S2": (90.26, 49.15), "A1": (83.29, 81.11), "A2": (81.14, 79.42)},
    "fedavg": {},
    "fedprox_apd": {"S1": (97.23, 93.47), "S2": (86.59, 80.48), "A1": (85.83, 81.69), "A2": (83.65, 81.81)},
    "fedprox_ssgd": {"S1": (96.42, 94.82), "S2": (89.20, 49.98), "A1": (86.18, 82.80), "A2": (85.61, 83.16)},
    "fedweit": {"S1": (97.81, 94.39), "S2": (87.98, 84.34), "A1": (88.62, 85.16), "A2": (87.84, 83.64)},
}


def params_for(args, setting: str, scenario: str):
    from clusterfed.config import parse_params

    # the authors' construction sizes devices by their FedProx users (README "The authors' construction")
    thesis = args.construction == "thesis"
    raw = {
        "seeds": args.seeds,
        "data": {"dataset": "mnist", "root": args.root},
        "scenario": {"name": scenario, "group_sizes": [10, 10], "construction": args.construction},
        "training": {"lr": 0.01, "l2": 0.001, "batch_size": 10, "device": args.device},
        "continual": {
            "setting": setting,
            "timesteps": args.timesteps,
            "samples_per_device": args.samples_per_device if thesis else None,
            "test_samples_per_device": args.test_samples_per_device if thesis else None,
            "algorithms": args.algorithms,
            "rounds": args.epochs,
            "cfaacl": {"epsilon": EPSILON[scenario], "init_epochs": args.init_epochs},
            "feddrift": {"delta": 3.0, "init_epochs": args.init_epochs},
        },
    }
    for text in args.set:  # KEY=VALUE, a dotted params.yaml key, the value read as YAML
        key, sep, value = text.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {text!r}")
        *parents, last = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return parse_params(raw, source="benchmark")


def run(args) -> None:
    from clusterfed import stages
    from clusterfed.layout import RunLayout

    for setting in args.settings:
        for scenario in args.scenarios:
            out = Path(args.out) / f"{setting}_{scenario}"
            t0 = time.perf_counter()
            stages.continual(params_for(args, setting, scenario), RunLayout(out), progress=True,
                             keep_other_runs=True)  # runs of earlier invocations stay beside this one's
            print(f"{setting} {scenario}: {time.perf_counter() - t0:.0f} s", flush=True)


def summarize(args) -> None:
    """One row per (setting, scenario): each algorithm's mean accuracy over t = 1..10
    (± stderr over seeds when several), the thesis figure beside it, the clusters at
    t = 10 and the concept-reuse rate; wall seconds per timestep."""
    from clusterfed.layout import RunLayout

    T = args.timesteps
    figure = "accuracy over all test samples" if args.weight == "samples" else "mean device accuracy"
    print(f"MNIST continual ({args.construction} construction), T = {T}, {args.epochs} epochs per timestep, "
          f"seeds {args.seeds}: {figure} % averaged over t = 1..{T} [clusters at t = {T}, concept reuse]; "
          "thesis figure (T = 10) beside; wall s per timestep.\n")
    header = "| setting | scenario | " + " | ".join(f"{a} | thesis" for a in args.algorithms) + " | s / timestep |"
    print(header)
    print("|---" * (3 + 2 * len(args.algorithms)) + "|")
    for st in args.settings:
        for sc in args.scenarios:
            cells, walls = [], []
            for a in args.algorithms:
                runs, clusters, reuse = [], [], []
                for seed in args.seeds:
                    path = RunLayout(Path(args.out) / f"{st}_{sc}").continual_run(a, seed).timesteps
                    if path.is_file():
                        result = json.loads(path.read_text())
                        if args.weight == "samples":
                            n = test_counts(args, st, sc)
                            runs.append(100 * float(np.mean([
                                np.dot(r["device_accuracy"], n[r["t"]]) / np.sum(n[r["t"]]) for r in result["rows"][1:]
                            ])))
                        else:
                            runs.append(result["summary"]["accuracy"] * 100)
                        clusters.append(result["rows"][-1]["n_clusters"])
                        reuse.append(result["summary"]["concept_reuse_rate"])
                        walls.append(f"{a} {_wall_per_timestep(RunLayout(Path(args.out) / f'{st}_{sc}'), a, seed):.0f}")
                if runs:
                    se = f" ± {np.std(runs, ddof=1) / np.sqrt(len(runs)):.2f}" if len(runs) > 1 else ""
                    extra = f"{np.mean(clusters):g}" + ("" if reuse[0] is None else f", {np.mean(reuse):.2f}")
                    cells.append(f"{np.mean(runs):.2f}{se} [{extra}]")
                else:
                    cells.append("not run")
                th = THESIS[a].get(sc)
                cells.append(f"{th[0 if st == 'sequential' else 1]:.2f}" if th else "—")
            print(f"| {st} | {sc} | " + " | ".join(cells) + f" | {'; '.join(walls) or '—'} |")


def test_counts(args, setting: str, scenario: str) -> list[list[int]]:
    """Test samples of each device at t = 0..T (the weights of ``--weight samples``),
    built once from the run's data and cached beside its runs as ``test_counts.json``.
    Under the authors' construction the data depend only on t, so every seed and
    method shares them; under the thesis construction they depend on the seed, and
    the first of ``--seeds`` is used."""
    from clusterfed.build import build_schedule, timestep_engines

    path = Path(args.out) / f"{setting}_{scenario}" / "test_counts.json"
    if path.is_file():
        return json.loads(path.read_text())
    if args.construction == "thesis" and len(args.seeds) > 1:
        raise SystemExit("--weight samples: the thesis construction draws each seed's data; give one seed")
    params = params_for(args, setting, scenario)
    engine_at = timestep_engines(params, build_schedule(params), args.seeds[0])  # the runs' schedule.json is not committed
    counts = [engine_at(t).counts("test").tolist() for t in range(args.timesteps + 1)]
    path.write_text(json.dumps(counts))
    return counts


def _wall_per_timestep(layout, algorithm: str, seed: int) -> float:
    """Mean wall seconds of timesteps 1..T from the run's ``wall_times`` log (the last
    record of each timestep, if resumed)."""
    walls = {}
    path = layout.wall_times
    for line in path.read_text().splitlines() if path.is_file() else []:
        w = json.loads(line)
        if w["algorithm"] == algorithm and w["seed"] == seed and w["t"] > 0:
            walls[w["t"]] = w["wall_s"]
    return float(np.mean(list(walls.values()))) if walls else float("nan")


def cell_arguments(p: argparse.ArgumentParser, *, construction: str) -> None:
    """The arguments of a script that reads one (setting, scenario) cell of this
    benchmark's runs (``continual_by_size.py``, ``decomposed_forgetting.py``)."""
    p.add_argument("--setting", required=True, choices=["sequential", "multitask"])
    p.add_argument("--scenario", required=True, choices=["S1", "S2", "A1", "A2"])
    p.add_argument("--seeds", nargs="+", type=int, default=[10])
    p.add_argument("--construction", choices=["thesis", "authors"], default=construction)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--timesteps", type=int, default=10)
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))


def run_namespace(cell: argparse.Namespace, *, out: str, algorithm: str, seeds: list[int],
                  settings: list[str] = ()) -> argparse.Namespace:
    """This benchmark's arguments for the runs of ``algorithm`` under ``out`` in the cell
    that ``cell`` (``cell_arguments``) names: its defaults, with the cell's values."""
    args = parser().parse_args([])
    args.__dict__.update(
        out=out, construction=cell.construction, seeds=seeds, timesteps=cell.timesteps, root=cell.root,
        epochs=cell.epochs, algorithms=[algorithm], set=list(settings), device="cpu",
    )
    return args


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", nargs="+", default=["sequential", "multitask"])
    p.add_argument("--scenarios", nargs="+", default=["S1", "S2", "A1", "A2"])
    p.add_argument("--algorithms", nargs="+", default=["cfaacl", "feddrift", "fedprox_ewc", "fedavg"])
    p.add_argument("--seeds", nargs="+", type=int, default=[10])
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--timesteps", type=int, default=10)
    p.add_argument("--init-epochs", type=int, default=5, help="C-FAACL's and FedDrift's init_epochs")
    p.add_argument("--construction", choices=["thesis", "authors"], default="thesis")
    p.add_argument("--samples-per-device", type=int, default=1000)
    p.add_argument("--test-samples-per-device", type=int, default=200)
    p.add_argument("--root", default=str(Path(__file__).resolve().parents[2] / "shared" / "datasets"))
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="benchmarks/out/continual")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 when runs share cores)")
    p.add_argument("--summarize", action="store_true")
    p.add_argument("--weight", choices=["devices", "samples"], default="devices",
                   help="--summarize: mean device accuracy (the default) or accuracy over all test "
                        "samples (the authors' cold-start figure)")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="params.yaml keys, e.g. continual.fedweit.lambda1=0.01 (use another --out)")
    return p


def main() -> None:
    args = parser().parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    summarize(args) if args.summarize else run(args)


if __name__ == "__main__":
    main()
