"""FeSEM: federated stochastic expectation maximisation over K model centres
(Long et al., §4, Alg. 1).

Each round every participant trains the centre of its cluster; the E-step assigns
each local model to the nearest centre by L2 distance and the M-step sets every
centre to the average of the local models assigned to it.

Pure steps: ``e_step`` (eq. 8) and ``seed_centres`` (the initial centres).

The thesis' baseline runs call the FeSEM of the FlexCFL code base
(``flearn/trainer/fesem.py`` over ``flearn/group.py``), which differs from the paper in
three places, each an option here:

- ``assignment="previous"``: each sampled client joins, *before* training, the centre
  nearest the local model it trained the last time it took part (``client.local_soln``;
  the shared initial θ until then), and trains that centre (the centres start as K
  random models, as there);
- ``m_step="first"``: FlexCFL's FeSEM aggregates with its ``avg`` strategy, which passes
  a single weight (``[1.0 * len(nks)]``) to a weighted sum that zips it with the
  updates, so only the first sampled client's update moves its group's model: the
  centre becomes that one client's local model;
- ``serve="received"``: a client is tested on the centre model it was last sent
  (``latest_params``), not on its centre's current model.

References
----------
G. Long, M. Xie, T. Shen, T. Zhou, X. Wang and J. Jiang, "Multi-center federated
learning: clients clustering for better personalization", World Wide Web 26, 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import average, flat, labels_clustering, per_device, replace_rows
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import is_finite, take
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def e_step(local: torch.Tensor, centres: torch.Tensor) -> np.ndarray:
    """Eq. 8: r_i = argmin_k ‖w_i − w̃_k‖² for flat local models ``[n, p]`` and
    centres ``[K, p]`` (ties to the lowest k)."""
    return torch.cdist(local.double(), centres.double()).argmin(1).cpu().numpy().astype(np.int64)


def seed_centres(local: torch.Tensor, K: int, keys: np.ndarray) -> np.ndarray:
    """Indices of K local models taken as initial centres by k-means++ seeding
    (the first uniformly, each next with probability ∝ squared distance to the
    nearest chosen one). The paper initialises the centres at random; seeding them
    on the clients' first local models is the k-means convention FeSEM follows.

    Draw j takes argmin_i keys[j, i] / w_i over i.i.d. Exp(1) ``keys`` of shape
    ``[≥K, n]`` (the exponential race: i wins with probability w_i / Σw exactly).
    The keys belong to clients, not to positions, so leaving out a client that is
    not picked — a rejected upload (``protocol``'s rule) — picks the same centres;
    with one random draw over the survivors, one client fewer reshuffles them all."""
    n = len(local)
    if not 1 <= K <= n:
        raise ValueError(f"K must be in [1, {n}] (the number of clients), got {K}")
    if keys.ndim != 2 or keys.shape[0] < K or keys.shape[1] != n:
        raise ValueError(f"keys must have shape [>= {K}, {n}], got {tuple(keys.shape)}")
    x = local.double()
    chosen: list[int] = []
    for j in range(K):
        w = np.ones(n)
        if chosen:
            d2 = torch.cdist(x, x[chosen]).min(1).values.pow(2).cpu().numpy()
            if d2.sum() > 0:
                w = d2
            w[chosen] = 0.0
        with np.errstate(divide="ignore"):
            chosen.append(int(np.argmin(np.where(w > 0, keys[j] / w, np.inf))))
    return np.asarray(chosen, dtype=np.int64)


@dataclass(frozen=True)
class FeSEMState:
    labels: np.ndarray  # centre of each client
    centres: StackedParams  # before the first round: the shared θ (one row)
    seeded: bool = False
    held: StackedParams | None = None  # assignment "previous": each client's last trained local model (θ before)
    sent: StackedParams | None = None  # serve "received": the centre each client was last sent (θ before)


@register
class FeSEM(ColdStart[FeSEMState]):
    """FeSEM (Long et al., 2023, Alg. 1) with a fixed number K of clusters.

    The first round trains one shared θ on the participants and takes the K centres
    either seeded on their local models (``centres="kmeans++"``, ``seed_centres``) or,
    as the paper's Alg. 1 initialises them, as K independent random models
    (``centres="random"``: the local models are then assigned to whichever random
    centre happens to lie nearest); each round then trains every
    participant from its centre, assigns it to the nearest centre (``e_step``) and
    averages (M-step, |D|-weighted; a centre no participant joined is kept).
    Clients that have not taken part yet are served centre 0; a rejected upload is a
    round not taken part in (``protocol``'s rejected-upload rule): the seeding and the
    E-step run over the accepted uploads only and the client keeps its centre.

    FlexCFL's FeSEM, which the thesis' Tables 3.3–3.6 ran, is ``centres="random"``,
    ``assignment="previous"``, ``m_step="first"`` and ``serve="received"`` (module
    docstring). ``previous`` starts from one shared θ held by every client and K random
    centres (drawn after θ from the same generator), assigns each participant by
    ``e_step`` on the model it holds before it trains, and keeps every client's last
    local model (n × |θ| floats); ``received`` keeps every client's last sent model
    (n × |θ| floats) and serves each device its own.

    Attributes
    ----------
    labels_ : ndarray of shape (n_devices,)
        Centre of each client after its last E-step.
    """

    name = "fesem"
    hyperparameters = (
        Param("K", 5, "number of centres (the thesis' upper bound for fixed-k baselines, §3.3.4)", symbol="K",
              kind=int, gt=0),
        Param("centres", "kmeans++", "initial centres: k-means++ on the first local models, or K random models "
              "(the paper's Alg. 1)", kind=str, choices=("kmeans++", "random")),
        Param("assignment", "local", "when a client is assigned: E-step on the local models it trains this round "
              "(the paper), or before training by the local model it trained the last time it took part "
              "(previous: FlexCFL's code, the thesis' runs)", kind=str, choices=("local", "previous")),
        Param("m_step", "average", "a centre becomes the |D|-weighted average of its participants' local models "
              "(the paper), or one of them drawn at random (first: FlexCFL's 'avg' aggregation keeps only the "
              "first client's update)", kind=str, choices=("average", "first")),
        Param("serve", "centre", "model a client is served: its centre's current model, or the centre it was last "
              "sent (received: FlexCFL's test of latest_params)", kind=str, choices=("centre", "received")),
    )
    K: int
    centres: str
    assignment: str
    m_step: str
    serve: str

    def __init__(self, **values) -> None:
        super().__init__(**values)
        if self.assignment == "previous" and self.centres != "random":
            raise ValueError("fesem: assignment 'previous' needs centres 'random' (nothing is trained before "
                             f"the first assignment to seed k-means++ on), got centres {self.centres!r}")

    def init(self, engine: Engine, ctx: Context) -> FeSEMState:
        theta = engine.init_params(1, ctx.generator, distinct=False)
        labels = np.zeros(engine.n_devices, dtype=np.int64)
        everyone = take(theta, [0] * engine.n_devices)
        sent = everyone if self.serve == "received" else None
        if self.assignment == "local":
            return FeSEMState(labels, theta, sent=sent)
        centres = engine.init_params(self.K, ctx.generator, distinct=True)
        return FeSEMState(labels, centres, True, everyone, sent)

    def configure_round(self, engine, state, participants, ctx):
        labels, sent = state.labels, state.sent
        if state.held is not None:  # assigned before training, by what each participant holds
            labels = labels.copy()
            labels[participants] = e_step(flat(take(state.held, participants.tolist())), flat(state.centres))
        if sent is not None:
            sent = replace_rows(sent, participants, take(state.centres, labels[participants].tolist()),
                                np.ones(len(participants), dtype=bool))
        state = FeSEMState(labels, state.centres, state.seeded, state.held, sent)
        plan = RoundPlan(state.centres, labels[participants], participants, upload="each",
                         **pair_traffic(state.centres, len(participants)))
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        ok = is_finite(trained).cpu().numpy()
        centres = state.centres
        if state.held is not None:  # assigned before training: the M-step only
            held = replace_rows(state.held, plan.devices, trained, ok)
            centres = self._m_step(engine, trained, plan.models, plan.devices, ok, centres, ctx)
            return FeSEMState(state.labels, centres, True, held, state.sent)
        finite = np.flatnonzero(ok)
        if not state.seeded:
            if len(finite) == 0:
                return state
            if self.centres == "random":
                centres = engine.init_params(self.K, ctx.generator, distinct=True)
            else:
                local = flat(take(trained, finite.tolist()))
                keys = ctx.rng.exponential(size=(self.K, engine.n_devices))[:, plan.devices[finite]]
                centres = take(trained, finite[seed_centres(local, min(self.K, len(finite)), keys)].tolist())
        assigned = np.zeros(len(plan.devices), dtype=np.int64)
        if len(finite):
            assigned[finite] = e_step(flat(take(trained, finite.tolist())), flat(centres))
        centres = self._m_step(engine, trained, assigned, plan.devices, ok, centres, ctx)
        labels = state.labels.copy()
        labels[plan.devices[ok]] = assigned[ok]
        return FeSEMState(labels, centres, True, None, state.sent)

    def _m_step(self, engine, trained, model_of_pair, device_of_pair, ok, centres, ctx) -> StackedParams:
        """Each centre with finite pairs becomes their |D|-weighted average, or under
        ``m_step="first"`` the local model of one of them drawn at random."""
        if self.m_step == "average":
            return average(engine, trained, model_of_pair, device_of_pair, ok, centres)
        joined = sorted(set(np.asarray(model_of_pair)[ok].tolist()))
        picks = [int(ctx.rng.choice(np.flatnonzero(ok & (model_of_pair == k)))) for k in joined]
        return replace_rows(centres, np.array(joined), take(trained, picks), np.ones(len(joined), dtype=bool))

    def clustering(self, state: FeSEMState) -> Clustering:
        if state.sent is not None:
            return per_device(state.sent)
        return labels_clustering(state.labels, state.centres)

    def fitted(self, engine, state):
        self.labels_ = state.labels
