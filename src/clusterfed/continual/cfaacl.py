"""C-FAACL: continual FAACL with concept memory (thesis ch. 4, Alg. 7–11).

At t = 0 FAACL clusters the devices (Alg. 7). At every later timestep each device
trains a fresh local model on its new data and looks for a known concept: first in
its own memory (local concept search, Alg. 8), then in every cluster's memory
(global concept search, Alg. 9); if neither matches, it founds a new cluster with
its local model (Alg. 10). The clusters then train, test support and merge as in
FAACL (Alg. 11). Clusters that lose all their devices keep their models, so a
concept that recurs finds its old model again.

A concept matches when the cluster model is no worse than the device's fresh local
model, by the one-sided Wilcoxon test of Alg. 2 (tolerance ε, level α), both on the
device's current validation data and on the remembered sample S' of that concept.

References
----------
Z. Zhang, "Asymmetric Clustering in Federated Continual Learning", MMath thesis,
University of Waterloo, 2024, §2.2 and §4.2.
"""

from __future__ import annotations

import numpy as np
import torch

from clusterfed.algorithms import FAACL, Cluster, Clustering, cluster_train, settle_clusters
from clusterfed.algorithms.base import generators
from clusterfed.continual.memory import Memory, MemoryEntry, merge_lineage
from clusterfed.continual.state import ContinualState, timestep_seed
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import take
from clusterfed.stats import support_pvalues


def concept_matches(
    engine: Engine,
    cluster_params: StackedParams,
    local_params: StackedParams,
    own_val: np.ndarray,
    cluster_val: np.ndarray,
    remembered: MemoryEntry,
    *,
    alpha: float,
    epsilon: float,
) -> bool:
    """Alg. 8/9's test: p1 on Z_d^val and p2 on S' must both be below α."""
    pair = {k: torch.cat([local_params[k], cluster_params[k]]) for k in local_params}
    on_memory = engine.sample_losses(pair, remembered.x, remembered.y)  # [2, |S'|]
    p1, p2 = support_pvalues([own_val, on_memory[0]], [cluster_val, on_memory[1]], epsilon)
    return bool(p1 < alpha and p2 < alpha)


def local_concept_search(
    d: int, engine: Engine, clustering: Clustering, memory: Memory, local: StackedParams,
    own_val: np.ndarray, cluster_val: np.ndarray, *, alpha: float, epsilon: float,
) -> int | None:
    """Alg. 8: the cluster of the most recent entry of d's memory whose concept matches."""
    ids = clustering.ids
    for entry in reversed(memory.device[d]):
        cid = memory.resolve(entry.cluster)
        if cid not in ids:
            continue
        row = ids.index(cid)
        if concept_matches(
            engine, take(clustering.params, [row]), take(local, [d]), own_val, cluster_val[row],
            entry, alpha=alpha, epsilon=epsilon,
        ):
            return cid
    return None


def global_concept_search(
    d: int, engine: Engine, clustering: Clustering, memory: Memory, local: StackedParams,
    own_val: np.ndarray, cluster_val: np.ndarray, *, alpha: float, epsilon: float,
) -> int | None:
    """Alg. 9: every cluster of 𝒞_{t-1}, tested on a sample remembered by one of its
    former devices; clusters are tried from the lowest mean loss on d's data up."""
    for row in np.argsort(cluster_val.mean(axis=1), kind="stable"):
        cid = clustering.clusters[row].id
        remembered = memory.cluster_sample(cid)
        if remembered is not None and concept_matches(
            engine, take(clustering.params, [int(row)]), take(local, [d]), own_val, cluster_val[row],
            remembered, alpha=alpha, epsilon=epsilon,
        ):
            return cid
    return None


