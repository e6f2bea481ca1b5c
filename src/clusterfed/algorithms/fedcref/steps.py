"""The named steps of FedCRef (fedcref Alg. 1 lines 10–20 and 26–31, Alg. 2, §4.5).

Pure functions over NumPy arrays: the association rule of eq. (2) in both
directions, the association graph's communities G (connected components with at
least two clusters) and isolated clusters I, the cluster refinement subroutine of
Alg. 2 (with its clusters renumbered as the previous ones), the client stability
check and the global stop rule.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from clusterfed.evaluation.clustering_accuracy import clustering_accuracy


NORMALIZE = ("pair", "joint", "client")


def one_way_association(e_own: np.ndarray, e_other: np.ndarray, *, α: float, θ: float, normalize: str = "pair") -> bool:
    """Eq. (2): Pr{Normalize_[0,1] |E_iq→iq − E_jp→iq| ≤ θ} ≥ α/100.

    ``e_own`` are cluster q's per-sample errors under its own model AE_iq, ``e_other``
    under the received AE_jp. The test reads as "the α-th percentile of the normalised
    differences is at most θ" (the authors' code); see :func:`eq2_statistic` for the
    readings of Normalize (for one pair, "client" is "pair").
    """
    return bool(one_way_matrix(e_own[None, :], e_other[None, :], α=α, θ=θ, normalize=normalize)[0])


def one_way_matrix(
    e_own: np.ndarray, e_other: np.ndarray, *, α: float, θ: float, normalize: str = "pair"
) -> np.ndarray:
    """Eq. (2) for many (own, other) vector pairs at once: rows of ``[P, n]`` arrays;
    each holds one way when its :func:`eq2_statistic` is at most θ."""
    return eq2_statistic(e_own, e_other, α=α, normalize=normalize) <= θ


def eq2_statistic(e_own: np.ndarray, e_other: np.ndarray, *, α: float, normalize: str = "pair") -> np.ndarray:
    """Eq. (2)'s statistic per row of ``[P, n]`` arrays: the α-th percentile of the
    normalised differences |E_own − E_other| (+inf for a pair that never associates).

    §4.2 says the differences are "normalized to the unit range [0, 1]"; which values
    are scaled together it leaves open (RESULTS.md §6.5 measures the three readings):
    ``pair`` (default, the text's order: difference first, then min-max over this
    pair's n differences), ``client`` (min-max over every difference in the call: the
    received models of all other clients on one cluster, as
    :func:`association_graph` calls it) and ``joint`` (the two error vectors min-max
    scaled together, then differenced). A constant range normalises to 0. A pair with
    a non-finite error (a NaN model or sample) does not associate and is left out of
    the ``client`` range: its span would be NaN, its differences normalise to 0, and it
    would join every community.
    """
    if normalize not in NORMALIZE:
        raise ValueError(f"normalize must be one of {NORMALIZE}, got {normalize!r}")
    finite = np.isfinite(e_own - e_other).all(axis=1)
    if not finite.all():
        e_own, e_other = np.broadcast_arrays(e_own, e_other)
        out = np.full(len(finite), np.inf)
        if finite.any():
            out[finite] = eq2_statistic(e_own[finite], e_other[finite], α=α, normalize=normalize)
        return out
    if normalize == "joint":
        lo = np.minimum(e_own.min(axis=1, keepdims=True), e_other.min(axis=1, keepdims=True))
        span = np.maximum(e_own.max(axis=1, keepdims=True), e_other.max(axis=1, keepdims=True)) - lo
        d_norm = np.abs(np.divide(e_own - e_other, span, out=np.zeros(np.broadcast(e_own, e_other).shape),
                                  where=span > 0))
    else:
        d = np.abs(e_own - e_other)
        axis = 1 if normalize == "pair" else None
        lo = d.min(axis=axis, keepdims=True)
        span = d.max(axis=axis, keepdims=True) - lo
        d_norm = np.divide(d - lo, span, out=np.zeros_like(d), where=span > 0)
    return np.percentile(d_norm, α, axis=1)


def association_graph(
    errors: np.ndarray,
    members: list[np.ndarray],
    client_of: np.ndarray,
    *,
    α: float,
    θ: float,
    normalize: str = "pair",
) -> np.ndarray:
    """Alg. 1 lines 10–16: the undirected adjacency ``[C, C]`` of local clusters.

    ``errors[m, s]`` is the error of cluster m's model on sample s (all samples of all
    clients, one row per model: the all-to-all exchange); ``members[c]`` indexes
    cluster c's samples. Clusters c ≠ c' of different clients are linked when eq. (2)
    holds in both directions; one-way success does not associate. Empty clusters
    have no model and no edge.
    """
    one_way = association_statistics(errors, members, client_of, α=α, normalize=normalize) <= θ
    return one_way & one_way.T  # one_way[b, a]: AE_b reconstructs Q_a like AE_a


def association_statistics(
    errors: np.ndarray, members: list[np.ndarray], client_of: np.ndarray, *, α: float, normalize: str = "pair"
) -> np.ndarray:
    """stat[b, a]: eq. (2)'s statistic of model b on cluster a for every ordered pair of
    non-empty clusters of different clients (+inf elsewhere: no test, no edge)."""
    n = len(members)
    stat = np.full((n, n), np.inf)
    for a, idx in enumerate(members):
        if len(idx) == 0:
            continue
        others = np.flatnonzero((client_of != client_of[a]) & np.array([len(m) > 0 for m in members]))
        if len(others) == 0:
            continue
        e_own = np.broadcast_to(errors[a, idx], (len(others), len(idx)))
        stat[others, a] = eq2_statistic(e_own, errors[np.ix_(others, idx)], α=α, normalize=normalize)
    return stat


def communities_and_isolated(adjacency: np.ndarray, nodes: np.ndarray) -> tuple[list[list[int]], list[int]]:
    """Alg. 1 lines 17–20 and eq. (3): connected components of Γ over ``nodes``.

    Returns G (components with |V| ≥ 2, each sorted, ordered by their smallest node)
    and I (the isolated nodes).
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    if len(nodes) == 0:
        return [], []
    sub = adjacency[np.ix_(nodes, nodes)]
    r, c = np.nonzero(sub)
    graph = coo_matrix((np.ones(len(r)), (r, c)), shape=(len(nodes), len(nodes)))
    _, label = connected_components(graph, directed=False)
    groups: dict[int, list[int]] = {}
    for node, lab in zip(nodes.tolist(), label.tolist()):
        groups.setdefault(lab, []).append(node)
    comps = sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])
    return [g for g in comps if len(g) >= 2], [g[0] for g in comps if len(g) == 1]


