"""FLACC: Federated Learning via Agglomerative Client Clustering (Mehta & Shao, Alg. 1).

FedAvg runs on one global model while the server greedily agglomerates clients into
entities by the cosine similarity α of their weight updates; once no entity has
merged for N_sep rounds, every entity becomes its own federation.

The server-side steps are pure functions over plain arrays, named after the paper:
``update_similarities`` (Alg. 1 lines 10–12, eq. 19), ``expire_similarities``
(system memory, eq. 18) and ``merge_entities`` (eqs. 9–17).

References
----------
M. Mehta and C. Shao, "A Greedy Agglomerative Framework for Clustered Federated
Learning", IEEE Trans. Ind. Informat., vol. 19, no. 12, 2023.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from clusterfed.algorithms.base import pair_traffic
from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register

Entities = list[frozenset[int]]


def cosine_similarities(updates: torch.Tensor) -> np.ndarray:
    """Eq. 19: cosine similarity of every pair of flattened weight updates Δθ, ``[k, k]``.

    A zero update (e.g. a device without training data) has no direction; its
    similarities are 0.
    """
    unit = updates / updates.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return (unit @ unit.T).clamp(-1.0, 1.0).double().cpu().numpy()


def update_similarities(
    alpha: np.ndarray, tau: np.ndarray, selected: np.ndarray, similarities: np.ndarray, t: int
) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1 lines 10–12: α_ij, τ_ij ← similarity, t for every pair i ≠ j of the
    clients ``selected`` this round (``similarities`` is their ``[k, k]`` matrix).
    Other pairs keep their value. Pure: returns new arrays."""
    alpha, tau = alpha.copy(), tau.copy()
    selected = np.asarray(selected, dtype=np.int64)
    rows, cols = np.ix_(selected, selected)
    off = ~np.eye(len(selected), dtype=bool)
    alpha[rows, cols] = np.where(off, similarities, alpha[rows, cols])
    tau[rows, cols] = np.where(off, t, tau[rows, cols])
    return alpha, tau


def expire_similarities(alpha: np.ndarray, tau: np.ndarray, t: int, *, T: int) -> np.ndarray:
    """System memory, eq. 18: at round t a pair last co-selected at round τ keeps
    α_ij^(τ) while t − τ ≤ T and is forgotten (−1) once t − τ > T. Pure."""
    return np.where(t - tau > T, -1.0, alpha)


@dataclass(frozen=True)
class EntityScores:
    """Inter-entity similarities over remembered pairs (α > −1), ``[|E|, |E|]`` each.

    ``cross_min[a, b]`` is α_min^cross of eq. 15 and ``cross_max[a, b]`` α_max^cross of
    eq. 11 (NaN where entities a, b share no remembered pair); ``within_min[a]`` is the
    smallest remembered α between two clients of entity a (+inf if it has none).
    """

    cross_min: np.ndarray
    cross_max: np.ndarray
    within_min: np.ndarray


def entity_scores(alpha: np.ndarray, entities: Entities) -> EntityScores:
    """The paper's "entity matrices" (§IV-B), from the client similarity matrix α.

    Eqs. 9, 11, 12 and 15 are computed subject to α_ij > −1 (§IV-C): pairs never
    co-selected, or forgotten by the memory, take no part.
    """
    m = alpha.shape[0]
    known = (alpha > -1.0) & ~np.eye(m, dtype=bool)
    lo = np.where(known, alpha, np.inf)
    hi = np.where(known, alpha, -np.inf)
    members = [sorted(e) for e in entities]
    # min / max over i ∈ E_a ([|E|, m]), then over j ∈ E_b ([|E|, |E|]).
    row_lo = np.stack([lo[idx].min(axis=0) for idx in members])
    row_hi = np.stack([hi[idx].max(axis=0) for idx in members])
    cross_min = np.stack([row_lo[:, idx].min(axis=1) for idx in members], axis=1)
    cross_max = np.stack([row_hi[:, idx].max(axis=1) for idx in members], axis=1)
    within_min = np.diag(cross_min).copy()  # pairs i ≠ j inside one entity
    unknown = ~np.isfinite(cross_min)
    cross_min[unknown] = np.nan
    cross_max[unknown] = np.nan
    return EntityScores(cross_min=cross_min, cross_max=cross_max, within_min=within_min)


