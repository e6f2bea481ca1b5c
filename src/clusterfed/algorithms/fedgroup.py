"""FedGroup: grouping clients by the decomposed cosine similarity of their updates
(Duan et al., §III–IV).

A pre-training round gives the updates Δw of α·K sampled clients; the server
decomposes them by truncated SVD into K directions, describes every client by the
cosines of its update with those directions (EDC: the Euclidean distance between
these descriptions) and groups the clients by K-means++. Every other client is a
newcomer: it pre-trains once and joins the group of the nearest centroid (cold
start). Groups then train by intra-group FedAvg plus an inter-group step η_g.

Pure steps: ``decomposed_directions``, ``decomposed_cosines``, ``edc``,
``group_clients``, ``nearest_group`` and ``inter_group``.

References
----------
M. Duan, D. Liu, X. Ji, R. Liu, L. Liang, X. Chen and Y. Tan, "FedGroup: Efficient
Federated Learning via Decomposed Similarity-Based Clustering", IEEE ISPA 2021.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.spatial.distance import cdist, pdist, squareform
from sklearn.cluster import KMeans

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import flat, labels_clustering, updates
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def decomposed_directions(delta: np.ndarray, K: int) -> np.ndarray:
    """The K left singular vectors of ΔW = [Δw_1 … Δw_m] (parameters × clients) with
    the largest singular values, ``[p, K]``."""
    u, _, _ = np.linalg.svd(np.asarray(delta, dtype=np.float64).T, full_matrices=False)
    return u[:, :K]


def decomposed_cosines(delta: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """M_ik = cos(Δw_i, v_k): each client's update described by its cosines with the
    K directions, ``[m, K]`` (a zero update has cosines 0)."""
    delta = np.asarray(delta, dtype=np.float64)
    norms = np.linalg.norm(delta, axis=1, keepdims=True) * np.linalg.norm(directions, axis=0, keepdims=True)
    return np.divide(delta @ directions, norms, out=np.zeros((len(delta), directions.shape[1])), where=norms > 0)


def edc(cosines: np.ndarray) -> np.ndarray:
    """EDC_ij = ‖M_i − M_j‖₂, the Euclidean distance of decomposed cosine similarity."""
    return squareform(pdist(cosines, metric="euclidean"))


def group_clients(cosines: np.ndarray, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """K-means++ on the rows of M (so clients are compared by EDC). Returns labels
    numbered by first appearance and the centroids in that order, ``[K, K]``."""
    km = KMeans(n_clusters=K, init="k-means++", n_init=10, random_state=seed).fit(cosines)
    _, first = np.unique(km.labels_, return_index=True)
    order = km.labels_[np.sort(first)]  # k-means labels by first appearance
    rank = np.empty(K, dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[km.labels_], km.cluster_centers_[order]


def nearest_group(cosines: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Newcomer cold start: the group whose centroid is nearest in EDC."""
    return cdist(np.atleast_2d(cosines), centroids).argmin(1).astype(np.int64)


@dataclass(frozen=True)
class FedGroupState:
    labels: np.ndarray
    groups: StackedParams  # one model per group
    pretrained: np.ndarray  # clients sampled for grouping
    cosines: np.ndarray  # M of every client


