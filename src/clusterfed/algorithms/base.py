"""The small protocol every cold-start algorithm follows, and shared bookkeeping."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from clusterfed.algorithms.clustering import Clustering, ColdStartResult
from clusterfed.engine import Engine


class ColdStartAlgorithm(Protocol):
    """``fit`` clusters the engine's federation and trains a model per cluster."""

    name: str

    def fit(self, engine: Engine, *, seed: int, progress: bool = False) -> ColdStartResult: ...


def generators(seed: int) -> tuple[np.random.Generator, torch.Generator]:
    """The two sources of randomness, passed down explicitly (never global state)."""
    return np.random.default_rng(seed), torch.Generator().manual_seed(seed)


class History:
    """Per-round test accuracy and cluster count, with an optional progress bar."""

    def __init__(self, engine: Engine, algorithm: str, total: int, progress: bool) -> None:
        self.engine = engine
        self.rows: list[dict] = []
        # disable=None: bars only on a terminal, so logs (DVC, CI) get the summary lines only.
        self.bar = tqdm(total=total, desc=algorithm, disable=None if progress else True, leave=False)

    def record(self, phase: str, clustering: Clustering) -> None:
        model_of_device = clustering.model_of_device(self.engine.n_devices)
        acc = self.engine.accuracy(clustering.params, model_of_device)
        self.rows.append(
            {
                "round": len(self.rows) + 1,
                "phase": phase,
                "accuracy": float(acc.mean()),
                "n_clusters": len(clustering.clusters),
            }
        )
        self.bar.update(1)
        self.bar.set_postfix(acc=f"{acc.mean():.3f}", clusters=len(clustering.clusters))

    def close(self) -> list[dict]:
        self.bar.close()
        return self.rows


def result_from(
    algorithm: str, engine: Engine, clustering: Clustering, history: History
) -> ColdStartResult:
    model_of_device = clustering.model_of_device(engine.n_devices)
    return ColdStartResult(
        algorithm=algorithm,
        clusters=clustering.clusters,
        params=clustering.params,
        model_of_device=model_of_device,
        device_accuracy=engine.accuracy(clustering.params, model_of_device),
        history=history.close(),
        rejected_updates=engine.rejected_updates,
    )
