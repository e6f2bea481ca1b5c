"""Accuracy with one poisoned device against the clean run, for every method.

The federation of ``params.yaml`` (digits, S2, 5 + 5 devices, its hyperparameters) is built once
per seed; device ``--device`` (default 0) is then poisoned in one of three ways, and
every cold-start method (``--methods all``: every registered one) and, with
``--continual all``, every continual method (the device poisoned at every timestep)
runs on the clean and on each poisoned engine back to back:

- ``nan``: the device's training images are NaN, so everything it uploads (models,
  FedProx-EWC's Fisher estimate, StoCFL's gradients, PACFL's data basis) is NaN;
- ``1e30``: every upload it makes is 1e30 everywhere (finite);
- ``flip100``: it uploads θ_start − 100·Δ, its honest update sign-flipped and ×100
  (−100·u for uploads that start from no model: Fisher, gradients, bases);

and ``absent`` is the reference a perfect filter reaches: the same federation without
the device (``Federation.subset``), as if it had never taken part. ``late``
(cold start only, asked for with ``--attacks``) is a diagnostic, not an attack of the
target: the device's first upload batch is honest and every later one 1e30, so the
first round — the one most clustering methods seed or cluster on — holds the same
uploads as the clean run.

Reported: mean test accuracy of the *honest* devices (all but the poisoned one; a
method cannot protect the poisoned device's own model from its own data; continual:
the mean over t = 1..T), and the uploads the engine rejected. The target:
honest-device accuracy within 1 point of the clean run. ``centralized`` (the oracle
trains on the pooled data of each ground-truth group, no device uploads) is not attacked (``all``
leaves it out).

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/poisoned_device.py \\
        --seeds 10 --methods all --continual all --out benchmarks/out/poisoned_device.jsonl
    .venv/bin/python benchmarks/poisoned_device.py --summarize --out benchmarks/out/poisoned_device.jsonl

With several seeds in the file, ``--summarize`` also prints, per method, the mean over
seeds of poisoned − clean and absent − clean with their per-seed range.

``--set key=value`` overrides params.yaml (dotted keys, YAML values), e.g. MNIST:
``--set data.dataset=mnist data.root=../shared/datasets coldstart.rounds=30``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import yaml

from clusterfed import build, registry
from clusterfed.config import parse_params
from clusterfed.continual.driver import run_continual as continual_driver
from clusterfed.engine import Engine

ATTACKS = ("clean", "absent", "nan", "1e30", "flip100")
DIAGNOSTICS = ("late",)  # 1e30 from the device's second upload batch on
METHODS = ("faacl", "fedclust", "stocfl", "flacc", "fedavg", "ifca", "local")


class PoisonedEngine(Engine):
    """An engine whose device ``poisoned`` is malicious. ``nan``: its training data is
    NaN. ``1e30`` / ``flip100``: every upload it makes (models, Fisher estimates,
    gradients, data bases: whatever reaches ``Engine.screen``) is replaced, just before
    the screening, by 1e30 everywhere / θ_start − 100·Δ (−100·u without a start)."""

    def __init__(self, *args, poisoned: int, attack: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.poisoned, self.attack = poisoned, attack
        self.honest_batches = 1 if attack == "late" else 0  # ``late``: its first upload batch is honest
        if attack == "nan":
            self.data.train.x[poisoned] = float("nan")

    def screen(self, uploads, device_of_pair, start=None, *, start_rows=None, norms=None):
        if self.honest_batches and self.poisoned in np.asarray(device_of_pair):
            self.honest_batches -= 1
        elif self.attack in ("1e30", "flip100", "late"):
            rows = torch.as_tensor(np.asarray(device_of_pair) == self.poisoned)
            if start is not None and start_rows is not None:  # each pair's own start model
                start, start_rows = {k: v.index_select(0, start_rows) for k, v in start.items()}, None
            norms = None  # the honest training's norms are not those of what is uploaded now
            out = {}
            for k, v in uploads.items():
                if self.attack in ("1e30", "late"):
                    bad = torch.full_like(v, 1e30)
                else:
                    bad = -100.0 * v if start is None else start[k] - 100.0 * (v - start[k])
                out[k] = torch.where(rows.to(v.device).view(-1, *([1] * (v.dim() - 1))), bad, v)
            uploads = out
        return super().screen(uploads, device_of_pair, start, start_rows=start_rows, norms=norms)


def _poisoned_engine(params, fed, device: int, attack: str) -> Engine:
    honest = HONEST_BUILD(params, fed)
    return PoisonedEngine(
        fed, model=params.model.name, hidden=params.model.hidden, conv_channels=params.model.conv_channels,
        kernel_size=params.model.kernel_size, training=honest.training, device=params.training.device,
        screening=honest.screening, poisoned=device, attack=attack,
    )


HONEST_BUILD = build.build_engine


def _raw(seed: int, overrides: dict, *, continual: bool) -> dict:
    raw = yaml.safe_load(Path("params.yaml").read_text())  # the embedded defaults: digits, S2
    raw["seeds"], raw["continual"]["enabled"], raw["training"]["device"] = [seed], continual, "cpu"
    raw["unsupervised"] = {"enabled": False}
    for key, value in overrides.items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def _append(out: Path, row: dict) -> None:
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps({k: row[k] for k in ("method", "attack", "honest_accuracy", "rejected", "error")}), flush=True)


def run(
    seed: int, methods: list[str], epochs: int | None, device: int, out: Path, overrides: dict,
    attacks: tuple[str, ...] = ATTACKS,
) -> None:
    raw = _raw(seed, overrides, continual=False)
    if epochs:
        raw["coldstart"]["rounds"] = epochs
    params = parse_params(raw)
    fed = build.build_federation(params, seed)
    done = _done(out)
    for method in methods:
        for attack in attacks:
            if (seed, method, attack, params.coldstart.rounds) in done:
                continue
            if attack == "clean":
                engine = build.build_engine(params, fed)
            elif attack == "absent":
                engine = build.build_engine(params, fed.subset(np.delete(np.arange(fed.n_devices), device)))
            else:
                engine = _poisoned_engine(params, fed, device, attack)
            started = time.perf_counter()
            error = None
            try:
                result = build.build_algorithm(method, params).fit(engine, seed=seed, ground_truth=engine_groups(fed, attack, device))
                accuracy, rejected = result.device_accuracy, result.rejected_updates
            except Exception as exc:  # a run that refuses to go on is a result too
                error, accuracy, rejected = f"{type(exc).__name__}: {exc}", np.full(engine.n_devices, np.nan), None
            honest = accuracy if attack == "absent" else np.delete(accuracy, device)
            _append(out, {
                "seed": seed, "method": method, "attack": attack, "epochs": params.coldstart.rounds,
                "poisoned_device": device, "honest_accuracy": float(np.mean(honest)),
                "accuracy": float(np.mean(accuracy)), "rejected": rejected,
                "error": error, "wall_s": round(time.perf_counter() - started, 1),
            })


def engine_groups(fed, attack: str, device: int) -> np.ndarray:
    """Ground truth for the oracle (``centralized``), of the devices the engine holds."""
    return np.delete(fed.groups, device) if attack == "absent" else fed.groups


CONTINUAL_METHODS = ("fedavg", "fedprox_ewc", "feddrift", "cfaacl")


@contextmanager
def engines_built_by(make):
    """``build.timestep_engines`` builds every timestep's engine with ``make(params, fed)``."""
    build.build_engine = make
    try:
        yield
    finally:
        build.build_engine = HONEST_BUILD