def combination_potential(scores: EntityScores) -> np.ndarray:
    """Φ(E_a, E_b) = α_max^cross − α_min^within (eqs. 11–13) for every entity pair.

    α_min^within is the minimum over the remembered pairs inside E_a and inside E_b.
    If neither has a remembered inner pair there is no evidence that the cross
    similarity beats the within one, and Φ = −inf (no merge); NaN where the two
    entities share no remembered pair.
    """
    within = np.minimum(scores.within_min[:, None], scores.within_min[None, :])
    return scores.cross_max - within


def merge_entities(
    alpha: np.ndarray, entities: Entities, *, alpha0: float = 0.0, n_merge: int = 2
) -> tuple[Entities, int]:
    """Alg. 1 lines 13–18: up to ``n_merge`` greedy merges of the entity pair that
    maximises the minimum inter-entity similarity (eq. 9), subject to
    α_min^cross > α0 (eq. 16) and, when both entities are subservers, Φ > 0 (eq. 14).

    The box re-evaluates the argmax on the updated entity set after each merge. It
    leaves open what happens when the argmax pair violates a condition (taking the
    same argmax again would stall the round); §IV-B merges by eq. 9 "subject to (17)
    ... and (14)", so the argmax is taken over the admissible pairs only. Ties go to
    the pair of lowest entity indices. The merged entity takes the place of the first
    of the two (eq. 10 is a set update; the order is bookkeeping). Pure: returns a new
    list and the number of merges made.
    """
    entities = list(entities)
    merges = 0
    for _ in range(n_merge):
        if len(entities) < 2:
            break
        scores = entity_scores(alpha, entities)
        subserver = np.array([len(e) > 1 for e in entities])
        both = subserver[:, None] & subserver[None, :]
        cand = np.nan_to_num(scores.cross_min, nan=-np.inf)
        Phi = np.nan_to_num(combination_potential(scores), nan=-np.inf)
        admissible = np.triu((cand > alpha0) & (~both | (Phi > 0.0)), k=1)
        if not admissible.any():
            break
        a, b = np.unravel_index(int(np.argmax(np.where(admissible, cand, -np.inf))), cand.shape)
        entities[a] = entities[a] | entities[b]
        del entities[b]
        merges += 1
    return entities, merges


def entity_of_device(entities: Entities, n_devices: int) -> np.ndarray:
    """Index of the entity holding each client."""
    out = np.full(n_devices, -1, dtype=np.int64)
    for e, clients in enumerate(entities):
        out[sorted(clients)] = e
    return out


def _flat(params: StackedParams) -> torch.Tensor:
    return torch.cat([v.flatten(1) for v in params.values()], dim=1)


def _clustering(entities: Entities, params: StackedParams) -> Clustering:
    clusters = tuple(Cluster(id=e, devices=clients) for e, clients in enumerate(entities))
    return Clustering(clusters=clusters, params=params)


@dataclass(frozen=True)
class FLACCState:
    """θ (the FedAvg model while merging), α and τ, the entities, the quiet-round
    count, and after separation the clustering of independent federations."""

    theta: StackedParams
    alpha: np.ndarray
    tau: np.ndarray
    entities: Entities
    clustering: Clustering
    t: int = 0
    quiet: int = 0
    n_merges: int = 0
    separation: int | None = None


