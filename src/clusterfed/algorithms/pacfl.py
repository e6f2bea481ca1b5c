"""PACFL: clustering clients once by the principal angles between their data
subspaces (Vahidian et al., Alg. 1).

Before any training each client sends p left singular vectors of its data matrix
(a truncated SVD: no model, no label leaves the device); the server measures the
smallest principal angle between every pair of subspaces, clusters by
hierarchical clustering with threshold β, and runs FedAvg in each cluster.

Pure steps: ``data_basis``, ``principal_angles``, ``proximity_matrix`` and
``angle_clusters``; ``PACFL`` runs them, then per-cluster FedAvg.

References
----------
S. Vahidian, M. Morafah, W. Wang, V. Kungurtsev, C. Chen, M. Shah and B. Lin,
"Efficient Distribution Similarity Identification in Clustered Federated Learning
via Principal Angles Between Client Data Subspaces", AAAI 2023.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import labels_clustering, relabel
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register

LINKAGES: tuple[str, ...] = ("single", "average", "complete")


def data_basis(x: np.ndarray, p: int) -> np.ndarray:
    """U_p of §4: the first p left singular vectors of the client's data matrix
    D = [x_1 … x_N] (features × samples), ``[features, min(p, N)]`` orthonormal. Data
    with NaN or ±inf has no SVD: such a client sends a NaN basis (the server rejects it)."""
    d = np.asarray(x, dtype=np.float64).reshape(len(x), -1).T
    if not np.isfinite(d).all():
        return np.full((d.shape[0], min(p, d.shape[1])), np.nan)
    u, _, _ = np.linalg.svd(d, full_matrices=False)
    return u[:, :p]


def principal_angles(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Principal angles between span(u1) and span(u2) in degrees, ascending:
    θ_k = arccos σ_k(Q1ᵀ Q2) with Q the orthonormalised bases (Björck & Golub)."""
    q1, _ = np.linalg.qr(np.asarray(u1, dtype=np.float64))
    q2, _ = np.linalg.qr(np.asarray(u2, dtype=np.float64))
    sigma = np.linalg.svd(q1.T @ q2, compute_uv=False)
    return np.sort(np.degrees(np.arccos(np.clip(sigma, -1.0, 1.0))))


def proximity_matrix(bases: list[np.ndarray]) -> np.ndarray:
    """A_ij = Θ_1(U_i, U_j), the smallest principal angle in degrees (eq. 2), ``[K, K]``.
    A rejected (non-finite) basis is 90° from every other, so its client stays alone."""
    k = len(bases)
    ok = [bool(np.isfinite(b).all()) for b in bases]
    a = np.zeros((k, k))
    for i in range(k):
        for j in range(i + 1, k):
            a[i, j] = a[j, i] = principal_angles(bases[i], bases[j])[0] if ok[i] and ok[j] else 90.0
    return a


def angle_clusters(a: np.ndarray, beta: float, linkage: str = "average") -> np.ndarray:
    """HC(A, β) of Alg. 1: agglomerative clustering of the clients under distances A,
    merging while the ``linkage`` distance is ≤ β (the authors: average, β = 4.9°).
    Labels numbered by first appearance."""
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
    if not beta >= 0.0:
        raise ValueError(f"β must be an angle ≥ 0, got {beta}")
    if len(a) == 1:
        return np.zeros(1, dtype=np.int64)
    z = hierarchy.linkage(squareform(np.asarray(a, dtype=np.float64), checks=False), method=linkage)
    return relabel(hierarchy.fcluster(z, t=beta, criterion="distance"))


def _screened(engine: Engine, bases: list[np.ndarray]) -> list[np.ndarray]:
    """The clients' bases through the engine's screening (each is an upload): a
    rejected one comes back NaN. Rows are flattened and zero-padded to one length."""
    width = max(b.size for b in bases)
    rows = np.stack([np.pad(b.ravel(), (0, width - b.size)) for b in bases])
    screened = engine.screen({"basis": torch.as_tensor(rows)}, np.arange(len(bases))).params["basis"].cpu().numpy()
    return [b if np.isfinite(row).all() else np.full_like(b, np.nan) for b, row in zip(bases, screened)]


@dataclass(frozen=True)
class PACFLState:
    labels: np.ndarray
    clustering: Clustering
    bases: list
    angles: np.ndarray


@register
class PACFL(ColdStart[PACFLState]):
    """PACFL (Vahidian et al., AAAI 2023, Alg. 1): one-shot clustering by principal
    angles of the clients' data subspaces before training (each client uploads its
    p singular vectors, no model), then FedAvg per cluster, every cluster model
    starting from one θ.

    Attributes
    ----------
    bases_ : list of ndarray
        U_p of each client.
    angles_ : ndarray of shape (n_devices, n_devices)
        The proximity matrix A in degrees.
    labels_ : ndarray of shape (n_devices,)
    """

    name = "pacfl"
    hyperparameters = (
        Param("p", 3, "singular vectors each client sends (the paper: 3-5)", symbol="p", kind=int, gt=0),
        Param("beta", 4.9, "threshold in degrees of the hierarchical clustering (the authors' code)",
              symbol="β", kind=float, ge=0.0),
        Param("linkage", "average", "linkage of the hierarchical clustering (the authors': average)",
              kind=str, choices=LINKAGES),
    )
    p: int
    beta: float
    linkage: str

    def init(self, engine: Engine, ctx: Context) -> PACFLState:
        x = [engine.samples("train", d)[0] for d in range(engine.n_devices)]
        bases = _screened(engine, [data_basis(xd.reshape(len(xd), -1), self.p) for xd in x])
        angles = proximity_matrix(bases)
        labels = angle_clusters(angles, self.beta, self.linkage)
        theta = engine.init_params(1, ctx.generator, distinct=False)
        clustering = labels_clustering(labels, take(theta, [0] * (int(labels.max()) + 1)))
        return PACFLState(labels, clustering, bases, angles)

    def initial_round(self, engine, state):
        return 0, sum(b.size for b in state.bases) * 4  # float32 on the wire, nothing down

    def configure_round(self, engine, state, participants, ctx):
        params = state.clustering.params
        return state, RoundPlan(params, state.labels[participants], participants, **pair_traffic(params, len(participants)))

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, clustering=state.clustering.with_params(trained))

    def clustering(self, state: PACFLState) -> Clustering:
        return state.clustering

    def fitted(self, engine, state):
        self.bases_, self.angles_, self.labels_ = state.bases, state.angles, state.labels