def run_continual(
    seed: int, methods: list[str], device: int, out: Path, overrides: dict, attacks: tuple[str, ...] = ATTACKS
) -> None:
    """The continual methods over params.yaml's timesteps (thesis ch. 4), the device
    poisoned at every timestep; honest accuracy: the mean over t = 1..T."""
    params = parse_params(_raw(seed, overrides, continual=True))
    schedule = build.build_schedule(params)
    others = np.delete(np.arange(schedule.shape[0]), device)
    done = _done(out)
    for method in methods:
        for attack in (a for a in attacks if a not in DIAGNOSTICS):
            name = f"continual:{method}"
            if (seed, name, attack, params.continual.timesteps) in done:
                continue
            if attack == "clean":
                make, sched = HONEST_BUILD, schedule
            elif attack == "absent":
                make, sched = (lambda p, fed: HONEST_BUILD(p, fed.subset(others))), schedule
            else:
                make, sched = (lambda p, fed, a=attack: _poisoned_engine(p, fed, device, a)), schedule
            started, error = time.perf_counter(), None
            with tempfile.TemporaryDirectory() as tmp, engines_built_by(make):
                try:
                    rows, _ = continual_driver(
                        build.build_continual_algorithm(method, params), build.timestep_engines(params, sched, seed),
                        sched if attack != "absent" else schedule[others], seed=seed, checkpoint_dir=Path(tmp),
                        fingerprint="poisoned",
                    )
                    acc = np.array([r["device_accuracy"] for r in rows[1:]])  # [T, devices]
                    honest = acc if attack == "absent" else np.delete(acc, device, axis=1)
                    rejected = int(sum(r["rejected_updates"] for r in rows))
                except Exception as exc:  # a run that refuses to go on is a result too
                    error, honest, rejected = f"{type(exc).__name__}: {exc}", np.full(1, np.nan), None
            _append(out, {
                "seed": seed, "method": name, "attack": attack, "epochs": params.continual.timesteps,
                "poisoned_device": device, "honest_accuracy": float(np.mean(honest)), "rejected": rejected,
                "error": error, "wall_s": round(time.perf_counter() - started, 1),
            })