class CFAACL:
    """Continual FAACL (thesis Alg. 11).

    Parameters
    ----------
    alpha, epsilon : float
        Level and tolerance of every Wilcoxon test (Table B.4: MNIST ε 0.5 for S1/S2,
        0.3 for A1, 0.2 for A2).
    epochs : int, default=100
        Training rounds per timestep (Table B.4).
    init_epochs : int, default=5
        Local epochs of the cold start (Alg. 1) and of each device's fresh local model.
    max_rounds : int, default=20
        Cap on train/support/merge rounds per timestep.
    memory_samples : int, default=100
        Size of the sample S stored in each device's memory per timestep.
    """

    name = "cfaacl"

    def __init__(
        self, *, alpha: float = 0.1, epsilon: float = 0.5, epochs: int = 100, init_epochs: int = 5,
        max_rounds: int = 20, memory_samples: int = 100,
    ) -> None:
        self.alpha = alpha
        self.epsilon = epsilon
        self.epochs = epochs
        self.init_epochs = init_epochs
        self.max_rounds = max_rounds
        self.memory_samples = memory_samples

    def cold_start(self, engine: Engine, *, seed: int) -> ContinualState:
        """Alg. 7: FAACL on the t = 0 data, then the first memory entries."""
        result = FAACL(
            alpha=self.alpha, epsilon=self.epsilon, init_epochs=self.init_epochs,
            epochs=self.epochs, max_rounds=self.max_rounds,
        ).fit(engine, seed=timestep_seed(seed, 0))
        state = ContinualState(Clustering(result.clusters, result.params), Memory.empty(engine.n_devices))
        self._remember(state, engine, 0, seed)
        return state

    def step(self, state: ContinualState, engine: Engine, *, t: int, seed: int) -> ContinualState:
        rng, gen = generators(timestep_seed(seed, t))
        n = engine.n_devices
        previous, memory = state.clustering, state.memory
        devices = np.arange(n)
        local = engine.train(engine.init_params(n, gen, distinct=False), devices, devices, gen, epochs=self.init_epochs)
        counts = engine.data.val.counts.cpu().numpy()
        own_val = engine.own_losses(local, devices, "val").cpu().numpy()
        cluster_val = engine.losses(previous.params, "val").cpu().numpy()

        assigned: dict[int, int] = {}
        founders: list[int] = []
        for d in range(n):
            args = (d, engine, previous, memory, local, own_val[d, : counts[d]], cluster_val[:, d, : counts[d]])
            cid = local_concept_search(*args, alpha=self.alpha, epsilon=self.epsilon)
            if cid is None:
                cid = global_concept_search(*args, alpha=self.alpha, epsilon=self.epsilon)
            if cid is None:
                founders.append(d)  # Alg. 10: a new concept
            else:
                assigned[d] = cid

        clusters = [
            Cluster(c.id, frozenset(d for d, a in assigned.items() if a == c.id)) for c in previous.clusters
        ]
        next_id = previous.next_id()
        clusters += [Cluster(next_id + k, frozenset({d})) for k, d in enumerate(founders)]
        params = {k: torch.cat([previous.params[k], local[k][founders]]) for k in local}
        clustering = Clustering(tuple(clusters), params)

        before = {c.id: c.devices for c in clustering.clusters}
        clustering = settle_clusters(
            engine, clustering, alpha=self.alpha, epsilon=self.epsilon, rng=rng, generator=gen,
            max_rounds=self.max_rounds,
        )
        for _ in range(self.epochs):
            clustering = cluster_train(engine, clustering, gen)
        memory.lineage.update(merge_lineage(before, {c.id: c.devices for c in clustering.clusters}))
        state = ContinualState(clustering, memory)
        self._remember(state, engine, t, seed)
        return state

    def _remember(self, state: ContinualState, engine: Engine, t: int, seed: int) -> None:
        rng = np.random.default_rng([seed, t, 7])
        cluster_of = state.cluster_of_device(engine.n_devices)
        val = engine.data.val
        x = [val.x[d, : val.counts[d]].cpu().numpy() for d in range(engine.n_devices)]
        y = [val.y[d, : val.counts[d]].cpu().numpy() for d in range(engine.n_devices)]
        state.memory.record(
            t, {d: int(c) for d, c in enumerate(cluster_of)}, x, y, samples=self.memory_samples, rng=rng
        )
