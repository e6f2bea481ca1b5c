"""FLACC's server steps (memory, eq. 18; merging, eqs. 9–17) on constructed similarity
matrices, and its clustering of real digits data."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms.base import model_bytes
from clusterfed.algorithms.flacc import (
    FLACC,
    combination_potential,
    entity_scores,
    expire_similarities,
    merge_entities,
    update_similarities,
)
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.aggregation import weighted_average
from clusterfed.scenarios import build_scenario


def _alpha(m: int, pairs: dict[tuple[int, int], float]) -> np.ndarray:
    """Symmetric similarity matrix: the given pairs, −1 (unknown) elsewhere."""
    alpha = -np.ones((m, m))
    for (i, j), v in pairs.items():
        alpha[i, j] = alpha[j, i] = v
    return alpha


def _sets(entities) -> set[frozenset[int]]:
    return set(entities)


# --- system memory (eq. 18) -------------------------------------------------------


def test_memory_forgets_a_pair_after_T_rounds_and_keeps_the_newest_value():
    m, T = 4, 3
    alpha, tau = -np.ones((m, m)), np.zeros((m, m), dtype=np.int64)
    # round 1: all four co-selected
    s1 = np.array([[1.0, 0.5, 0.1, 0.2], [0.5, 1.0, 0.3, 0.4], [0.1, 0.3, 1.0, 0.6], [0.2, 0.4, 0.6, 1.0]])
    alpha, tau = update_similarities(alpha, tau, np.arange(4), s1, 1)
    assert alpha[0, 1] == alpha[1, 0] == 0.5 and tau[0, 1] == 1
    assert (np.diag(alpha) == -1).all()  # no self-similarity is stored
    # round 4: only clients 2 and 3 again, with a new value
    alpha, tau = update_similarities(alpha, tau, np.array([2, 3]), np.array([[1.0, 0.9], [0.9, 1.0]]), 4)
    assert alpha[2, 3] == 0.9 and tau[2, 3] == 4
    assert alpha[0, 1] == 0.5 and tau[0, 1] == 1  # pairs not co-selected are untouched

    at4 = expire_similarities(alpha, tau, 4, T=T)  # 4 − 1 = T: still remembered
    assert at4[0, 1] == 0.5 and at4[0, 3] == 0.2
    at5 = expire_similarities(alpha, tau, 5, T=T)  # 5 − 1 > T: forgotten
    assert at5[0, 1] == at5[1, 0] == -1 and at5[0, 2] == -1 and at5[1, 3] == -1
    assert at5[2, 3] == at5[3, 2] == 0.9  # co-selected again at 4: newest value kept
    assert expire_similarities(at5, tau, 7, T=T)[2, 3] == 0.9
    assert expire_similarities(at5, tau, 8, T=T)[2, 3] == -1
    assert alpha[0, 1] == 0.5  # pure: inputs unchanged


# --- merging (eqs. 9–17) ----------------------------------------------------------


def _two_subservers(cross_13: float) -> np.ndarray:
    """Subservers {0, 1} (α=0.9) and {2, 3} (α=0.8); α_min^within = 0.8 and
    α_max^cross = max(0.5, 0.6, 0.7, cross_13)."""
    return _alpha(
        4, {(0, 1): 0.9, (2, 3): 0.8, (0, 2): 0.5, (0, 3): 0.6, (1, 2): 0.7, (1, 3): cross_13}
    )


@pytest.mark.parametrize(
    ("cross_13", "phi", "merged"), [(0.75, -0.05, False), (0.8, 0.0, False), (0.85, 0.05, True)]
)
def test_two_subservers_merge_only_when_phi_is_positive(cross_13, phi, merged):
    alpha = _two_subservers(cross_13)
    subservers = [frozenset({0, 1}), frozenset({2, 3})]
    scores = entity_scores(alpha, subservers)
    assert scores.cross_min[0, 1] == 0.5 and scores.cross_max[0, 1] == max(0.7, cross_13)
    assert scores.within_min.tolist() == [0.9, 0.8]
    assert combination_potential(scores)[0, 1] == pytest.approx(phi)
    out, n = merge_entities(alpha, subservers, alpha0=0.0, n_merge=2)
    assert n == int(merged)
    assert _sets(out) == ({frozenset({0, 1, 2, 3})} if merged else set(subservers))


def test_phi_does_not_apply_to_a_client_joining_a_subserver():
    alpha = _two_subservers(0.75)
    entities = [frozenset({0, 1}), frozenset({2}), frozenset({3})]
    # best pair {2}, {3} (0.8) merges; then the two subservers are blocked (Φ = −0.05)
    out, n = merge_entities(alpha, entities, alpha0=0.0, n_merge=2)
    assert n == 1 and _sets(out) == {frozenset({0, 1}), frozenset({2, 3})}
    # with α_23 forgotten, client 3 joins {0, 1} (min cross 0.6 > 0.5 for client 2),
    # although α_max^cross 0.75 < α_01 = 0.9: Φ is a condition on two subservers only
    alpha[2, 3] = alpha[3, 2] = -1.0
    out, n = merge_entities(alpha, entities, alpha0=0.0, n_merge=1)
    assert n == 1 and _sets(out) == {frozenset({0, 1, 3}), frozenset({2})}


@pytest.mark.parametrize(
    ("value", "alpha0", "merged"),
    [(0.0, 0.0, False), (0.1, 0.0, True), (0.1, 0.1, False), (-0.2, 0.0, False), (-0.2, -0.3, True)],
)
def test_no_merge_unless_min_cross_similarity_exceeds_alpha0(value, alpha0, merged):
    out, n = merge_entities(_alpha(2, {(0, 1): value}), [frozenset({0}), frozenset({1})], alpha0=alpha0)
    assert n == int(merged) and len(out) == (1 if merged else 2)


def test_alpha0_applies_to_the_minimum_not_the_maximum_cross_similarity():
    alpha = _alpha(3, {(0, 1): 0.9, (0, 2): 0.8, (1, 2): -0.1})
    out, n = merge_entities(alpha, [frozenset({0, 1}), frozenset({2})], alpha0=0.0)
    assert n == 0 and len(out) == 2


def test_greedy_merges_reevaluate_the_entity_set_after_each_merge():
    alpha = _alpha(3, {(0, 1): 0.9, (0, 2): 0.7, (1, 2): 0.6})
    singles = [frozenset({i}) for i in range(3)]
    out, n = merge_entities(alpha, singles, n_merge=1)
    assert n == 1 and _sets(out) == {frozenset({0, 1}), frozenset({2})}
    out, n = merge_entities(alpha, singles, n_merge=2)  # then 2 joins {0, 1}: min(0.7, 0.6) > 0
    assert n == 2 and _sets(out) == {frozenset({0, 1, 2})}


def test_a_blocked_best_pair_does_not_stop_other_merges_and_forgotten_pairs_are_ignored():
    # Subservers {0,1}, {2,3} have the highest min cross similarity (0.5) but Φ < 0;
    # clients 4 and 5 (α = 0.3) merge instead. Client 4's pair with 2 is forgotten (−1),
    # so it does not count in the minimum over {2, 3} × {4}.
    alpha = np.pad(_two_subservers(0.75), ((0, 2), (0, 2)), constant_values=-1.0)
    alpha[4, 5] = alpha[5, 4] = 0.3
    alpha[3, 4] = alpha[4, 3] = 0.2
    entities = [frozenset({0, 1}), frozenset({2, 3}), frozenset({4}), frozenset({5})]
    out, n = merge_entities(alpha, entities, n_merge=1)
    assert n == 1 and _sets(out) == {frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5})}
    alpha[4, 5] = alpha[5, 4] = 0.1  # now {2, 3} + {4} (min over remembered = 0.2) wins
    out, n = merge_entities(alpha, entities, n_merge=1)
    assert n == 1 and _sets(out) == {frozenset({0, 1}), frozenset({2, 3, 4}), frozenset({5})}


def test_unknown_pairs_never_merge():
    out, n = merge_entities(-np.ones((3, 3)), [frozenset({i}) for i in range(3)], alpha0=-0.99)
    assert n == 0 and len(out) == 3


# --- training on digits -----------------------------------------------------------


@pytest.fixture(scope="module")
def s2_three_groups(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    return fed, Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def test_local_models_average_to_engine_train(s2_three_groups):
    _, engine = s2_three_groups
    params = engine.init_params(2, torch.Generator().manual_seed(0), distinct=True)
    models, devices = np.array([0, 0, 1, 1, 1]), np.array([0, 5, 2, 3, 9])
    trained = engine.local_models(params, models, devices, torch.Generator().manual_seed(3), local_epochs=2).params
    assert next(iter(trained.values())).shape[0] == 5  # one model per pair
    weights = engine.data.train.counts.float()[torch.as_tensor(devices)]
    mine = weighted_average(trained, torch.as_tensor(models), weights, params)
    ref = engine.train(params, models, devices, torch.Generator().manual_seed(3), local_epochs=2).params
    for k in ref:
        torch.testing.assert_close(mine[k], ref[k])


def test_flacc_recovers_the_s2_groups_with_full_participation(s2_three_groups):
    fed, engine = s2_three_groups
    algo = FLACC(rounds=25, participation=1.0, local_epochs=1)
    result = algo.fit(engine, seed=1)
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert result.n_clusters == 3 and algo.n_merges_ == 12 - 3
    sep = algo.separation_round_
    assert sep is not None and sep < 25
    history = result.history
    assert len(history) == 25
    assert [h["phase"] for h in history] == ["clustering"] * sep + ["training"] * (25 - sep)
    assert history[0]["n_clusters"] == 12 - 2  # n_merge = 2 merges in round 1
    # one global model while merging; separate federations beat it clearly on S2
    assert history[-1]["accuracy"] > history[sep - 1]["accuracy"] + 0.3
    assert result.device_accuracy.mean() > 0.8
    assert all(h["bytes_down"] == h["bytes_up"] == 12 * model_bytes(result.params) for h in history)


def test_flacc_recovers_the_s2_groups_with_partial_participation(digits):
    fed = build_scenario(digits, "S2", group_sizes=[6, 6, 6], seed=2)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FLACC(rounds=30, participation=0.5, local_epochs=1, T=10)
    result = algo.fit(engine, seed=2)
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert result.n_clusters == 3 and sorted(map(len, algo.entities_)) == [6, 6, 6]
    assert all(h["bytes_down"] == 9 * model_bytes(result.params) for h in result.history)
    # the memory held at the last merging round: only pairs co-selected in the last T rounds
    t, off = algo.separation_round_, ~np.eye(18, dtype=bool)
    recent = (t - algo.tau_ <= algo.T) & (algo.tau_ > 0) & off
    assert (algo.alpha_[~recent] == -1).all()
    assert (algo.alpha_[recent] > -1).all() and (~recent & off).any()
