"""FL+HC: FedAvg, then one hierarchical clustering of the clients' local updates
(Briggs, Fan and Andras, §III).

After n rounds of FedAvg every client trains the global model locally and sends
its update Δθ; the server clusters the updates agglomeratively, merging while the
linkage distance is ≤ d, and each cluster continues with its own FedAvg, starting
from the global model.

References
----------
C. Briggs, Z. Fan and P. Andras, "Federated learning with hierarchical clustering of
local updates to improve training on non-IID data", IJCNN 2020.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.cluster import hierarchy

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import labels_clustering, relabel, updates
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register

LINKAGES: tuple[str, ...] = ("ward", "single", "average", "complete")
METRICS: tuple[str, ...] = ("euclidean", "cosine")


def update_clusters(delta: np.ndarray, d: float, linkage: str = "ward", metric: str = "euclidean") -> np.ndarray:
    """§III-B: agglomerative clustering of the flattened updates ``[n, p]``, cut at
    distance threshold d. Labels by first appearance.

    ``metric`` is the distance between two updates: ``euclidean`` (scale-dependent:
    d moves with lr, local steps and model) or ``cosine`` (1 − cos, in [0, 2] whatever
    the scale). Ward's linkage is defined for Euclidean distances only.
    """
    if linkage not in LINKAGES:
        raise ValueError(f"linkage must be one of {LINKAGES}, got {linkage!r}")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    if linkage == "ward" and metric != "euclidean":
        raise ValueError(f"linkage 'ward' needs metric 'euclidean', got {metric!r}")
    if not d >= 0.0:
        raise ValueError(f"distance threshold d must be ≥ 0, got {d}")
    delta = np.asarray(delta, dtype=np.float64)
    if len(delta) == 1:
        return np.zeros(1, dtype=np.int64)
    z = hierarchy.linkage(delta, method=linkage, metric=metric)
    return relabel(hierarchy.fcluster(z, t=d, criterion="distance"))


@dataclass(frozen=True)
class FLHCState:
    labels: np.ndarray
    clustering: Clustering
    t: int = 0  # rounds done
    updates: np.ndarray | None = None  # the updates clustered


@register
class FLHC(ColdStart[FLHCState]):
    """FL+HC (Briggs et al., IJCNN 2020, §III): ``cluster_round`` rounds of FedAvg,
    one clustering round in which every client trains the global model and sends
    its update, then ``rounds`` rounds of FedAvg inside each cluster, every cluster
    starting from the global model. A client whose clustering-round upload is
    rejected forms a cluster of its own (``protocol``'s rejected-upload rule).

    Attributes
    ----------
    labels_ : ndarray of shape (n_devices,)
    updates_ : ndarray of shape (n_devices, p)
        The updates clustered (re-read d off their linkage for new settings).
    """

    name = "flhc"
    hyperparameters = (
        Param("d", 1.0, "distance threshold of the hierarchical clustering of updates (FLACC Table I: 0.5, 0.75, "
              "1.0); under metric euclidean it scales with lr, local steps and model",
              symbol="d", kind=float, ge=0.0),
        Param("linkage", "ward", "linkage of the clustering (the paper's best: Ward)", kind=str, choices=LINKAGES),
        Param("metric", "euclidean", "distance between two updates: euclidean (the paper's with Ward) or cosine "
              "(1 − cos, scale-free; needs a linkage other than ward)", kind=str, choices=METRICS),
        Param("cluster_round", 10, "FedAvg rounds before the clustering round", symbol="n", kind=int, ge=0),
        Param("cluster_epochs", None, "local epochs of the clustering round (null: the engine's)", kind=int, gt=0,
              optional=True),
    )
    d: float
    linkage: str
    metric: str
    cluster_round: int
    cluster_epochs: int | None

    def __init__(self, **values) -> None:
        super().__init__(**values)
        if self.linkage == "ward" and self.metric != "euclidean":
            raise ValueError(f"flhc: linkage 'ward' needs metric 'euclidean', got metric {self.metric!r}")

    def init(self, engine: Engine, ctx: Context) -> FLHCState:
        labels = np.zeros(engine.n_devices, dtype=np.int64)
        return FLHCState(labels, labels_clustering(labels, engine.init_params(1, ctx.generator, distinct=False)))

    def expected_rounds(self, n_devices: int) -> int:
        return self.cluster_round + 1 + self.rounds

    def finished(self, state, rounds_done):
        return rounds_done >= self.expected_rounds(0)

    def configure_round(self, engine, state, participants, ctx):
        params = state.clustering.params
        if state.t == self.cluster_round:  # the clustering round: every client sends its update
            everyone = np.arange(engine.n_devices)
            plan = RoundPlan(params, state.labels, everyone, upload="each", local_epochs=self.cluster_epochs,
                             phase="clustering", **pair_traffic(params, len(everyone)))
            return state, plan
        phase = "training" if state.t > self.cluster_round else "clustering"  # FedAvg before HC
        plan = RoundPlan(params, state.labels[participants], participants, phase=phase,
                         **pair_traffic(params, len(participants)))
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        if plan.upload == "average":
            return replace(state, clustering=state.clustering.with_params(trained), t=state.t + 1)
        delta, ok = updates(engine, plan.params, plan.models, trained)
        delta = delta.double().cpu().numpy()
        labels = np.full(engine.n_devices, -1, dtype=np.int64)  # plan: the accepted uploads only
        labels[plan.devices[ok]] = update_clusters(delta[ok], self.d, self.linkage, self.metric) if ok.any() else []
        alone = np.flatnonzero(labels < 0)  # rejected or diverged: a cluster of its own
        labels[alone] = labels.max() + 1 + np.arange(len(alone))
        labels = relabel(labels)
        theta = plan.params  # every cluster starts from the global model
        clustering = labels_clustering(labels, take(theta, [0] * (int(labels.max()) + 1)))
        return FLHCState(labels, clustering, state.t + 1, delta)

    def clustering(self, state: FLHCState) -> Clustering:
        return state.clustering

    def fitted(self, engine, state):
        self.labels_, self.updates_ = state.labels, state.updates
