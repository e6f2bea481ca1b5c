"""FedCRef's named steps on constructed inputs: eq. (2) both ways, the association
graph's communities and isolated clusters, Alg. 2 and the stop rules (fedcref §4)."""

import numpy as np
import pytest

from clusterfed.algorithms.fedcref.steps import (
    association_graph,
    association_statistics,
    cluster_refine,
    communities_and_isolated,
    global_stop,
    is_stable,
    keep_indices,
    one_way_association,
    one_way_matrix,
)

# Differences |E_own − E_other| of 8 samples; min-max normalised they are
# SMALL_GAPS → [0, .05, .05, .1, .1, .1, .15, 1]  (75th percentile 0.1125 ≤ 0.2)
# LARGE_GAPS → [0, .5, .6, .7, .8, .9, .95, 1]    (75th percentile 0.9125 > 0.2)
E_OWN = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
SMALL_GAPS = np.array([0.0, 0.1, 0.1, 0.2, 0.2, 0.2, 0.3, 2.0])
LARGE_GAPS = np.array([0.0, 1.0, 1.2, 1.4, 1.6, 1.8, 1.9, 2.0])


def test_eq2_reads_the_alpha_percentile_of_normalised_differences():
    assert one_way_association(E_OWN, E_OWN + SMALL_GAPS, α=75, θ=0.2)
    assert not one_way_association(E_OWN, E_OWN + LARGE_GAPS, α=75, θ=0.2)
    # the sign of the difference does not matter, the scale neither
    assert one_way_association(E_OWN, E_OWN - 0.4 * SMALL_GAPS, α=75, θ=0.2)
    # a looser percentile or threshold lets the large gaps through
    assert one_way_association(E_OWN, E_OWN + LARGE_GAPS, α=5, θ=0.2)  # 5th percentile 0.175
    assert one_way_association(E_OWN, E_OWN + LARGE_GAPS, α=75, θ=0.95)
    # identical errors: every difference is 0
    assert one_way_association(E_OWN, E_OWN, α=75, θ=0.0)


def test_eq2_readings_of_normalize_differ_where_they_should():
    # a constant gap: one pair's differences have no range (→ 0, associated), but
    # scaled together the two error vectors are 0 and 1 apart (not associated)
    own, other = np.full(8, 0.1), np.full(8, 0.2)
    assert one_way_association(own, other, α=75, θ=0.2, normalize="pair")
    assert not one_way_association(own, other, α=75, θ=0.2, normalize="joint")
    assert one_way_association(own, own + 0.01 * SMALL_GAPS, α=75, θ=0.2, normalize="joint")
    # two received models on one cluster: small evenly spread gaps fail alone (75th
    # percentile 0.75 of their own range) but pass beside a model that is far off
    e_own = np.broadcast_to(E_OWN, (2, 8))
    e_other = np.stack([E_OWN + np.linspace(0.0, 0.1, 8), E_OWN + 2.0 + np.linspace(0.0, 0.1, 8)])
    assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize="pair").tolist() == [False, False]
    assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize="client").tolist() == [True, False]
    with pytest.raises(ValueError, match="normalize"):
        one_way_association(own, other, α=75, θ=0.2, normalize="global")


def _errors_for(pairs: dict[tuple[int, int], np.ndarray], n_clusters: int, per: int) -> np.ndarray:
    """errors[m, s] for clusters of `per` samples each; pairs[(b, a)] = gaps of model b on cluster a."""
    errors = np.full((n_clusters, n_clusters * per), 5.0)
    for a in range(n_clusters):
        cols = slice(a * per, (a + 1) * per)
        errors[:, cols] = 1.0 + LARGE_GAPS  # default: nobody reconstructs a like its own model
        errors[a, cols] = E_OWN
    for (b, a), gaps in pairs.items():
        errors[b, a * per : (a + 1) * per] = E_OWN + gaps
    return errors


def test_a_non_finite_error_associates_with_nothing_and_leaves_the_others_alone():
    """A NaN client (its model's errors, or its samples') would otherwise normalise to 0
    and join every community; under ``client`` it would also blank every other pair."""
    e_own = np.broadcast_to(E_OWN, (3, 8))
    e_other = np.stack([E_OWN + 0.01 * SMALL_GAPS, np.where(np.arange(8) == 2, np.nan, E_OWN), E_OWN + LARGE_GAPS])
    for normalize in ("pair", "client", "joint"):
        assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize=normalize).tolist()[1] is False
    assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize="pair").tolist() == [True, False, False]
    e_other[1] = E_OWN + 2.0  # finite: under ``client`` the far model lets the first pass (as above) …
    assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize="client").tolist() == [True, False, False]
    e_other[1, 2] = np.nan  # … a NaN one is left out of the range instead of blanking it
    assert one_way_matrix(e_own, e_other, α=75, θ=0.2, normalize="client").tolist() == (
        [*one_way_matrix(e_own[[0, 2]], e_other[[0, 2]], α=75, θ=0.2, normalize="client")[:1].tolist(), False,
         *one_way_matrix(e_own[[0, 2]], e_other[[0, 2]], α=75, θ=0.2, normalize="client")[1:].tolist()])
    assert not one_way_association(E_OWN, np.full(8, np.inf), α=75, θ=1.0)


