"""Device and cluster memory of thesis §2.2, and the lineage of merged clusters.

The memory is a passive record, not a replay buffer: device d keeps, per timestep, a
sample S of its validation data and the cluster it was in; cluster C keeps the
devices assigned to it per timestep. Concept searches (Alg. 8–9) test old cluster
models on remembered samples to recognise a recurring concept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class MemoryEntry:
    """d.M^(t) = {S, C}: a sample of local data and the device's cluster at t."""

    t: int
    cluster: int
    x: np.ndarray
    y: np.ndarray


@dataclass
class Memory:
    """All devices' and clusters' memories, plus which cluster a merged one became."""

    device: list[list[MemoryEntry]]
    cluster: dict[int, dict[int, list[int]]] = field(default_factory=dict)  # C.M: id -> t -> devices
    lineage: dict[int, int] = field(default_factory=dict)  # merged cluster id -> successor id

    @classmethod
    def empty(cls, n_devices: int) -> "Memory":
        return cls(device=[[] for _ in range(n_devices)])

    def resolve(self, cluster_id: int) -> int:
        """The current id of a cluster that may have been merged since."""
        while cluster_id in self.lineage:
            cluster_id = self.lineage[cluster_id]
        return cluster_id

    def record(
        self,
        t: int,
        cluster_of_device: dict[int, int],
        x_val: list[np.ndarray],
        y_val: list[np.ndarray],
        *,
        samples: int,
        rng: np.random.Generator,
    ) -> None:
        """Store d.M^(t) for every device and C.M^(t) for every cluster with devices."""
        for d, c in sorted(cluster_of_device.items()):
            pick = rng.choice(len(y_val[d]), size=min(samples, len(y_val[d])), replace=False)
            pick.sort()
            self.device[d].append(MemoryEntry(t, c, x_val[d][pick], y_val[d][pick]))
            self.cluster.setdefault(c, {}).setdefault(t, []).append(d)

    def cluster_sample(self, cluster_id: int) -> MemoryEntry | None:
        """A remembered sample of the concept cluster C served: from the most recent
        timestep t' with devices in C.M^(t'), the first such device's entry at t'."""
        best: tuple[int, int] | None = None
        for cid in self._ids_resolving_to(cluster_id):
            for t, devices in self.cluster.get(cid, {}).items():
                if best is None or t > best[0]:
                    best = (t, devices[0])
        if best is None:
            return None
        t, d = best
        return next(e for e in self.device[d] if e.t == t)

    def _ids_resolving_to(self, cluster_id: int) -> list[int]:
        return [c for c in self.cluster if self.resolve(c) == cluster_id]


def merge_lineage(before: dict[int, frozenset[int]], after: dict[int, frozenset[int]]) -> dict[int, int]:
    """Map each cluster id that disappeared to the cluster now holding its devices."""
    out = {}
    for cid, devices in before.items():
        if cid in after or not devices:
            continue
        d = next(iter(devices))
        out[cid] = next(new for new, members in after.items() if d in members)
    return out
