"""Runs a continual algorithm through timesteps 0..T with a checkpoint per timestep."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from clusterfed.continual.checkpoint import discard_checkpoints, latest_checkpoint, save_checkpoint
from clusterfed.continual.schedules import recurrences
from clusterfed.continual.protocol import ContinualMethod
from clusterfed.continual.state import ContinualState
from clusterfed.engine import Engine, Tally
from clusterfed.progress import progress as progress_bar


def run_continual(
    algorithm: ContinualMethod,
    engine_at: Callable[[int], Engine],
    schedule: np.ndarray,
    *,
    seed: int,
    checkpoint_dir: Path,
    fingerprint: str,
    progress: bool = False,
    stop_after: int | None = None,
    wall_times: Path | None = None,
) -> tuple[list[dict], ContinualState]:
    """Cold start at t = 0, then one ``step`` per timestep; resumable.

    ``engine_at(t)`` builds the engine over timestep t's data (devices get new data
    each timestep). After each finished timestep the state and the metric rows are
    checkpointed; a rerun with the same ``fingerprint`` resumes after the newest
    checkpoint and ends with the same result. A rerun with another fingerprint (other
    parameters or code) deletes the checkpoints it finds and starts over.
    ``stop_after`` ends the run early (used to test resumption). Each timestep's wall
    time is appended to the JSON-lines file ``wall_times`` when given, never to the
    rows or checkpoints: those must be byte-identical between identical runs.
    """
    timesteps = schedule.shape[1] - 1
    resumed = latest_checkpoint(checkpoint_dir, fingerprint)
    if resumed is None:  # nothing of this run's: another run's timesteps must not mix into it
        discard_checkpoints(checkpoint_dir)
        start, state, rows = 0, None, []
    else:
        last, state, rows = resumed
        start = last + 1
    bar = progress_bar(timesteps + 1 - start, f"{algorithm.name} timesteps", enabled=progress)
    for t in range(start, timesteps + 1):
        started = time.perf_counter()
        engine = engine_at(t)
        with engine.tally() as screened:  # every engine call of the timestep
            if t == 0:
                state = algorithm.cold_start(engine, seed=seed)
            else:
                state = algorithm.step(state, engine, t=t, seed=seed)
        rows.append(_row(t, state, engine, schedule, screened))
        save_checkpoint(checkpoint_dir, t, state, rows, fingerprint)
        if wall_times is not None:
            _append_line(wall_times, {"algorithm": algorithm.name, "seed": seed, "t": t,
                                      "wall_s": round(time.perf_counter() - started, 3)})
        bar.set_postfix(acc=f"{rows[-1]['accuracy']:.3f}", clusters=rows[-1]["n_clusters"])
        bar.update(1)
        if stop_after is not None and t >= stop_after:
            break
    bar.close()
    return rows, state


def _append_line(path: Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def _row(t: int, state: ContinualState, engine: Engine, schedule: np.ndarray, screened: Tally) -> dict:
    n = engine.n_devices
    accuracy = engine.accuracy(state.clustering.params, state.clustering.model_of_device(n))
    cluster_of = state.cluster_of_device(n)
    return {
        "t": t,
        "accuracy": float(accuracy.mean()),
        "device_accuracy": [round(float(a), 6) for a in accuracy],
        "n_clusters": len(set(cluster_of.tolist())),
        "n_models": len(state.clustering.clusters),
        "uploads": screened.uploads,
        "rejected_updates": screened.rejected,
        "rejected_devices": screened.rejected_devices(),
        "cluster_of_device": cluster_of.tolist(),
        "concept_of_device": schedule[:, t].tolist(),
    }


def concept_reuse_rate(rows: list[dict], schedule: np.ndarray, resolve: Callable[[int], int]) -> float | None:
    """Share of recurrences (a device's concept seen before) served by the cluster that
    served that concept at its last occurrence (majority of its devices, merges
    followed through ``resolve``). None when the schedule has no recurrence."""
    events = recurrences(schedule)
    if not events:
        return None
    hits = 0
    for d, t in events:
        c = schedule[d, t]
        last = max(u for u in range(t) if c in schedule[:, u])
        served = Counter(
            resolve(rows[last]["cluster_of_device"][e]) for e in range(schedule.shape[0]) if schedule[e, last] == c
        ).most_common(1)[0][0]
        hits += resolve(rows[t]["cluster_of_device"][d]) == served
    return hits / len(events)