def _done(out: Path) -> set:
    if not out.is_file():
        return set()
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return {(r["seed"], r["method"], r["attack"], r["epochs"]) for r in rows}


def summarize(out: Path) -> None:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    by = {}
    for r in rows:
        by.setdefault((r["method"], r["attack"]), []).append(r)
    order = list(METHODS) + [m for m in dict.fromkeys(r["method"] for r in rows) if m not in METHODS]
    methods = [m for m in order if (m, "clean") in by]

    def mean(m: str, a: str) -> float | None:
        rs = by.get((m, a), [])
        return None if not rs or any(r["error"] for r in rs) else float(np.mean([r["honest_accuracy"] for r in rs]))

    attacks = ATTACKS[2:] + tuple(a for a in DIAGNOSTICS if any(key[1] == a for key in by))
    print("| method | clean | absent | " + " | ".join(f"{a} (Δ clean, Δ absent, rejected)" for a in attacks) + " |")
    print("| --- " * (len(attacks) + 3) + "|")
    for m in methods:
        clean, absent = mean(m, "clean"), mean(m, "absent")
        cells = [f"{100 * clean:.2f}", "-" if absent is None else f"{100 * absent:.2f}"]
        for a in attacks:
            rs, acc = by.get((m, a), []), mean(m, a)
            if not rs:
                cells.append("-")
            elif acc is None:
                cells.append("failed: " + next(r["error"] for r in rs if r["error"])[:60])
            else:
                rej = sum(r["rejected"] or 0 for r in rs)
                vs_absent = "" if absent is None else f", {100 * (acc - absent):+.2f}"
                cells.append(f"{100 * acc:.2f} ({100 * (acc - clean):+.2f}{vs_absent}, {rej})")
        print(f"| {m} | " + " | ".join(cells) + " |")
    seeds = sorted({r["seed"] for r in rows})
    print(f"\nhonest-device mean test accuracy %, seeds {seeds}; Δ against the clean run and the run without the device")
    if len(seeds) > 1:
        summarize_seeds(rows, methods)


