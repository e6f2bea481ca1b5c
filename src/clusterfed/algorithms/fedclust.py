"""FedClust: one-shot client clustering by the weights of locally trained final layers.

Each step is a pure function over plain arrays or one batched engine call:
``local_final_layers`` (Alg. 1 lines 3–4, Alg. 2 lines 1–3), ``proximity_matrix``
(Eq. 3), ``hierarchical_clusters`` (HC(𝓜, λ), Alg. 1 line 5) and ``nearest_cluster``
(Alg. 2 line 4, Eq. 4); ``FedClust`` runs them and then per-cluster FedAvg.

References
----------
M. S. Islam, S. Javaherian, F. Xu, X. Yuan, L. Chen and N.-F. Tzeng, "FedClust:
Tackling Data Heterogeneity in Federated Learning through Weight-Driven Client
Clustering", 2024.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.cluster import hierarchy
from scipy.spatial.distance import cdist, pdist, squareform

from clusterfed.algorithms.base import generators, model_bytes, pair_traffic
from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams, TrainingConfig
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register

LINKAGES: tuple[str, ...] = ("single", "average", "complete")


def final_layer_keys(params: StackedParams) -> tuple[str, ...]:
    """Keys of the final layer's weight and bias (§4.1 uses both): the last matrix
    weight of the stack (``[M, out, in]``, a Linear layer) and its bias if it has one."""
    weights = [k for k, v in params.items() if k.endswith("weight") and v.dim() == 3]
    if not weights:
        raise ValueError(f"no Linear weight among the parameters {list(params)}")
    weight = weights[-1]
    bias = weight[: -len("weight")] + "bias"
    return (weight, bias) if bias in params else (weight,)


def final_layers(params: StackedParams) -> np.ndarray:
    """θ̂ of every model of the stack: its final layer flattened, ``[M, p]`` float64."""
    return np.concatenate(
        [params[k].detach().flatten(1).cpu().double().numpy() for k in final_layer_keys(params)],
        axis=1,
    )


def local_final_layers(
    engine: Engine,
    theta0: StackedParams,
    generator: torch.Generator,
    *,
    local_epochs: int,
    training: TrainingConfig,
) -> np.ndarray:
    """Alg. 1 lines 3–4 (Alg. 2 lines 1–3 for newcomers): every device of ``engine``
    trains the single model θ⁰ on its own training data for ``local_epochs`` local epochs
    of ``training``'s SGD — all devices in one batched call — and uploads only the
    final layer θ̂_d of its *own* trained model (not an average). Returns ``[n, p]``;
    the row of a device whose training diverged is NaN."""
    n = engine.n_devices
    theta0 = {k: v.to(engine.device) for k, v in theta0.items()}
    uploads = engine.local_models(
        theta0, np.zeros(n, dtype=np.int64), np.arange(n), generator, local_epochs=local_epochs, training=training
    )
    theta_hat = final_layers(uploads.params)
    theta_hat[uploads.rejected] = np.nan
    return theta_hat


def proximity_matrix(theta_hat: np.ndarray) -> np.ndarray:
    """Eq. 3: 𝓜_pq = ‖θ̂_p − θ̂_q‖₂ for all pairs of rows, ``[n, n]``."""
    return squareform(pdist(np.asarray(theta_hat, dtype=np.float64), metric="euclidean"))


def hierarchical_clusters(theta_hat: np.ndarray, lam: float, linkage: str) -> np.ndarray:
    """HC(𝓜, λ) of Alg. 1 line 5: agglomerative clustering of the rows of ``theta_hat``
    under Euclidean distance, merging the two closest clusters while their ``linkage``
    distance is ≤ λ. Returns a label per row, numbered by first appearance (row 0 is
    in cluster 0).

    Rows that are not finite (diverged devices) cannot be compared; each forms a
    cluster of its own.
    """
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
    if not lam >= 0.0:
        raise ValueError(f"λ must be a distance ≥ 0, got {lam}")
    theta_hat = np.asarray(theta_hat, dtype=np.float64)
    n = len(theta_hat)
    finite = np.isfinite(theta_hat).all(axis=1)
    raw = np.arange(n, dtype=np.int64) + n  # diverged rows: distinct labels after the rest
    if finite.sum() >= 2:
        z = hierarchy.linkage(theta_hat[finite], method=linkage, metric="euclidean")
        # single/average/complete are monotone, so the merge heights never decrease and
        # cutting at λ keeps exactly the merges at distance ≤ λ.
        raw[finite] = hierarchy.fcluster(z, t=lam, criterion="distance")
    elif finite.sum() == 1:
        raw[finite] = 0
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse].astype(np.int64)


def nearest_cluster(
    theta_hat_new: np.ndarray, theta_hat: np.ndarray, labels: np.ndarray, linkage: str
) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 2 line 4 (Eq. 4): each newcomer joins the cluster at minimum distance.

    The distance from a newcomer to cluster g is the ``linkage`` distance between the
    singleton {newcomer} and g's members, measured on the members' stored θ̂ from
    round 0 — the distance HC would have used to merge the newcomer into g: the
    minimum (single), mean (average) or maximum (complete) of its Euclidean
    distances to the members. Ties go to the lowest label; a newcomer whose θ̂ is not
    finite joins the largest cluster. Returns (label, distance) per newcomer.
    """
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
    labels = np.asarray(labels, dtype=np.int64)
    theta_hat = np.asarray(theta_hat, dtype=np.float64)
    theta_hat_new = np.atleast_2d(np.asarray(theta_hat_new, dtype=np.float64))
    reduce = {"single": np.nanmin, "average": np.nanmean, "complete": np.nanmax}[linkage]
    d = cdist(theta_hat_new, theta_hat)  # [new, members]; NaN for diverged rows
    k = int(labels.max()) + 1
    with warnings.catch_warnings():  # all-NaN columns (diverged members) warn
        warnings.simplefilter("ignore", RuntimeWarning)
        to_cluster = np.stack([reduce(d[:, labels == g], axis=1) for g in range(k)], axis=1)
    to_cluster = np.where(np.isnan(to_cluster), np.inf, to_cluster)
    rows = to_cluster.argmin(axis=1)
    lost = ~np.isfinite(to_cluster).any(axis=1)
    rows[lost] = np.bincount(labels, minlength=k).argmax()
    return rows.astype(np.int64), to_cluster[np.arange(len(rows)), rows]