def test_association_needs_both_directions():
    # clusters 0,1 on client 0; 2,3 on client 1
    per = 8
    members = [np.arange(c * per, (c + 1) * per) for c in range(4)]
    client_of = np.array([0, 0, 1, 1])
    pairs = {
        (2, 0): SMALL_GAPS, (0, 2): SMALL_GAPS,  # 0 ↔ 2: both ways
        (3, 1): SMALL_GAPS,  # AE_3 reconstructs Q_1, AE_1 does not reconstruct Q_3: one way only
        (1, 0): SMALL_GAPS, (0, 1): SMALL_GAPS,  # same client: never associated
    }
    adj = association_graph(_errors_for(pairs, 4, per), members, client_of, α=75, θ=0.2)
    expected = np.zeros((4, 4), bool)
    expected[0, 2] = expected[2, 0] = True
    np.testing.assert_array_equal(adj, expected)


def test_association_statistics_are_the_eq2_percentiles_per_ordered_pair():
    per = 8
    members = [np.arange(c * per, (c + 1) * per) for c in range(3)]
    client_of = np.array([0, 0, 1])
    errors = _errors_for({(2, 0): SMALL_GAPS, (0, 2): LARGE_GAPS}, 3, per)
    stat = association_statistics(errors, members, client_of, α=75)
    assert stat[2, 0] == pytest.approx(0.1125) and stat[0, 2] == pytest.approx(0.9125)
    assert stat[1, 2] == pytest.approx(0.9125)  # the default: nobody reconstructs a like its own model
    assert np.isinf(stat[[0, 1, 0, 1, 2], [1, 0, 0, 1, 2]]).all()  # same client: no test
    passed = stat <= 0.2
    np.testing.assert_array_equal(association_graph(errors, members, client_of, α=75, θ=0.2), passed & passed.T)


def test_empty_clusters_have_no_edges():
    per = 8
    members = [np.arange(0, per), np.arange(per, 2 * per), np.array([], dtype=np.int64)]
    errors = np.ones((3, 2 * per))  # every model reconstructs everything alike
    adj = association_graph(errors, members, np.array([0, 1, 2]), α=75, θ=0.2)
    np.testing.assert_array_equal(adj, [[False, True, False], [True, False, False], [False, False, False]])


def test_connected_components_and_isolated_clusters():
    adj = np.zeros((8, 8), bool)
    for a, b in [(0, 3), (3, 5), (1, 6)]:  # 0-3-5 is a chain: one community
        adj[a, b] = adj[b, a] = True
    communities, isolated = communities_and_isolated(adj, np.arange(8))
    assert communities == [[0, 3, 5], [1, 6]]
    assert isolated == [2, 4, 7]
    # only the given nodes are vertices (e.g. non-empty clusters)
    communities, isolated = communities_and_isolated(adj, np.array([0, 1, 2, 3, 6]))
    assert communities == [[0, 3], [1, 6]]
    assert isolated == [2]


def test_refinement_takes_the_most_chosen_model_first():
    # 6 samples, models: local L0, L1 and community G2 (columns 0, 1, 2)
    errors = np.array([
        [0.9, 0.5, 0.1],  # best G2
        [0.8, 0.6, 0.2],  # best G2
        [0.7, 0.9, 0.3],  # best G2
        [0.1, 0.9, 0.5],  # best L0
        [0.2, 0.1, 0.9],  # best L1 (its only sample)
        [0.3, 0.2, 0.4],  # best L1 — after G2 is removed, L1 still wins
    ])
    assignment, selected = cluster_refine(errors, k=2)
    # round 1: G2 is best for 3 samples → H_0 = {0, 1, 2}; round 2 over R = {3, 4, 5}
    # with M = {L0, L1}: L0 best for 1, L1 for 2 → H_1 = {4, 5}; sample 3 then goes
    # to the best of M_select = {G2, L1}: G2 (0.5 < 0.9)
    assert selected == [2, 1]
    np.testing.assert_array_equal(assignment, [0, 0, 0, 0, 1, 1])


def test_refinement_needs_k_models():
    with pytest.raises(ValueError, match="at least k models"):
        cluster_refine(np.zeros((3, 1)), k=2)


def test_client_stability_is_acc_between_iterations():
    before = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    after = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 1])  # relabelled, one sample moved
    assert is_stable(before, after, τ=0.9)
    assert not is_stable(before, after, τ=0.95)


def test_global_stop_after_three_steady_iterations():
    assert not global_stop([0, 10], [90, 20])  # fewer than three iterations
    assert not global_stop([5, 10, 10], [90, 20, 19])
    assert global_stop([5, 10, 10, 11], [90, 20, 19, 18])  # 10 → 11 and 20 → 18: within 10%
    assert not global_stop([5, 10, 10, 12], [90, 20, 19, 18])  # 10 → 12 is 20%
    assert not global_stop([10, 10, 10], [20, 19, 17])  # 20 → 17 is 15%
    assert global_stop([0, 0, 0], [4, 4, 4])
    assert not global_stop([0, 0, 1], [4, 4, 4])  # from zero, any change counts


def test_refined_clusters_keep_the_indices_of_the_clusters_they_came_from():
    previous = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    refined = np.array([2, 2, 1, 0, 0, 0, 1, 1, 1])  # H_0 = old 1, H_1 ≈ old 2, H_2 ≈ old 0
    np.testing.assert_array_equal(keep_indices(refined, previous, 3), [0, 0, 2, 1, 1, 1, 2, 2, 2])
    # an empty refined cluster still gets an index of its own
    np.testing.assert_array_equal(keep_indices(np.array([1, 1, 1]), np.array([0, 0, 1]), 2), [0, 0, 0])