def summarize_seeds(rows: list[dict], methods: list[str]) -> None:
    """Per method, over the seeds that ran every attack: the clean accuracy (mean ± SD), and
    the mean ± SD (per-seed min … max) of absent − clean and of poisoned − clean for each
    attack, merged into one cell when the three attacks give the same accuracy on
    every seed; the target column: the mean of the attack farthest from clean within 1
    point (met) or not, and that mean's standard error SD/√seeds; then on how many seeds
    that attack alone is within 1 point."""
    acc = {(r["method"], r["attack"], r["seed"]): r["honest_accuracy"] for r in rows if not r["error"]}
    failed = sorted({(r["method"], r["attack"]) for r in rows if r["error"]})
    print("\n| method | seeds | clean | absent − clean | poisoned − clean | late − clean | target (mean) | seeds within 1 pt |")
    print("| --- " * 8 + "|")

    def cell(d: np.ndarray) -> str:  # mean ± sample SD (per-seed min … max)
        sd = f" ± {100 * d.std(ddof=1):.2f}" if len(d) > 1 else ""
        return f"{100 * d.mean():+.2f}{sd} ({100 * d.min():+.2f} … {100 * d.max():+.2f})"

    for m in methods:
        seeds = sorted(s for (mm, a, s) in acc if mm == m and a == "clean"
                       and all((m, b, s) in acc for b in ATTACKS))
        if not seeds:
            continue
        clean = np.array([acc[m, "clean", s] for s in seeds])
        delta = {a: np.array([acc[m, a, s] for s in seeds]) - clean for a in ATTACKS[1:]}
        same = all(np.array_equal(delta[a], delta["nan"]) for a in ATTACKS[3:])
        poisoned = cell(delta["nan"]) if same else " / ".join(f"{a} {cell(delta[a])}" for a in ATTACKS[2:])
        late_seeds = [s for s in seeds if (m, "late", s) in acc]
        late = "-" if not late_seeds else cell(
            np.array([acc[m, "late", s] - acc[m, "clean", s] for s in late_seeds])
        ) + ("" if late_seeds == seeds else f" (seeds {late_seeds})")
        worst = max(ATTACKS[2:], key=lambda a: abs(delta[a].mean()))
        se = f" (SE {100 * delta[worst].std(ddof=1) / np.sqrt(len(seeds)):.2f})" if len(seeds) > 1 else ""
        spread = f" ± {100 * clean.std(ddof=1):.2f}" if len(seeds) > 1 else ""
        print(f"| {m} | {len(seeds)} | {100 * clean.mean():.2f}{spread} | {cell(delta['absent'])} | {poisoned} | {late} | "
              f"{'met' if abs(delta[worst].mean()) <= 0.01 else 'missed'}{se} | "
              f"{int((np.abs(delta[worst]) <= 0.01).sum())} of {len(seeds)} |")
    if failed:
        print("failed runs: " + ", ".join(f"{m} {a}" for m, a in failed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help="cold-start methods ('all': every registered one)")
    parser.add_argument("--continual", nargs="*", default=[], help="continual methods too ('all': every built-in one)")
    parser.add_argument("--epochs", type=int, default=None, help="coldstart.rounds (default: params.yaml's)")
    parser.add_argument("--device", type=int, default=0, help="the poisoned device")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/poisoned_device.jsonl"))
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="params.yaml overrides")
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS + DIAGNOSTICS,
                        help="runs to make (default: clean, absent and the three attacks)")
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.out)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        overrides = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
        methods = args.methods
        if methods == ["all"]:  # the oracle trains on pooled groups: no device uploads to poison
            methods = [m for m in registry.declarations("coldstart", builtin_only=True) if m != "centralized"]
        run(seed, methods, args.epochs, args.device, args.out, overrides, tuple(args.attacks))
        continual = list(CONTINUAL_METHODS) if args.continual == ["all"] else args.continual
        if continual:
            run_continual(seed, continual, args.device, args.out, overrides, tuple(args.attacks))


if __name__ == "__main__":
    main()