@dataclass(frozen=True)
class FedClustState:
    """θ⁰, the θ̂ uploaded in round 0, the cluster of each device, the clustering."""

    theta0: StackedParams
    theta_hat: np.ndarray
    labels: np.ndarray
    clustering: Clustering


@register
class FedClust(ColdStart[FedClustState]):
    """FedClust: one-shot clustering by final-layer weights, then FedAvg per cluster
    (Islam et al., 2024, §4, Alg. 1 and Alg. 2).

    Round 0 broadcasts one random θ⁰; every device trains it for ``init_epochs`` local
    epochs and uploads only its final layer θ̂ (weight and bias, §4.1). The server
    builds 𝓜 (Eq. 3) and cuts the agglomerative hierarchy at λ; every cluster model
    starts from θ⁰. Each later round, a random R share of all devices trains its
    cluster's model for the engine's ``TrainingConfig.local_epochs`` and each cluster
    model becomes the |Z^train|-weighted average of its participants (clusters
    without participants keep their model). The paper's T is 200 rounds and R 10%
    (§5.1).

    λ is a Euclidean distance between *un-normalised* final layers, so it scales with
    the local SGD (lr × steps) and the model; the paper tunes it per dataset (Fig. 4).
    The default lies in the gap between within-group and between-group distances of
    𝓜 measured for the MLP at 10 initial epochs on S1/S2 (seeds 10, 55, 2077): digits
    at lr 0.05 (10–20 devices), within ≤ 1.13, between ≥ 1.31; MNIST at lr 0.01 (20
    devices), within ≤ 0.72, between ≥ 2.37. Any linkage recovers the groups there;
    at another lr or ``init_epochs``, re-read λ off ``distance_``. The paper names
    all three linkages but not the one it used; average is PACFL's, whose HC FedClust
    follows.

    Attributes
    ----------
    init_params_ : dict of str to Tensor
        θ⁰, the shared initial model (one row).
    final_layers_ : ndarray of shape (n_devices, p)
        θ̂ uploaded by each device in round 0.
    distance_ : ndarray of shape (n_devices, n_devices)
        The proximity matrix 𝓜.
    labels_ : ndarray of shape (n_devices,)
        Cluster of each device (= its row of ``result_.params``).
    training_ : TrainingConfig
        The local SGD of round 0, reused for newcomers.
    result_ : ColdStartResult
    """

    name = "fedclust"
    hyperparameters = (
        Param("lam", 1.25, "Euclidean linkage distance of final-layer weights below which clusters merge",
              symbol="λ", ge=0.0),
        Param("linkage", "average", "linkage criterion of the hierarchical clustering", kind=str, choices=LINKAGES),
        Param("init_epochs", 10, "local epochs of round 0's training of θ⁰ (§5.1)", kind=int, gt=0),
    )
    lam: float
    linkage: str
    init_epochs: int

    def init(self, engine: Engine, ctx: Context) -> FedClustState:
        theta0 = engine.init_params(1, ctx.generator, distinct=False)
        theta_hat = local_final_layers(
            engine, theta0, ctx.generator, local_epochs=self.init_epochs, training=engine.training
        )
        labels = hierarchical_clusters(theta_hat, self.lam, self.linkage)
        k = int(labels.max()) + 1
        clusters = tuple(
            Cluster(id=g, devices=frozenset(np.flatnonzero(labels == g).tolist())) for g in range(k)
        )
        clustering = Clustering(clusters, take(theta0, [0] * k))  # θ⁰_{s,m} ← θ⁰_s
        return FedClustState(theta0, theta_hat, labels, clustering)

    def initial_round(self, engine: Engine, state: FedClustState) -> tuple[int, int]:
        """Round 0: θ⁰ down to every device, its final layer θ̂ back."""
        n, theta0 = engine.n_devices, state.theta0
        final_bytes = sum(theta0[k][0].numel() * theta0[k].element_size() for k in final_layer_keys(theta0))
        return n * model_bytes(theta0), n * final_bytes

    def configure_round(self, engine, state, participants, ctx):
        params = state.clustering.params
        plan = RoundPlan(params, state.labels[participants], participants, **pair_traffic(params, len(participants)))
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, clustering=state.clustering.with_params(trained))

    def clustering(self, state: FedClustState) -> Clustering:
        return state.clustering

    def fitted(self, engine: Engine, state: FedClustState) -> None:
        self.init_params_ = state.theta0
        self.final_layers_ = state.theta_hat
        self.distance_ = proximity_matrix(state.theta_hat)
        self.labels_ = state.labels
        self.training_ = engine.training

    def assign_newcomers(self, engine: Engine, *, seed: int) -> np.ndarray:
        """Alg. 2: the row of ``result_.params`` serving each device of ``engine``, a
        federation of newcomers that joined after the federation.

        Each newcomer trains θ⁰ as the devices of round 0 did (``init_epochs`` epochs
        of the fitted engine's SGD, all newcomers in one batched call), uploads θ̂ and
        joins the cluster at minimum ``linkage`` distance from it (``nearest_cluster``).
        The server keeps no trained cluster model for this: ``θ̂_g`` of Eq. 4 is read as
        the round-0 θ̂ of g's members, since a cluster model after T rounds lies far
        from any few-epoch local model and would not be comparable.
        """
        if not hasattr(self, "result_"):
            raise RuntimeError("call fit before assign_newcomers")
        theta0 = self.init_params_
        if engine.param_shapes() != {k: tuple(v.shape[1:]) for k, v in theta0.items()}:
            raise ValueError("the newcomers' engine has another architecture than the fitted one")
        _, gen = generators(seed)
        theta_hat_new = local_final_layers(
            engine, theta0, gen, local_epochs=self.init_epochs, training=self.training_
        )
        rows, _ = nearest_cluster(theta_hat_new, self.final_layers_, self.labels_, self.linkage)
        return rows

