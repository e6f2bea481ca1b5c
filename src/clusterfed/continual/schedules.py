"""Concept schedules: which concept each device holds at each timestep (thesis §4.3).

A schedule is an explicit ``[n_devices, T + 1]`` integer matrix; column 0 is the cold
start (t = 0). Two generators give the thesis settings with recurring concepts:

- *sequential task learning* (§4.3.1): every device holds the same concept at a
  timestep, and the concept changes over time;
- *multi-task learning* (§4.3.2): devices hold different concepts at the same
  timestep (two halves hold opposite concepts), and they change over time.

Concepts alternate in blocks of ``block`` timesteps, so every concept recurs.
"""

from __future__ import annotations

import numpy as np

SETTINGS: tuple[str, ...] = ("sequential", "multitask")


def sequential_schedule(n_devices: int, timesteps: int, *, n_concepts: int = 2, block: int = 2) -> np.ndarray:
    """All devices share concept ``(t // block) % n_concepts`` at timestep t."""
    concept = (np.arange(timesteps + 1) // block) % n_concepts
    return np.tile(concept, (n_devices, 1)).astype(np.int64)


def multitask_schedule(n_devices: int, timesteps: int, *, n_concepts: int = 2, block: int = 2) -> np.ndarray:
    """Device half h holds concept ``(t // block + h) % n_concepts`` at timestep t."""
    half = (np.arange(n_devices) >= n_devices // 2).astype(np.int64)
    base = np.arange(timesteps + 1) // block
    return ((base[None, :] + half[:, None]) % n_concepts).astype(np.int64)


def make_schedule(setting: str, n_devices: int, timesteps: int, *, n_concepts: int = 2, block: int = 2) -> np.ndarray:
    if setting == "sequential":
        return sequential_schedule(n_devices, timesteps, n_concepts=n_concepts, block=block)
    if setting == "multitask":
        return multitask_schedule(n_devices, timesteps, n_concepts=n_concepts, block=block)
    raise ValueError(f"unknown continual setting {setting!r}; expected one of {SETTINGS}")


def validate_schedule(schedule: object, *, n_devices: int, timesteps: int, n_concepts: int) -> np.ndarray:
    """Return ``schedule`` as an int matrix, or raise ValueError saying what is wrong."""
    try:
        matrix = np.asarray(schedule)
    except ValueError:  # ragged rows
        raise ValueError("schedule: rows have different lengths") from None
    if matrix.dtype == object or matrix.ndim != 2:
        raise ValueError("schedule: expected a devices x timesteps matrix of concept ids")
    expected = (n_devices, timesteps + 1)
    if matrix.shape != expected:
        raise ValueError(
            f"schedule: shape {matrix.shape}, expected {expected} "
            f"({n_devices} devices x timesteps 0..{timesteps})"
        )
    if not np.issubdtype(matrix.dtype, np.integer):
        raise ValueError(f"schedule: concept ids must be integers, got {matrix.dtype}")
    unknown = sorted(set(np.unique(matrix).tolist()) - set(range(n_concepts)))
    if unknown:
        raise ValueError(f"schedule: unknown concept(s) {unknown}; this scenario has concepts 0..{n_concepts - 1}")
    return matrix.astype(np.int64)


def recurrences(schedule: np.ndarray) -> list[tuple[int, int]]:
    """(device, t) pairs, t ≥ 1, whose concept was already present at an earlier timestep."""
    seen: set[int] = set(schedule[:, 0].tolist())
    out = []
    for t in range(1, schedule.shape[1]):
        out += [(d, t) for d in range(schedule.shape[0]) if schedule[d, t] in seen]
        seen |= set(schedule[:, t].tolist())
    return out
