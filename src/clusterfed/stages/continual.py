"""Stage ``continual``: every continual method through timesteps 0..T for every seed."""

from __future__ import annotations

import shutil

import numpy as np

from clusterfed.build import build_continual_algorithm, build_schedule, checkpoint_fingerprint, timestep_engines
from clusterfed.config import Params
from clusterfed.continual.driver import concept_reuse_rate, run_continual
from clusterfed.engine.robust import check_rejections
from clusterfed.layout import RunLayout
from clusterfed.stages.files import save_models, write_json


def continual(params: Params, layout: RunLayout, *, progress: bool = True, keep_other_runs: bool = False) -> None:
    """Devices get new data at every timestep, drawn for the concept the schedule
    gives them. Each finished timestep is checkpointed (``ContinualFiles.checkpoints``);
    rerunning after an interruption resumes from the last finished timestep (only if
    the parameters are unchanged) and ends with the same result. Results:
    ``timesteps.json`` (per-timestep metrics, the cluster of every device, uploads
    screened and rejected, per device too), ``final_clustering.json`` and
    ``models.safetensors``. A run whose share of rejected uploads passes
    ``training.max_rejected_share`` raises ``TooManyRejected`` naming the devices,
    before writing its results (its checkpoints stay; the runs before it are kept). Wall times go to
    ``RunLayout.wall_times`` (outside the tracked outputs, which stay byte-identical
    between identical runs). DVC keeps this stage's outputs between runs (``persist``,
    for the checkpoints), so the runs of methods and seeds no longer in the parameters
    are deleted here, and the outputs hold exactly the runs asked for; a caller that
    gathers runs of several invocations in one layout (the benchmarks) passes
    ``keep_other_runs``.
    """
    c = params.continual
    if not keep_other_runs:
        _delete_runs_not_asked_for(params, layout, progress=progress)
    schedule = build_schedule(params)
    write_json(layout.schedule, schedule.tolist())
    for seed in params.seeds:
        engine_at = timestep_engines(params, schedule, seed)
        for name in c.algorithms:
            files = layout.continual_run(name, seed)
            rows, state = run_continual(
                build_continual_algorithm(name, params), engine_at, schedule, seed=seed,
                checkpoint_dir=files.checkpoints, fingerprint=checkpoint_fingerprint(params, name, seed),
                progress=progress, wall_times=layout.wall_times,
            )
            by_device = np.bincount(
                [d for r in rows for d in r["rejected_devices"]], minlength=schedule.shape[0]
            ).tolist()
            uploads = sum(r["uploads"] for r in rows)
            check_rejections(by_device, uploads, params.training.max_rejected_share,
                             what=f"continual {name} seed {seed}")
            summary = {
                "accuracy": float(np.mean([r["accuracy"] for r in rows[1:]])),
                "concept_reuse_rate": concept_reuse_rate(rows, schedule, state.memory.resolve),
                "n_clusters": [r["n_clusters"] for r in rows],
                "uploads": uploads,
                "rejected_updates": sum(by_device),
                "rejected_by_device": by_device,
            }
            write_json(files.timesteps, {"summary": summary, "rows": rows})
            final = {
                "clusters": [
                    {"id": k.id, "model_index": i, "devices": sorted(k.devices), "supportive_clusters": sorted(k.sup)}
                    for i, k in enumerate(state.clustering.clusters)
                ],
                "cluster_of_device": rows[-1]["cluster_of_device"],
            }
            write_json(files.final_clustering, final)
            save_models(files.models, state.clustering.params,
                        {"algorithm": name, "seed": str(seed), "timestep": str(rows[-1]["t"])})
            if progress:
                print(
                    f"seed {seed:>5} {name:<12} mean accuracy over t=1..{c.timesteps} "
                    f"{summary['accuracy']:.4f}  concept reuse {summary['concept_reuse_rate']}",
                    flush=True,
                )


def _delete_runs_not_asked_for(params: Params, layout: RunLayout, *, progress: bool) -> None:
    asked = {layout.continual_run(name, seed).dir for name in params.continual.algorithms for seed in params.seeds}
    for run in sorted(layout.continual.glob("*/seed_*")):
        if run.is_dir() and run not in asked:
            shutil.rmtree(run)
            if progress:
                print(f"deleted {run}: {run.parent.name} seed {run.name.removeprefix('seed_')} is no longer in the parameters",
                      flush=True)
    for method in layout.continual.glob("*"):
        if method.is_dir() and not any(method.iterdir()):
            method.rmdir()
