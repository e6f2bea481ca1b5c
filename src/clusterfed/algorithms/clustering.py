"""Clusters and clusterings (thesis §2.2) and the result every algorithm returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from clusterfed.engine import StackedParams


@dataclass(frozen=True)
class Cluster:
    """C_j of thesis §2.2: devices ``D`` that use its model, supportive clusters ``sup``
    (ids of clusters whose devices help train this model but do not use it)."""

    id: int
    devices: frozenset[int]
    sup: frozenset[int] = frozenset()


def helping_memberships(
    devices_of_row: Sequence[Iterable[int]], model_of_device: Sequence[int]
) -> list[tuple[int, int, int]]:
    """(device, serving row, helped row) for every device that a cluster lists without
    serving it: its data trains that cluster's model, which it does not use (thesis
    §3.3.4; the overlap that FAACL's ``merge="absorbing"`` leaves). Empty for a
    partition, where every listed device is served by its one cluster."""
    return [
        (d, int(model_of_device[d]), row)
        for row, devices in enumerate(devices_of_row)
        for d in sorted(devices)
        if model_of_device[d] != row
    ]


@dataclass(frozen=True)
class Clustering:
    """A clustering 𝒞: clusters whose device sets cover the federation without overlap.

    ``params`` holds the cluster models stacked in the order of ``clusters``.
    ``overlapping``: clusters may share devices (FAACL's ``merge="overlapping"`` and
    ``merge="absorbing"``, merges of the authors' code); a device is then served by the
    first cluster that lists it, unless ``served`` names the row serving each device,
    and ``memberships`` gives every (cluster, device) pair.
    """

    clusters: tuple[Cluster, ...]
    params: StackedParams
    overlapping: bool = False
    served: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.overlapping:
            return
        seen: set[int] = set()
        for c in self.clusters:
            if seen & c.devices:
                raise ValueError(f"device(s) {sorted(seen & c.devices)} are in two clusters")
            seen |= c.devices

    @property
    def ids(self) -> list[int]:
        return [c.id for c in self.clusters]

    def index(self, cluster_id: int) -> int:
        return self.ids.index(cluster_id)

    def next_id(self) -> int:
        return max(self.ids, default=-1) + 1

    def model_of_device(self, n_devices: int) -> np.ndarray:
        """Row of ``params`` serving each device (the cluster whose D holds it; when
        clusters overlap, ``served`` or else the first such cluster)."""
        if self.served is not None:
            return np.array(self.served, dtype=np.int64)
        out = np.full(n_devices, -1, dtype=np.int64)
        for i in reversed(range(len(self.clusters))):
            out[sorted(self.clusters[i].devices)] = i
        if (out < 0).any():
            raise ValueError(f"devices {np.flatnonzero(out < 0).tolist()} are in no cluster")
        return out

    def memberships(self) -> tuple[np.ndarray, np.ndarray]:
        """(row, device) of every device in every cluster, by device then row: one pair
        per device for a partition, several for a device that overlapping clusters share."""
        pairs = sorted((d, i) for i, c in enumerate(self.clusters) for d in c.devices)
        rows = np.array([i for _, i in pairs], dtype=np.int64)
        devices = np.array([d for d, _ in pairs], dtype=np.int64)
        return rows, devices

    def partition(self) -> frozenset[frozenset[int]]:
        """The device partition alone, for convergence checks."""
        return frozenset(c.devices for c in self.clusters)

    def training_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(model, device) pairs of thesis Alg. 4: each cluster trains on its own devices
        and on the devices of its supportive clusters."""
        by_id = {c.id: c for c in self.clusters}
        models, devices = [], []
        for i, c in enumerate(self.clusters):
            members = set(c.devices)
            for s in c.sup:
                members |= by_id[s].devices
            models += [i] * len(members)
            devices += sorted(members)
        return np.asarray(models, dtype=np.int64), np.asarray(devices, dtype=np.int64)

    def with_params(self, params: StackedParams) -> "Clustering":
        return replace(self, params=params)


@dataclass
class ColdStartResult:
    """What an algorithm leaves after cold start: clusters, models and scores."""

    algorithm: str
    clusters: tuple[Cluster, ...]
    params: StackedParams
    model_of_device: np.ndarray
    device_accuracy: np.ndarray
    history: list[dict] = field(default_factory=list)
    uploads: int = 0  # uploads the engine screened during the fit
    rejected_by_device: tuple[int, ...] = ()  # of them, rejected, per device (engine rows)
    resumed_from_round: int | None = None  # the snapshot's round when the fit resumed from one

    @property
    def rejected_updates(self) -> int:
        return int(sum(self.rejected_by_device))

    @property
    def n_clusters(self) -> int:
        return len(set(self.model_of_device.tolist()))

    def clustering_json(self) -> dict:
        """Devices and supportive clusters of each cluster, for people and DVC."""
        return {
            "algorithm": self.algorithm,
            "n_clusters": self.n_clusters,
            "clusters": [
                {
                    "id": c.id,
                    "model_index": i,
                    "devices": sorted(c.devices),
                    "supportive_clusters": sorted(c.sup),
                }
                for i, c in enumerate(self.clusters)
            ],
            "model_of_device": self.model_of_device.tolist(),
            "rejected_updates": self.rejected_updates,
        }
