"""Bookkeeping every method shares: randomness, sampling, traffic and the history."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from clusterfed.algorithms.clustering import Cluster, Clustering, ColdStartResult, helping_memberships
from clusterfed.engine import Engine, StackedParams, Tally
from clusterfed.progress import progress as progress_bar


def generators(seed: int) -> tuple[np.random.Generator, torch.Generator]:
    """The two sources of randomness, passed down explicitly (never global state)."""
    return np.random.default_rng(seed), torch.Generator().manual_seed(seed)


def sample_participants(rng: np.random.Generator, n_devices: int, participation: float) -> np.ndarray:
    """The devices taking part in one round: ``max(1, round(participation * n))`` of
    them, drawn without replacement and sorted (all devices when it is 1)."""
    if not 0.0 < participation <= 1.0:
        raise ValueError(f"participation must be in (0, 1], got {participation}")
    if participation == 1.0:
        return np.arange(n_devices)
    k = max(1, int(round(participation * n_devices)))
    return np.sort(rng.choice(n_devices, size=k, replace=False))


def model_bytes(params: StackedParams) -> int:
    """Bytes of one model of the stack, as sent between server and device."""
    return sum(v[0].numel() * v.element_size() for v in params.values())


def pair_traffic(params: StackedParams, n_pairs: int) -> dict[str, int]:
    """Bytes of a round where each of ``n_pairs`` (model, device) pairs downloads its
    model and uploads the trained one (FedAvg: 2 models per participating device)."""
    size = model_bytes(params)
    return {"bytes_down": n_pairs * size, "bytes_up": n_pairs * size}


class History:
    """Per-round test accuracy, cluster count and traffic, with an optional progress bar.

    ``bytes_down`` / ``bytes_up`` are the combined size of the round's messages from
    server to devices and back (thesis Table 3.7 reports their sum per round).
    """

    def __init__(self, engine: Engine, algorithm: str, total: int, progress: bool) -> None:
        self.engine = engine
        self.rows: list[dict] = []
        self.bar = progress_bar(total, algorithm, enabled=progress)  # lines when not on a terminal

    def record(
        self, phase: str, clustering: Clustering, *, bytes_down: int, bytes_up: int,
        rejected_devices: Iterable[int] = (),
    ) -> None:
        """One round: its accuracy, clusters, support edges, devices training a model
        that does not serve them, traffic and the devices whose uploads the engine
        rejected in it (one entry per rejected upload)."""
        model_of_device = clustering.model_of_device(self.engine.n_devices)
        acc = self.engine.accuracy(clustering.params, model_of_device)
        edges = support_edges(clustering.clusters)
        self.rows.append(
            {
                "round": len(self.rows) + 1,
                "phase": phase,
                "accuracy": float(acc.mean()),
                "n_clusters": len(clustering.clusters),
                "support_edges": len(edges),
                "one_way_edges": sum((b, a) not in edges for a, b in edges),
                "helping_memberships": len(helping_memberships(
                    [c.devices for c in clustering.clusters], model_of_device)),
                "bytes_down": int(bytes_down),
                "bytes_up": int(bytes_up),
                "rejected_devices": [int(d) for d in rejected_devices],
            }
        )
        self.bar.set_postfix(acc=f"{acc.mean():.3f}", clusters=len(clustering.clusters))
        self.bar.update(1)

    def resume(self, rows: list[dict]) -> None:
        """Continue after ``rows``, the rounds recorded before a checkpoint."""
        self.rows = list(rows)
        self.bar.update(len(rows))

    def close(self) -> list[dict]:
        self.bar.close()
        return self.rows


def support_edges(clusters: Iterable[Cluster]) -> set[tuple[int, int]]:
    """(supported, supporter) cluster-id pairs the round trains with (thesis Alg. 4):
    one-way when the reverse pair is absent (§3.2, asymmetric clustering)."""
    return {(c.id, s) for c in clusters for s in c.sup}


def result_from(
    algorithm: str, engine: Engine, clustering: Clustering, history: History, screened: Tally
) -> ColdStartResult:
    """The fit's result; ``screened`` is the tally of every engine call of the fit."""
    model_of_device = clustering.model_of_device(engine.n_devices)
    return ColdStartResult(
        algorithm=algorithm,
        clusters=clustering.clusters,
        params=clustering.params,
        model_of_device=model_of_device,
        device_accuracy=engine.accuracy(clustering.params, model_of_device),
        history=history.close(),
        uploads=screened.uploads,
        rejected_by_device=tuple(int(n) for n in screened.rejected_by_device),
    )
