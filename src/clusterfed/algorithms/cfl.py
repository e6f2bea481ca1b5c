"""CFL: Clustered Federated Learning by recursive bipartitioning (Sattler et al., Alg. 1).

Every cluster runs FedAvg on its own model. Once a cluster's FedAvg has stalled at
a stationary point of the clients' joint objective — the norm of the mean update is
below ε1 while some client's update is still larger than ε2 — its clients are split
in two by the cosine similarity of their updates.

The server's steps are pure functions: ``should_split`` (the criterion of §IV,
with the authors' extra conditions), ``cosine_similarity`` and ``bipartition``
(optimal bipartition approximated by complete linkage, §III).

References
----------
F. Sattler, K.-R. Müller and W. Samek, "Clustered Federated Learning: Model-Agnostic
Distributed Multitask Optimization Under Privacy Constraints", IEEE TNNLS, 2020.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import average, labels_clustering, updates
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def update_norms(delta: torch.Tensor, weights: torch.Tensor) -> tuple[float, float]:
    """(‖Σ_i w_i Δθ_i‖ / Σ_i w_i, max_i ‖Δθ_i‖) of one cluster's client updates ``[k, p]``
    with weights |D_i| (Alg. 1: the mean update is the |D_i|-weighted one)."""
    w = weights.to(delta.dtype)
    mean = (w[:, None] * delta).sum(0) / w.sum().clamp(min=1e-12)
    return float(mean.norm()), float(delta.norm(dim=1).max())


def should_split(
    mean_norm: float,
    max_norm: float,
    n_clients: int,
    round_: int,
    *,
    eps1: float,
    eps2: float,
    start_round: int = 20,
    min_clients: int = 2,
) -> bool:
    """§IV's criterion: the cluster is near a stationary point of the joint objective
    (mean update norm < ε1) but not of every client's (max update norm > ε2). As in
    the authors' code, only after round ``start_round`` and for clusters of more
    than ``min_clients`` clients."""
    return round_ > start_round and n_clients > min_clients and mean_norm < eps1 and max_norm > eps2


def cosine_similarity(delta: torch.Tensor) -> np.ndarray:
    """α_ij = ⟨Δθ_i, Δθ_j⟩ / (‖Δθ_i‖‖Δθ_j‖), ``[k, k]`` (a zero update has α = 0)."""
    unit = delta / delta.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return (unit @ unit.T).clamp(-1.0, 1.0).double().cpu().numpy()


def bipartition(alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """§III: the split c1 ∪ c2 that maximises the smallest cross-similarity, found as
    the authors do by complete linkage on −α cut into two clusters. Returns the
    indices of c1 (holding index 0) and of c2, sorted."""
    k = len(alpha)
    if k < 2:
        raise ValueError(f"need at least two clients to bipartition, got {k}")
    distance = 1.0 - np.asarray(alpha, dtype=np.float64)  # −α shifted to be ≥ 0
    np.fill_diagonal(distance, 0.0)
    z = hierarchy.linkage(squareform(distance, checks=False), method="complete")
    side = hierarchy.fcluster(z, t=2, criterion="maxclust")
    c1 = np.flatnonzero(side == side[0])
    c2 = np.flatnonzero(side != side[0])
    return c1, c2


@dataclass(frozen=True)
class CFLState:
    labels: np.ndarray  # cluster of each client
    params: StackedParams  # one model per cluster
    t: int = 0  # rounds done
    splits: tuple = ()  # (round, c1, c2) of every split
    norms: tuple = ()  # per round and cluster: round, cluster, mean_norm, max_norm


@register
class CFL(ColdStart[CFLState]):
    """Clustered Federated Learning (Sattler et al., 2020, Alg. 1).

    One model per cluster, all starting from one θ. Each round every client trains
    its cluster's model and the model becomes the |D|-weighted average of its
    clients' updates; then each cluster whose clients meet ``should_split`` is
    bipartitioned by ``bipartition`` on their cosine similarities, both halves
    keeping the cluster's model. Clusters split recursively in later rounds. CFL
    needs every client's update to split a cluster, so it runs with full
    participation (as the paper and the authors' code do).

    Attributes
    ----------
    labels_ : ndarray of shape (n_devices,)
        Final cluster of each client.
    splits_ : list of (int, list of int, list of int)
        (round, c1, c2) of every split.
    norms_ : list of dict
        Per round and cluster: round, cluster, mean_norm, max_norm (to read ε off).
    """

    name = "cfl"
    full_participation = True
    hyperparameters = (
        Param("eps1", 0.4, "split when the mean update norm of a cluster is below ε1 (the authors' MNIST value; "
              "norms scale with lr, local steps and model: read them off norms_)", symbol="ε1", kind=float, ge=0.0),
        Param("eps2", 1.6, "... and its largest client update norm above ε2 (the authors' MNIST value)",
              symbol="ε2", kind=float, ge=0.0),
        Param("start_round", 20, "no split up to this round (the authors' code)", kind=int, ge=0),
        Param("min_clients", 2, "only clusters with more clients than this split (the authors' code)",
              kind=int, ge=1),
    )
    eps1: float
    eps2: float
    start_round: int
    min_clients: int

    def init(self, engine: Engine, ctx: Context) -> CFLState:
        return CFLState(np.zeros(engine.n_devices, dtype=np.int64), engine.init_params(1, ctx.generator, distinct=False))

    def configure_round(self, engine, state, participants, ctx):
        plan = RoundPlan(
            state.params, state.labels[participants], participants, upload="each",
            **pair_traffic(state.params, len(participants)),
        )
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        t = state.t + 1
        labels = state.labels.copy()
        M = plan.devices
        delta, ok = updates(engine, plan.params, plan.models, trained)
        params = average(engine, trained, plan.models, M, ok, plan.params)
        counts = torch.as_tensor(engine.counts("train"), device=delta.device)
        splits, norms = list(state.splits), list(state.norms)
        for c in range(int(labels.max()) + 1):
            mine = np.flatnonzero((plan.models == c) & ok)
            if len(mine) == 0:
                continue
            mean_norm, max_norm = update_norms(delta[mine], counts[torch.as_tensor(M[mine], device=counts.device)])
            norms.append({"round": t, "cluster": c, "mean_norm": mean_norm, "max_norm": max_norm})
            if should_split(
                mean_norm, max_norm, len(mine), t, eps1=self.eps1, eps2=self.eps2,
                start_round=self.start_round, min_clients=self.min_clients,
            ):
                c1, c2 = bipartition(cosine_similarity(delta[mine]))
                labels[M[mine[c2]]] = int(labels.max()) + 1  # c2 takes a copy of c's model
                params = {k: torch.cat([v, v[c : c + 1]]) for k, v in params.items()}
                splits.append((t, sorted(M[mine[c1]].tolist()), sorted(M[mine[c2]].tolist())))
        return CFLState(labels, params, t, tuple(splits), tuple(norms))

    def clustering(self, state: CFLState) -> Clustering:
        return labels_clustering(state.labels, state.params)

    def fitted(self, engine, state):
        self.labels_, self.splits_, self.norms_ = state.labels, list(state.splits), list(state.norms)
