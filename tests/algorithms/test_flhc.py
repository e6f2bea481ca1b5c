"""FL+HC's clustering of constructed updates and of real digits updates."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms.flhc import FLHC, update_clusters
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario


def test_updates_cluster_by_euclidean_distance_cut_at_d():
    delta = np.array([[0.0, 0.0], [0.1, 0.0], [3.0, 0.0], [3.0, 0.2], [0.0, 5.0]])
    assert update_clusters(delta, 1.0).tolist() == [0, 0, 1, 1, 2]
    assert update_clusters(delta, 0.05).tolist() == [0, 1, 2, 3, 4]
    assert update_clusters(delta, 100.0).tolist() == [0] * 5
    assert update_clusters(delta, 3.5, "single").tolist() == [0, 0, 0, 0, 1]


def test_flhc_recovers_the_three_s2_groups_on_digits(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    # Ward merge heights of the round-11 updates here: ≤ 0.31 within groups, ≥ 0.8 across.
    algo = FLHC(d=0.5, cluster_round=10, rounds=9)
    result = algo.fit(engine, seed=1)
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    phases = [h["phase"] for h in result.history]
    assert phases == ["clustering"] * 11 + ["training"] * 9
    assert [h["n_clusters"] for h in result.history][9:12] == [1, 3, 3]
    assert result.history[-1]["accuracy"] > result.history[9]["accuracy"] + 0.3


def test_cosine_distance_ignores_the_scale_of_an_update():
    # rows 0 and 1 point the same way at norms 1 and 10: cosine distance 0, Euclidean 9
    delta = np.array([[1.0, 0.0], [10.0, 0.0], [0.0, 1.0], [0.1, 2.0]])
    assert update_clusters(delta, 0.1, "average", "cosine").tolist() == [0, 0, 1, 1]
    assert update_clusters(delta, 0.1, "average").tolist() == [0, 1, 2, 3]
    # the closest pair across the two directions (rows 1 and 3) is at cosine distance 0.9501
    assert update_clusters(delta, 0.99, "single", "cosine").tolist() == [0, 0, 0, 0]
    assert update_clusters(delta, 0.95, "single", "cosine").tolist() == [0, 0, 1, 1]


def test_ward_with_cosine_is_refused_before_training():
    with pytest.raises(ValueError, match="linkage 'ward' needs metric 'euclidean'"):
        FLHC(metric="cosine", rounds=1)
    with pytest.raises(ValueError, match="metric must be one of"):
        update_clusters(np.zeros((2, 2)), 1.0, "average", "manhattan")
