"""Accuracy with one poisoned device against the clean run, for every cold-start method.

The federation of ``params.yaml`` (digits, S2, 5 + 5 devices, its hyperparameters) is built once
per seed; device ``--device`` (default 0) is then poisoned in one of three ways, and
every cold-start method runs on the clean and on each poisoned engine back to back:

- ``nan``: the device's training images are NaN, so every update it uploads (and its
  FedProx-EWC Fisher estimate) is NaN;
- ``1e30``: every parameter of every model it uploads is 1e30 (finite);
- ``flip100``: it uploads θ_start − 100·Δ, its honest update sign-flipped and ×100.

and ``absent`` is the reference a perfect filter reaches: the same federation without
the device (``Federation.subset``), as if it had never taken part.

Reported: mean test accuracy of the *honest* devices (all but the poisoned one; a
method cannot protect the poisoned device's own model from its own data), the same
over all devices, and the updates the engine rejected. The target: honest-device
accuracy within 1 point of the clean run. ``centralized`` (the oracle trains on the
pooled data of each ground-truth group, no device uploads) is not attacked.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/poisoned_device.py \\
        --seeds 10 --out benchmarks/out/poisoned_device.jsonl
    .venv/bin/python benchmarks/poisoned_device.py --summarize --out benchmarks/out/poisoned_device.jsonl

``--set key=value`` overrides params.yaml (dotted keys, YAML values), e.g. MNIST:
``--set data.dataset=mnist data.root=../shared/datasets coldstart.rounds=30``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from clusterfed import build
from clusterfed.config import parse_params
import clusterfed.engine.engine as engine_module
from clusterfed.engine import Engine

ATTACKS = ("clean", "absent", "nan", "1e30", "flip100")
METHODS = ("faacl", "fedclust", "stocfl", "flacc", "fedavg", "ifca", "local")


class PoisonedEngine(Engine):
    """An engine whose device ``poisoned`` uploads ``attack``'s models: the poison is
    applied to local SGD's output, so the engine's screening sees it as an upload."""

    def __init__(self, *args, poisoned: int, attack: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.poisoned, self.attack = poisoned, attack
        if attack == "nan":
            self.data.train.x[poisoned] = float("nan")

    def local_models(self, *args, **kwargs):
        if self.attack not in ("1e30", "flip100"):
            return super().local_models(*args, **kwargs)
        honest = engine_module.local_sgd

        def poisoned_sgd(model, start, data, device_idx, **kw):
            trained = honest(model, start, data, device_idx, **kw)
            rows = device_idx == self.poisoned
            out = {}
            for k, v in trained.items():
                bad = torch.full_like(v, 1e30) if self.attack == "1e30" else start[k] - 100.0 * (v - start[k])
                out[k] = torch.where(rows.view(-1, *([1] * (v.dim() - 1))), bad, v)
            return out

        engine_module.local_sgd = poisoned_sgd
        try:
            return super().local_models(*args, **kwargs)
        finally:
            engine_module.local_sgd = honest


def run(seed: int, methods: list[str], epochs: int | None, device: int, out: Path, overrides: dict) -> None:
    raw = yaml.safe_load(Path("params.yaml").read_text())  # the embedded defaults: digits, S2
    raw["seeds"], raw["continual"]["enabled"], raw["training"]["device"] = [seed], False, "cpu"
    raw["unsupervised"] = {"enabled": False}
    if epochs:
        raw["coldstart"]["rounds"] = epochs
    for key, value in overrides.items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    params = parse_params(raw)
    fed = build.build_federation(params, seed)
    done = _done(out)
    for method in methods:
        for attack in ATTACKS:
            if (seed, method, attack, params.coldstart.rounds) in done:
                continue
            engine = build.build_engine(params, fed)
            if attack == "absent":
                engine = build.build_engine(params, fed.subset(np.delete(np.arange(fed.n_devices), device)))
            elif attack != "clean":
                t = params.training
                engine = PoisonedEngine(
                    fed, model=params.model.name, hidden=params.model.hidden, training=engine.training,
                    device=t.device, poisoned=device, attack=attack,
                )
            started = time.perf_counter()
            error = None
            try:
                result = build.build_algorithm(method, params).fit(engine, seed=seed)
                accuracy = result.device_accuracy
            except Exception as exc:  # a run that refuses to go on is a result too
                error, accuracy = f"{type(exc).__name__}: {exc}", np.full(engine.n_devices, np.nan)
            honest = accuracy if attack == "absent" else np.delete(accuracy, device)
            row = {
                "seed": seed, "method": method, "attack": attack, "epochs": params.coldstart.rounds,
                "poisoned_device": device, "honest_accuracy": float(np.mean(honest)),
                "accuracy": float(np.mean(accuracy)), "rejected": _rejected(engine, result if error is None else None),
                "error": error, "wall_s": round(time.perf_counter() - started, 1),
            }
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row[k] for k in ("method", "attack", "honest_accuracy", "rejected", "error")}), flush=True)


def _rejected(engine: Engine, result) -> int | None:
    if result is not None and getattr(result, "rejected_updates", None) is not None:
        value = result.rejected_updates
        return int(value if not isinstance(value, dict) else value.get("total", 0))
    return None


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

    attacks = ATTACKS[2:]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[10])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--epochs", type=int, default=None, help="coldstart.rounds (default: params.yaml's)")
    parser.add_argument("--device", type=int, default=0, help="the poisoned device")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/poisoned_device.jsonl"))
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="params.yaml overrides")
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.out)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        overrides = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
        run(seed, args.methods, args.epochs, args.device, args.out, overrides)


if __name__ == "__main__":
    main()
