"""C-FAACL: continual FAACL with concept memory (thesis ch. 4, Alg. 7–11).

At t = 0 FAACL clusters the devices (Alg. 7). At every later timestep each device
trains a new local model on its new data and looks for a known concept: first in
its own memory (local concept search, Alg. 8), then in every cluster's memory
(global concept search, Alg. 9); if neither matches, it founds a new cluster with
its local model (Alg. 10). The clusters then train, test support and merge as in
FAACL (Alg. 11). Clusters that lose all their devices keep their models, so a
concept that recurs finds its old model again.

Alg. 8 and 10 say only "train new model d.θ on the new data". ``local_init`` reads
where that model starts: ``cluster`` (the default), the model of the cluster the device
had at t − 1, fine-tuned on the new data, so a founder's cluster starts from what the
federation knew, not from scratch; or ``fresh`` weights. On MNIST's S1, S2 and A2 cells
``cluster`` scores within 0.06 points of ``fresh`` or above it, and it lifts the authors'
sequential A1 scored on clean images from 89.08 to 91.97 (benchmarks/RESULTS.md §8,
sessions 43–44).

A concept matches when the cluster model is no worse than the device's new local
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

from clusterfed.algorithms import FAACL, Cluster, Clustering, settle_clusters
from clusterfed.algorithms.protocol import Context
from clusterfed.continual.memory import Memory, MemoryEntry, merge_lineage
from clusterfed.continual.protocol import ContinualMethod
from clusterfed.continual.state import ContinualState, timestep_seed
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register
from clusterfed.stats import significant, support_pvalues


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
    """Alg. 8/9's test: p1 on Z_d^val and p2 on S' must both be significant at level
    α (``significant``: p ≤ α, the rule of Alg. 2)."""
    pair = {k: torch.cat([local_params[k], cluster_params[k]]) for k in local_params}
    on_memory = engine.sample_losses(pair, remembered.x, remembered.y)  # [2, |S'|]
    p1, p2 = support_pvalues([own_val, on_memory[0]], [cluster_val, on_memory[1]], epsilon)
    return bool(significant([p1, p2], alpha).all())


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


@register
class CFAACL(ContinualMethod):
    """Continual FAACL (thesis Alg. 11): FAACL at t = 0, then at each timestep the
    concept searches (Alg. 8–10), train/support/merge rounds, ``rounds`` training
    rounds, and the memory of the timestep (Table B.4: MNIST ε 0.5 for S1/S2, 0.3
    for A1, 0.2 for A2)."""

    name = "cfaacl"
    hyperparameters = (
        Param("alpha", 0.1, "significance level of every Wilcoxon test", symbol="α", gt=0.0, lt=1.0),
        Param("epsilon", 0.5, "loss tolerance of every Wilcoxon test (Table B.4)", symbol="ε", ge=0.0),
        Param("init_epochs", 5, "local epochs of the cold start (Alg. 1) and of each device's new local model",
              kind=int, gt=0),
        Param("local_init", "cluster", "where a device's new local model (Alg. 8-10) starts: its cluster's "
              "model at t - 1 or fresh weights", kind=str, choices=("cluster", "fresh")),
        Param("max_rounds", 20, "cap on train/support/merge rounds per timestep", kind=int, gt=0),
        Param("memory_samples", 100, "size of the sample S stored in each device's memory per timestep",
              symbol="S", kind=int, gt=0),
    )
    alpha: float
    epsilon: float
    init_epochs: int
    local_init: str
    max_rounds: int
    memory_samples: int

    def cold_start(self, engine: Engine, *, seed: int) -> ContinualState:
        """Alg. 7: FAACL on the t = 0 data, then the first memory entries."""
        result = FAACL(
            alpha=self.alpha, epsilon=self.epsilon, init_epochs=self.init_epochs,
            rounds=self.rounds, max_rounds=self.max_rounds,
        ).fit(engine, seed=timestep_seed(seed, 0))
        state = ContinualState(Clustering(result.clusters, result.params), Memory.empty(engine.n_devices))
        return self.remember(state, engine, 0, seed)

    def arrive(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        """Alg. 8–10 for every device, then Alg. 5's train/support/merge rounds."""
        rng, gen = ctx.rng, ctx.generator
        n = engine.n_devices
        previous, memory = state.clustering, state.memory
        devices = np.arange(n)
        if self.local_init == "cluster":
            start = take(previous.params, previous.model_of_device(n).tolist())
        else:
            start = engine.init_params(n, gen, distinct=False)
        local = engine.train(start, devices, devices, gen, local_epochs=self.init_epochs).params
        counts = engine.counts("val")
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
        memory.lineage.update(merge_lineage(before, {c.id: c.devices for c in clustering.clusters}))
        return ContinualState(clustering, memory)

    def remember(self, state: ContinualState, engine: Engine, t: int, seed: int) -> ContinualState:
        """d.M^(t) and C.M^(t) of thesis §2.2 for every device and cluster."""
        rng = np.random.default_rng([seed, t, 7])
        cluster_of = state.cluster_of_device(engine.n_devices)
        x, y = zip(*(engine.samples("val", d) for d in range(engine.n_devices)))
        state.memory.record(
            t, {d: int(c) for d, c in enumerate(cluster_of)}, x, y, samples=self.memory_samples, rng=rng
        )
        return state