@register
class FLACC(ColdStart[FLACCState]):
    """Federated Learning via Agglomerative Client Clustering (Mehta & Shao, 2023,
    §IV and Alg. 1).

    Each round a ``participation`` share c of the clients trains the global FedAvg model θ for E
    local epochs; the server stores the cosine similarity α of every co-selected
    pair's weight update Δθ (eq. 19), forgets pairs not co-selected in the last T
    rounds (eq. 18) and makes up to ``n_merge`` greedy merges (eqs. 9–17). An entity
    is a client or a subserver (a merged group of clients). While merging, entities
    are only bookkeeping: every selected client trains θ and θ is averaged over all
    of them (lines 6–20), so all entities are served θ. After N_sep consecutive
    rounds without a merge, each entity — subserver or single client — becomes an
    independent federation starting from θ (lines 22–27): its selected clients train
    its model and it is averaged over them; an entity with no selected client keeps
    its model, and a single client's federation is its own local training.

    The paper selects c = 20% of the clients (``participation``); learning rate η and
    batch size B are the engine's (the paper's B is 32).

    Attributes
    ----------
    entities_ : list of frozenset of int
        The final entities (clients per federation).
    alpha_ : ndarray of shape (n_devices, n_devices)
        Similarity matrix at the last merging round (−1: not remembered).
    tau_ : ndarray of shape (n_devices, n_devices)
        Round each pair was last co-selected (0: never).
    n_merges_ : int
        Merges made in all.
    separation_round_ : int or None
        Last merging round before separation (None: ``rounds`` ended first).

    Notes
    -----
    Where the box is ambiguous: line 5 read literally separates at t = 1 (no merge
    has happened yet), so the N_sep quiet rounds are counted from the start; the box
    expires memory (line 19) after merging, but eq. 18 defines α^(t) with the expiry
    applied and line 14 merges on α^(t), so the expiry is applied before merging.
    Uploads the engine rejects (not finite) are left out of α and of the average, as
    ``Engine.train`` does, and counted in the round's history.
    """

    name = "flacc"
    hyperparameters = (
        Param("alpha0", 0.0, "least cross-entity cosine similarity α_min^cross to merge (eq. 16)", symbol="α0",
              gt=-1.0, le=1.0),
        Param("T", 10, "system memory in rounds (eq. 18)", symbol="T", kind=int, gt=0),
        Param("n_merge", 2, "merges per round (§IV-C)", kind=int, gt=0),
        Param("N_sep", 10, "consecutive rounds without a merge before the entities separate", symbol="N_sep",
              kind=int, gt=0),
        Param("local_epochs", 5, "local epochs E of ClientUpdate", symbol="E", kind=int, gt=0),
    )
    alpha0: float
    T: int
    n_merge: int
    N_sep: int
    local_epochs: int

    def init(self, engine: Engine, ctx: Context) -> FLACCState:
        m = engine.n_devices
        theta = engine.init_params(1, ctx.generator, distinct=False)  # θ^(0)
        entities: Entities = [frozenset({i}) for i in range(m)]
        return FLACCState(
            theta, -np.ones((m, m)), np.zeros((m, m), dtype=np.int64), entities,
            _clustering(entities, take(theta, [0] * m)),
        )

    def configure_round(self, engine, state, participants, ctx):
        M, t = participants, state.t + 1
        if state.quiet < self.N_sep:  # Alg. 1 lines 6–20: ClientUpdate of θ, each upload kept
            plan = RoundPlan(state.theta, np.zeros(len(M), dtype=np.int64), M, phase="clustering",
                             upload="each", local_epochs=self.local_epochs, **pair_traffic(state.theta, len(M)))
        else:  # lines 22–27: every entity its own federation
            owner = entity_of_device(state.entities, engine.n_devices)
            params = state.clustering.params
            plan = RoundPlan(params, owner[M], M, local_epochs=self.local_epochs, **pair_traffic(params, len(M)))
        return replace(state, t=t), plan

    def aggregate(self, engine, state, plan, trained, ctx):
        if plan.upload == "average":
            return replace(state, clustering=state.clustering.with_params(trained))
        ok, t = plan.devices, state.t  # the driver hands on the accepted uploads only
        delta = _flat(trained) - _flat(state.theta)
        alpha, tau = update_similarities(state.alpha, state.tau, ok, cosine_similarities(delta), t)
        alpha = expire_similarities(alpha, tau, t, T=self.T)
        entities, merged = merge_entities(alpha, state.entities, alpha0=self.alpha0, n_merge=self.n_merge)
        theta = state.theta
        if len(ok):
            theta = engine.aggregate(trained, np.zeros(len(ok), dtype=np.int64), ok, theta)
        quiet = 0 if merged else state.quiet + 1
        return replace(
            state, theta=theta, alpha=alpha, tau=tau, entities=entities, quiet=quiet,
            n_merges=state.n_merges + merged, separation=t if quiet == self.N_sep else state.separation,
            clustering=_clustering(entities, take(theta, [0] * len(entities))),
        )

    def clustering(self, state: FLACCState) -> Clustering:
        return state.clustering

    def fitted(self, engine: Engine, state: FLACCState) -> None:
        self.entities_ = state.entities
        self.alpha_, self.tau_ = state.alpha, state.tau
        self.n_merges_ = state.n_merges
        self.separation_round_ = state.separation