def cluster_refine(errors: np.ndarray, k: int) -> tuple[np.ndarray, list[int]]:
    """Alg. 2 on one client: new clusters H_1..H_k from per-sample errors ``[n, |M|]``.

    Column j holds e_{k,M_j}, the client's local models first and then the received
    community models. Each of the k rounds takes M_max, the model that is the best
    (lowest error) for the most still-unassigned samples R, forms H_p from those
    samples and removes M_max from M; samples left in R at the end go to the
    best of the selected models M_select. Ties go to the lower model index. Returns
    the assignment (cluster p of each sample) and M_select in order.
    """
    n, n_models = errors.shape
    if k > n_models:
        raise ValueError(f"k = {k} clusters need at least k models, got {n_models}")
    assignment = np.full(n, -1, dtype=np.int64)
    available = np.ones(n_models, dtype=bool)
    selected: list[int] = []
    for p in range(k):
        r = np.flatnonzero(assignment < 0)
        masked = np.where(available[None, :], errors[r], np.inf)
        best = masked.argmin(axis=1)
        counts = np.bincount(best, minlength=n_models)
        counts[~available] = -1
        m_max = int(counts.argmax())
        assignment[r[best == m_max]] = p
        selected.append(m_max)
        available[m_max] = False
    rest = np.flatnonzero(assignment < 0)
    if len(rest):
        assignment[rest] = errors[np.ix_(rest, selected)].argmin(axis=1)
    return assignment, selected


def keep_indices(refined: np.ndarray, previous: np.ndarray, k: int) -> np.ndarray:
    """Renumber Alg. 2's clusters H_1..H_k (numbered in the order their model was
    selected) as the previous clusters Q_iq they share most samples with (the
    Hungarian matching of eq. 4). The clustering is unchanged; cluster q keeps its
    index and so its model AE_iq: a client that leaves A keeps models that still
    describe its clusters in the next association."""
    table = np.zeros((k, k), dtype=np.int64)
    np.add.at(table, (refined, previous), 1)
    rows, cols = linear_sum_assignment(table, maximize=True)
    index = np.empty(k, dtype=np.int64)
    index[rows] = cols
    return index[refined]


def is_stable(previous: np.ndarray, current: np.ndarray, *, τ: float) -> bool:
    """§4.5 client stability: ACC(y′, y) between consecutive local clusterings ≥ τ."""
    return clustering_accuracy(current, previous) >= τ


def global_stop(
    n_communities: list[int], n_isolated: list[int], *, window: int = 3, tolerance: float = 0.1
) -> bool:
    """§4.5 global stop: |G| and |I| each stay within ``tolerance`` (10%) of their value
    at the start of the last ``window`` (3) iterations; a zero start allows no change."""
    if len(n_communities) < window:
        return False

    def steady(series: list[int]) -> bool:
        ref = series[-window]
        return all(abs(v - ref) <= tolerance * ref for v in series[-window:])

    return steady(n_communities) and steady(n_isolated)
