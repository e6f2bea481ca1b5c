"""What λ2 costs APD's and FedWeIT's past tasks: drift of the shared base and forgetting.

By default both methods freeze a finished task's mask m_i and task-adaptive A_i (the
authors' code keeps them, with the task's biases, per task), so task i's kernel changes
later only through the shared base: Δθ_i = σ(m_i) ⊙ ΔB (``clusterfed/continual/decomposed.py``).
Under ``past_tasks: retroactive`` A_i trains too (Δθ_i = σ(m_i) ⊙ ΔB + ΔA_i) and the
final checkpoint's ``past`` holds it.
The retroactive term λ2/2 Σ_{i<t} ‖Δθ_i‖² holds that drift down. The thesis' tables
score only the current timestep, so they cannot see what a smaller λ2 costs; this
measures it from the per-timestep checkpoints a ``thesis_continual_mnist.py`` run
leaves:

- **drift** during task t: sqrt(Σ_{i<t} ‖σ(m_i) ⊙ (B − B*)‖²) / sqrt(Σ_{i<t} ‖σ(m_i) ⊙ B*‖²),
  B* the base when task t began, per device, averaged over devices and t = 1..T;
- **forgetting** of task i < T: each device's accuracy on its timestep-i test data with
  task i's model when task i ended, minus with task i's parts (m_i, A_i, α_i, K_i,
  biases, from checkpoint i) on the final base B_T; averaged over devices and i.

Our implementation serves only the current task and keeps of past tasks only Σσ(m_i)²
and B*, so the forgetting is that of the method as its papers run it (every task's
parts kept). The model at the end of task i is rebuilt from checkpoint i and checked
against the run's own accuracy at t = i before anything is printed.

    .venv/bin/python benchmarks/decomposed_forgetting.py --construction thesis --epochs 20 \\
        --setting sequential --scenario S1 --seeds 10 --set scenario.s1_out_of_range=exclusive \\
        --runs benchmarks/out/continual_s1_excl_adam_l2_0.01:fedweit
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thesis_continual_mnist as tcm  # noqa: E402  (the benchmark whose runs are read)


def parts_at(checkpoints: Path, t: int):
    """The decomposed model (``Decomposed``) saved after timestep ``t``."""
    from clusterfed.continual.decomposed import Decomposed
    from clusterfed.layout import checkpoint_files

    files = checkpoint_files(checkpoints, t)
    if not files.tensors.is_file():
        raise SystemExit(f"{files.tensors}: missing (the run keeps a checkpoint per timestep)")
    extras: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in load_file(str(files.tensors)).items():
        if key.startswith("extra."):
            _, part, name = key.split(".", 2)
            extras.setdefault(part, {})[name] = value
    return Decomposed.from_extras(extras)


def drift(parts) -> float:
    """Mean over devices of the past tasks' relative drift during the task ``parts`` ended:
    sqrt(Σ_i ‖θ_i − θ_i*‖²) / sqrt(Σ_i ‖θ_i*‖²), θ_i = B ⊙ σ(m_i) + A_i (knowledge part aside)."""
    moved, size = 0.0, 0.0
    if parts.past:  # retroactive: past A_i trained too
        for name, target in parts.past_target.items():
            mask = parts.past_mask[name].view(*parts.past_mask[name].shape, *[1] * (target.dim() - 3))
            now = parts.base[name][:, None] * mask + parts.past[name]
            moved = moved + (now - target).square().flatten(1).sum(1)
            size = size + target.square().flatten(1).sum(1)
        return float((moved / size).sqrt().mean())
    for name, retro in parts.retro.items():
        base, anchor = parts.base[name], parts.anchor[name]
        weight = retro.view(*retro.shape, *[1] * (base.dim() - retro.dim()))
        moved = moved + (weight * (base - anchor).square()).flatten(1).sum(1)
        size = size + (weight * anchor.square()).flatten(1).sum(1)
    return float((moved / size).sqrt().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, metavar="OUT:ALGORITHM",
                   help="a thesis_continual_mnist.py --out folder and fedweit or fedprox_apd run there")
    tcm.cell_arguments(p, construction="thesis")
    p.add_argument("--prune", type=float, default=1e-3, help="the runs' λ1: the served model keeps |A| > λ1")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="the runs' scenario --set options")
    args = p.parse_args()
    from clusterfed.build import build_schedule, timestep_engines
    from clusterfed.layout import RunLayout

    T = args.timesteps
    print(f"{args.setting} {args.scenario}, {args.construction} construction: accuracy % (mean over devices, "
          f"t = 1..{T}); drift % of the past tasks' masked base a task (t = 1..{T}); forgetting = accuracy "
          f"points lost on task i by the end (i = 0..{T - 1})\n")
    print("| run | seed | accuracy | drift | forgetting | forgetting per task i = 0..T−1 |")
    print("|---|---|---|---|---|---|")
    engines = {}
    for spec in args.runs:
        out, _, algorithm = spec.rpartition(":")
        if algorithm not in ("fedweit", "fedprox_apd"):
            raise SystemExit(f"--runs expects OUT:fedweit or OUT:fedprox_apd, got {spec!r}")
        for seed in args.seeds:
            files = RunLayout(Path(out) / f"{args.setting}_{args.scenario}").continual_run(algorithm, seed)
            if not files.timesteps.is_file():
                raise SystemExit(f"{files.timesteps}: missing (no finished {algorithm} run of seed {seed} under {out})")
            run_args = tcm.run_namespace(args, out=out, algorithm=algorithm, seeds=[seed], settings=args.set)
            key = (args.construction, seed if args.construction == "thesis" else None)
            if key not in engines:  # the data: shared by every run of the same seed (thesis) or by all (authors)
                params = tcm.params_for(run_args, args.setting, args.scenario)
                engines[key] = timestep_engines(params, build_schedule(params), seed)
            engine_at = engines[key]
            rows = json.loads(files.timesteps.read_text())["rows"]
            final = parts_at(files.checkpoints, T)
            lost, drifts = [], []
            for t in range(T + 1):
                parts = parts_at(files.checkpoints, t)
                engine = engine_at(t)
                devices = np.arange(engine.n_devices)
                then = engine.accuracy(parts.compose(prune=args.prune), devices)
                if not np.allclose(then, rows[t]["device_accuracy"], atol=1e-6):
                    raise SystemExit(f"{files.dir}: checkpoint t = {t} does not reproduce the run's accuracy "
                                     f"({then.mean():.4f} vs {np.mean(rows[t]['device_accuracy']):.4f}); "
                                     "are --set and --construction the run's?")
                if t > 0:
                    drifts.append(drift(parts))
                if t < T:  # task t's parts on the final base; retroactive runs: with A_t as the end left it
                    adaptive = {k: v[:, t] for k, v in final.past.items()} if final.past else parts.adaptive
                    later = engine.accuracy(replace(parts, base=final.base, adaptive=adaptive).compose(prune=args.prune),
                                            devices)
                    lost.append(100 * float(np.mean(then - later)))
            accuracy = 100 * np.mean([np.mean(r["device_accuracy"]) for r in rows[1:]])
            per_task = ", ".join(f"{v:.2f}" for v in lost)
            print(f"| {out}:{algorithm} | {seed} | {accuracy:.2f} | {100 * np.mean(drifts):.2f} | "
                  f"{np.mean(lost):.2f} | {per_task} |", flush=True)


if __name__ == "__main__":
    main()
