"""Prefect tasks: thin typed wrappers around ``clusterfed.stages`` and ``clusterfed.tracking``.

Stage tasks call the very functions the DVC stages call. They are cached by their
inputs (the params, the layout's paths, the content digest of the upstream
stage's outputs) and the content of the code; flows submit them through :func:`unless_missing`, so a cached result is
used only while the task's outputs still exist.
Training tasks carry the ``gpu`` tag, so ``prefect concurrency-limit create gpu 1``
caps how many train at once. Only I/O-bound tasks retry, and only on ``OSError``
(file systems, the MLflow server): a failed training run is not transient.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.context import TaskRunContext
from prefect.states import State

from clusterfed import stages
from clusterfed.build import code_digest
from clusterfed.config import Params
from clusterfed.layout import RunLayout
from clusterfed.tracking import PipelineTracker


def retry_on_io_error(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry transient I/O failures only (OSError covers connection and timeout errors)."""
    try:
        state.result()
    except OSError:
        return True
    except Exception:
        return False
    return False


def stage_cache_key(context: TaskRunContext, arguments: dict[str, Any]) -> str:
    """Hash of the task's name, the code (``code_digest``) and every argument (the
    params as JSON, the layout's paths resolved, upstream digests)."""
    canonical = {name: _canonical(value) for name, value in sorted(arguments.items())}
    blob = json.dumps([context.task.name, code_digest(), canonical], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, Params):
        return value.model_dump(mode="json")
    if isinstance(value, RunLayout):
        return {"root": str(value.root.resolve()), "partitions": str(value.partitions.resolve())}
    if isinstance(value, Path):
        return str(value.resolve())
    return value


def unless_missing(stage: Task, *outputs: Path) -> Task:
    """``stage`` as is while all its ``outputs`` exist; else set to run and refresh its
    cache entry (a cached result must never stand for files that are gone)."""
    if all(Path(p).exists() for p in outputs):
        return stage
    return stage.with_options(refresh_cache=True)


def digest(path: Path) -> str:
    """Content hash of a stage's output folder, handed downstream as a cache input."""
    h = hashlib.sha256()
    for file in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(file.relative_to(path)).encode())
        h.update(file.read_bytes())
    return h.hexdigest()


_CACHED = dict(cache_key_fn=stage_cache_key, persist_result=True, result_serializer="json")
_IO_RETRIES = dict(retries=2, retry_delay_seconds=5, retry_condition_fn=retry_on_io_error)


@task(name="partition", **_CACHED, **_IO_RETRIES)
def partition(params: Params, layout: RunLayout) -> str:
    """Build the federations (reads the dataset files: I/O, so it may retry)."""
    stages.partition(params, layout)
    return digest(layout.partitions)


@task(name="coldstart", tags=["gpu"], log_prints=True, **_CACHED)  # progress lines -> task logs
def coldstart(params: Params, layout: RunLayout, partitions_digest: str) -> str:
    """Cluster and train every configured algorithm on every seed."""
    stages.coldstart(params, layout)
    return digest(layout.coldstart)


@task(name="continual", tags=["gpu"], log_prints=True, **_CACHED)
def continual(params: Params, layout: RunLayout) -> str:
    """Timesteps 0..T from the concept schedule (resumes from its per-timestep checkpoints)."""
    stages.continual(params, layout)
    return digest(layout.continual)


@task(name="unsupervised", tags=["gpu"], **_CACHED)
def unsupervised(params: Params, layout: RunLayout) -> str:
    """FedCRef and its baselines on unlabelled clients (builds its own data)."""
    stages.unsupervised(params, layout)
    return digest(layout.unsupervised)


@task(name="evaluate", **_CACHED)
def evaluate(params: Params, layout: RunLayout, upstream_digests: list[str]) -> dict:
    """Metrics over seeds (cold start; continual and FedCRef when enabled) and the plots."""
    return stages.evaluate(params, layout)


@task(name="track-start", cache_policy=NO_CACHE, **_IO_RETRIES)
def track_start(params: Params, tracking_root: Path, tags: dict[str, str]) -> PipelineTracker:
    return PipelineTracker.start(params, root=tracking_root, tags=tags)


@task(name="track-stage", cache_policy=NO_CACHE, **_IO_RETRIES)
def track_stage(tracker: PipelineTracker, stage: str, params: Params, layout: RunLayout) -> None:
    """Log a finished stage's outputs as a nested run (coldstart/continual: register models)."""
    if stage == "partition":
        tracker.log_partition(params, layout)
    elif stage == "coldstart":
        tracker.log_coldstart(params, layout)
    elif stage == "continual":
        tracker.log_continual(params, layout)
    elif stage == "unsupervised":
        tracker.log_unsupervised(params, layout)
    elif stage == "evaluate":
        tracker.log_evaluate(layout)
    else:
        raise ValueError(f"unknown stage {stage!r}")


@task(name="track-finish", cache_policy=NO_CACHE, **_IO_RETRIES)
def track_finish(tracker: PipelineTracker, status: str = "FINISHED") -> None:
    tracker.finish(status)