@register
class FedGroup(ColdStart[FedGroupState]):
    """FedGroup (Duan et al., ISPA 2021).

    The clustering round (``init``): every client trains the initial w0 for
    ``pretrain_epochs`` and sends Δw; the server groups α·K sampled clients by
    K-means++ on their decomposed cosines and places the others, as newcomers, in
    the group of the nearest centroid (cold start). Each group model starts at w0 +
    the mean Δw of its sampled members. Then each round is FedAvg within groups plus
    the inter-group step η_g. A client whose pre-training upload is rejected is left
    out of the sampling, the SVD and the K-means and joins the group nearest a zero
    update (``protocol``'s rejected-upload rule).

    Attributes
    ----------
    labels_ : ndarray of shape (n_devices,)
    pretrained_ : ndarray of int
        Clients sampled for grouping (the others joined as newcomers).
    cosines_ : ndarray of shape (n_devices, K)
        M for every client.
    """

    name = "fedgroup"
    hyperparameters = (
        Param("K", 5, "number of groups (the thesis' upper bound for fixed-k baselines, §3.3.4)", symbol="K",
              kind=int, gt=0),
        Param("alpha", 20, "pre-training scale: α·K clients (at most all) are sampled for grouping", symbol="α",
              kind=int, gt=0),
        Param("eta_g", 0.0, "inter-group learning rate (0: groups train independently)", symbol="η_g", kind=float,
              ge=0.0),
        Param("pretrain_epochs", None, "local epochs of pre-training (null: the engine's)", kind=int, gt=0,
              optional=True),
    )
    K: int
    alpha: int
    eta_g: float
    pretrain_epochs: int | None

    def init(self, engine: Engine, ctx: Context) -> FedGroupState:
        n = engine.n_devices
        K = min(self.K, n)
        w0 = engine.init_params(1, ctx.generator, distinct=False)
        everyone = np.arange(n)
        zeros = np.zeros(n, dtype=np.int64)
        # Pre-training and the newcomers' cold start need the same thing: each client's Δw from w0.
        trained = engine.local_models(w0, zeros, everyone, ctx.generator, local_epochs=self.pretrain_epochs).params
        delta, ok = updates(engine, w0, zeros, trained)
        delta = delta.double().cpu().numpy()
        pool = np.flatnonzero(ok)
        sampled = np.sort(ctx.rng.choice(pool, size=min(self.alpha * K, len(pool)), replace=False))
        K = min(K, len(sampled))
        directions = decomposed_directions(delta[sampled], K)
        cosines = decomposed_cosines(delta, directions)
        labels = np.zeros(n, dtype=np.int64)
        labels[sampled], centroids = group_clients(cosines[sampled], K, int(ctx.rng.integers(2**31)))
        rest = np.setdiff1d(everyone, sampled)
        if len(rest):
            labels[rest] = nearest_group(cosines[rest], centroids)
        return FedGroupState(labels, _group_models(w0, delta, sampled, labels, K), sampled, cosines)

    def initial_round(self, engine, state):
        traffic = pair_traffic(take(state.groups, [0]), engine.n_devices)
        return traffic["bytes_down"], traffic["bytes_up"]

    def configure_round(self, engine, state, participants, ctx):
        plan = RoundPlan(state.groups, state.labels[participants], participants,
                         **pair_traffic(state.groups, len(participants)))
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, groups=inter_group(plan.params, trained, self.eta_g))

    def clustering(self, state: FedGroupState) -> Clustering:
        return labels_clustering(state.labels, state.groups)

    def fitted(self, engine, state):
        self.labels_, self.pretrained_, self.cosines_ = state.labels, state.pretrained, state.cosines


def _group_models(w0: StackedParams, delta: np.ndarray, sampled: np.ndarray, labels: np.ndarray, K: int):
    """Each group starts at w0 + the mean pre-training update of its sampled members."""
    offsets = []
    for g in range(K):
        members = sampled[labels[sampled] == g]
        offsets.append(delta[members].mean(0) if len(members) else np.zeros(delta.shape[1]))
    base = flat(w0)
    start = base + torch.as_tensor(np.stack(offsets), dtype=base.dtype, device=base.device)
    out, at = {}, 0
    for k, v in w0.items():
        size = v[0].numel()
        out[k] = start[:, at : at + size].reshape(K, *v.shape[1:]).contiguous()
        at += size
    return out


def inter_group(old: StackedParams, new: StackedParams, eta_g: float) -> StackedParams:
    """w_g ← w_g + η_g · mean_{h≠g} Δw_h, Δw_h the round's update of group h."""
    K = next(iter(old.values())).shape[0]
    if eta_g == 0.0 or K < 2:
        return new
    out = {}
    for k in new:
        d = new[k] - old[k]
        out[k] = new[k] + eta_g * (d.sum(0, keepdim=True) - d) / (K - 1)
    return out
