"""FedSoft: soft clustered FL with proximal local updates (Ruan & Joe-Wong, Alg. 1).

A client's data may mix several distributions, so each client k estimates how much
of its data each of S cluster models fits best — its importance weights u_ks — and
trains one local model w_k on F_k(w) + μ/2 Σ_s u_ks ‖w − c_s‖². Every cluster model
c_s becomes the average of the local models weighted by v_sk ∝ u_ks n_k.

Pure steps: ``importance_weights`` (eq. 4 with smoothing σ), ``aggregation_weights``
(v_sk) and ``soft_penalty`` (the sum of proximal terms as one quadratic).

FedSoft trains "both locally personalized models and high-quality cluster models"
(abstract): ``serve`` picks which a device is evaluated and registered with — the
cluster model of its largest u_ks, the cluster model with the fewest errors on its
validation data (it downloads all S models every round anyway; the authors' validator,
ycruan/FedSoft ``validators.py``, scores every cluster model on every test
distribution), or its own local model w_k. ``start`` picks where a
local update starts: the centre m_k of the cluster models (the default here), or
the device's own last local model w_k, which in the authors' code (ycruan/FedSoft,
``Client``) is created once and never reloaded from the clusters. ``K`` picks how a
cluster model is aggregated: from every participant weighted by v_sk (K = 0, the
default here), or, as Alg. 1 selects, from K clients drawn ∝ v_sk without
replacement and averaged uniformly (``select_clients``; the authors' server draws
with ``numpy.random.choice(replace=False)`` and trains only the union of the draws).

References
----------
Y. Ruan and C. Joe-Wong, "FedSoft: Soft Clustered Federated Learning with Proximal
Local Updating", AAAI 2022.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from clusterfed.algorithms.base import model_bytes
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.grouped import labels_clustering, per_device, replace_rows
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.aggregation import weighted_average
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.engine.stacked import is_finite, take
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def importance_weights(losses: torch.Tensor, mask: torch.Tensor, sigma: float = 0.0) -> np.ndarray:
    """u_ks = max(n_ks / n_k, σ), where n_ks counts client k's samples on which cluster
    s has the smallest loss (ties to the lowest s). ``losses`` is ``[S, n, max_n]``
    per-sample losses, ``mask`` ``[n, max_n]`` marks real samples. Returns ``[n, S]``;
    a client without samples gets uniform weights."""
    S = losses.shape[0]
    best = losses.argmin(0)  # [n, max_n]
    counts = torch.stack([((best == s) & mask).sum(1) for s in range(S)], dim=1).double()
    n_k = mask.sum(1, keepdim=True).double()
    u = torch.where(n_k > 0, counts / n_k.clamp(min=1), torch.full_like(counts, 1.0 / S))
    return torch.clamp(u, min=sigma).cpu().numpy()


def best_validated(engine: Engine, c: StackedParams, u: np.ndarray) -> np.ndarray:
    """Each device's cluster s of fewest errors on its validation data (ties to the
    lowest s), ``[n]``; a device without validation samples keeps its largest u_ks."""
    best = engine.mean_losses(c, "val", measure="zero_one").argmin(0).cpu().numpy()
    empty = engine.counts("val") == 0
    best[empty] = u.argmax(1)[empty]
    return best


def aggregation_weights(u: np.ndarray, n_k: np.ndarray) -> np.ndarray:
    """v_sk = u_ks n_k / Σ_k' u_k's n_k' (§4), ``[S, n]``; a cluster no client weighs
    gets zero weights (it keeps its model)."""
    mass = (np.asarray(u, dtype=np.float64) * np.asarray(n_k, dtype=np.float64)[:, None]).T
    total = mass.sum(1, keepdims=True)
    return np.divide(mass, total, out=np.zeros_like(mass), where=total > 0)


def select_clients(v: np.ndarray, K: int, rng: np.random.Generator) -> np.ndarray:
    """Alg. 1's client selection: for each cluster s, K clients drawn without
    replacement with probabilities v_sk (fewer where fewer than K have v_sk > 0).
    ``v`` is ``[S, n]`` (rows summing to 1 or 0); returns a ``[S, n]`` boolean mask."""
    S, n = v.shape
    chosen = np.zeros((S, n), dtype=bool)
    for s in range(S):
        support = np.flatnonzero(v[s] > 0)
        if len(support):
            p = v[s, support] / v[s, support].sum()
            chosen[s, rng.choice(support, size=min(K, len(support)), replace=False, p=p)] = True
    return chosen


def soft_penalty(centres: StackedParams, u: np.ndarray, mu: float) -> QuadraticPenalty:
    """μ/2 Σ_s u_ks ‖w − c_s‖² for every client k (one row each) as one quadratic
    ½ a_k ‖w − m_k‖² with a_k = μ Σ_s u_ks and m_k = Σ_s u_ks c_s / Σ_s u_ks; a_k is
    kept as one scalar per row (shape ``[n, 1, …]``): the pull multiplies by it every
    step, and a full-size copy doubled what that step reads."""
    u_t = {k: torch.as_tensor(u, dtype=v.dtype, device=v.device) for k, v in centres.items()}
    weight, center = {}, {}
    for k, c in centres.items():
        uk = u_t[k]  # [n, S]
        total = uk.sum(1).clamp(min=1e-12)
        shape = (-1, *[1] * (c.dim() - 1))
        center[k] = torch.einsum("ns,s...->n...", uk, c) / total.view(shape)
        weight[k] = (mu * total).view(shape)  # one scalar a row, broadcast by the step
    return QuadraticPenalty(weight=weight, center=center)


@dataclass(frozen=True)
class FedSoftState:
    c: StackedParams  # the S cluster models
    u: np.ndarray  # importance weights [n, S]
    t: int = 0  # rounds done
    w: StackedParams | None = None  # serve "local" / start "own": each device's last local model
    trained: np.ndarray | None = None  # devices whose row of w is a trained local model
    selected: np.ndarray | None = None  # K > 0: [S, n] the clients each cluster drew this round
    best: np.ndarray | None = None  # serve "validation": [n] each device's best-validated cluster


@register
class FedSoft(ColdStart[FedSoftState]):
    """FedSoft (Ruan & Joe-Wong, AAAI 2022, Alg. 1).

    S cluster models start from distinct random draws. Every ``tau`` rounds each
    participant estimates u_k from its per-sample training losses under all S models
    (``importance_weights``). Each round each participant starts from its centre
    m_k = Σ_s u_ks c_s / Σ_s u_ks (``start="own"``: from its own last local model w_k,
    every w_k starting as one shared random model) and trains with ``soft_penalty``; every cluster
    model becomes Σ_k v_sk w_k over the participants (``aggregation_weights``), or,
    with ``K`` > 0, the uniform average of the K participants it drew ∝ v_sk
    (``select_clients``; only the drawn clients train). A device is served the
    cluster of its largest importance weight (``serve="validation"``: the cluster of
    fewest validation errors, ``best_validated``); each participant downloads all S
    models and uploads one.

    Attributes
    ----------
    u_ : ndarray of shape (n_devices, S)
        Last importance weights.
    c_ : StackedParams
        The S cluster models, whichever ``serve`` is.
    """

    name = "fedsoft"
    hyperparameters = (
        Param("S", 5, "number of clusters (the thesis' upper bound for fixed-k baselines, §3.3.4)", symbol="S",
              kind=int, gt=0),
        Param("mu", 0.1, "proximal weight", symbol="μ", kind=float, ge=0.0),
        Param("sigma", 0.0, "smallest importance weight (smoothing), at most 1/S", symbol="σ", kind=float, ge=0.0,
              le=1.0),
        Param("tau", 1, "rounds between importance estimations", symbol="τ", kind=int, gt=0),
        Param("serve", "cluster", "model a device is served: the cluster of its largest importance weight, the "
              "cluster with the fewest errors on its validation data, or its own local model w_k (the paper's "
              "personalised models)", kind=str, choices=("cluster", "validation", "local")),
        Param("start", "centre", "where a local update starts: the centre m_k of the cluster models, or the "
              "device's own last local model w_k (the authors' code keeps each client's model across rounds)",
              kind=str, choices=("centre", "own")),
        Param("K", 0, "clients each cluster draws ∝ v_sk a round and averages uniformly (Alg. 1's selection; "
              "the authors' code: 15 or 30); 0: every participant, weighted by v_sk", symbol="K", kind=int, ge=0),
    )
    S: int
    mu: float
    sigma: float
    tau: int
    serve: str
    start: str
    K: int

    def init(self, engine: Engine, ctx: Context) -> FedSoftState:
        if self.sigma > 1.0 / self.S:
            raise ValueError(f"FedSoft.sigma: σ = {self.sigma} exceeds 1/S = {1.0 / self.S}")
        n = engine.n_devices
        c = engine.init_params(self.S, ctx.generator, distinct=True)
        u = np.full((n, self.S), 1.0 / self.S)
        if self.start == "centre":
            return FedSoftState(c, u)
        w = engine.init_params(n, ctx.generator, distinct=False)  # the authors' one client initial model
        return FedSoftState(c, u, w=w, trained=np.zeros(n, dtype=bool))

    def configure_round(self, engine, state, participants, ctx):
        u = state.u.copy()
        if state.t % self.tau == 0:
            rows = torch.as_tensor(participants, device=engine.device)
            losses = engine.losses(state.c, "train")[:, rows]
            u[participants] = importance_weights(losses, engine.mask("train")[rows], self.sigma)
        pull = soft_penalty(state.c, u, self.mu)
        size = model_bytes(state.c)
        start = pull.center if self.start == "centre" else state.w  # row k: where device k starts
        selected, trainers = None, participants
        if self.K:
            v = aggregation_weights(u[participants], engine.counts("train")[participants])
            selected = np.zeros((self.S, engine.n_devices), dtype=bool)
            selected[:, participants] = select_clients(v, self.K, ctx.rng)
            trainers = np.flatnonzero(selected.any(0))
        estimating = participants if state.t % self.tau == 0 else trainers  # who downloads all S models
        plan = RoundPlan(start, trainers, trainers, upload="each", penalty=pull,
                         bytes_down=len(estimating) * self.S * size, bytes_up=len(trainers) * size)
        return replace(state, u=u, selected=selected), plan

    def aggregate(self, engine, state, plan, trained, ctx):
        """c_s = Σ_k v_sk w_k over the finite participants (K > 0: the uniform average of
        the finite clients cluster s drew), for every s at once."""
        ok = is_finite(trained).cpu().numpy()
        keep = np.flatnonzero(ok)
        M = plan.devices
        if self.K:
            drew = state.selected[:, M[keep]].astype(np.float64)
            count = drew.sum(1, keepdims=True)
            v = np.divide(drew, count, out=np.zeros_like(drew), where=count > 0)
        elif len(keep):
            v = aggregation_weights(state.u[M[keep]], engine.counts("train")[M[keep]])
        else:
            v = np.zeros((self.S, 0))
        pairs_s, pairs_k = np.nonzero(v)
        c = state.c
        if len(pairs_s):
            rows = torch.as_tensor(keep[pairs_k], device=engine.device)
            target = torch.as_tensor(pairs_s, dtype=torch.long, device=engine.device)
            weights = torch.as_tensor(v[pairs_s, pairs_k], dtype=torch.float32, device=engine.device)
            c = weighted_average({k: x.index_select(0, rows) for k, x in trained.items()}, target, weights, c)
        w, has = state.w, state.trained
        if self.serve == "local" or self.start == "own":
            n = engine.n_devices
            w = replace_rows(w if w is not None else take(state.c, [0] * n), M, trained, ok)
            has = np.zeros(n, dtype=bool) if has is None else has.copy()
            has[M[ok]] = True
        best = best_validated(engine, c, state.u) if self.serve == "validation" else None
        return FedSoftState(c, state.u, state.t + 1, w, has, state.selected, best)

    def clustering(self, state: FedSoftState) -> Clustering:
        labels = state.u.argmax(1)
        if self.serve == "validation" and state.best is not None:
            return labels_clustering(state.best, state.c)
        if self.serve in ("cluster", "validation"):
            return labels_clustering(labels, state.c)
        served = take(state.c, labels.tolist())
        if state.w is not None:
            served = replace_rows(served, np.arange(len(labels)), state.w, state.trained)
        return per_device(served)

    def fitted(self, engine, state):
        self.u_, self.c_ = state.u, state.c
