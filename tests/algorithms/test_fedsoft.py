"""FedSoft's importance and aggregation weights on constructed losses, its proximal
term as one quadratic, and its soft clustering of real digits data."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms.base import model_bytes
from clusterfed.algorithms.fedsoft import (
    FedSoft,
    aggregation_weights,
    best_validated,
    importance_weights,
    select_clients,
    soft_penalty,
)
from clusterfed.algorithms.protocol import Context
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario


def test_importance_weights_count_the_samples_each_cluster_fits_best():
    # S = 2 clusters, 2 clients; client 0 has 3 samples (one padding slot), client 1 has 4
    losses = torch.tensor([
        [[0.1, 0.2, 0.9, 0.0], [0.5, 0.5, 0.5, 0.5]],
        [[0.3, 0.1, 0.2, 9.0], [0.1, 0.6, 0.4, 0.4]],
    ])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    u = importance_weights(losses, mask)
    np.testing.assert_allclose(u, [[1 / 3, 2 / 3], [1 / 4, 3 / 4]])
    # σ-smoothing floors every weight; ties go to the lowest cluster
    np.testing.assert_allclose(importance_weights(losses, mask, sigma=0.3), [[1 / 3, 2 / 3], [0.3, 0.75]])
    np.testing.assert_allclose(importance_weights(torch.zeros(2, 1, 2), torch.tensor([[True, True]])), [[1.0, 0.0]])
    np.testing.assert_allclose(importance_weights(losses[:, :1], torch.zeros(1, 4, dtype=torch.bool)), [[0.5, 0.5]])


def test_aggregation_weights_are_importance_times_size_normalised_per_cluster():
    u = np.array([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    v = aggregation_weights(u, np.array([10, 20, 30]))
    np.testing.assert_allclose(v, [[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]])
    np.testing.assert_allclose(aggregation_weights(np.array([[1.0, 0.0]]), np.array([5]))[1], [0.0])


def test_soft_penalty_has_the_gradient_of_the_sum_of_proximal_terms():
    c = {"w": torch.tensor([[0.0, 0.0], [2.0, 4.0], [10.0, 0.0]])}  # S = 3 centres
    u = np.array([[0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])
    pen = soft_penalty(c, u, mu=0.1)
    w = torch.tensor([[1.0, 1.0], [3.0, -1.0]])
    for k in range(2):
        direct = sum(0.1 * u[k, s] * (w[k] - c["w"][s]) for s in range(3))
        torch.testing.assert_close(pen.weight["w"][k] * (w[k] - pen.center["w"][k]), direct.float())


def test_fedsoft_recovers_the_three_s2_groups_on_digits(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FedSoft(S=3, mu=0.1, rounds=20)
    result = algo.fit(engine, seed=2)
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert (algo.u_.max(1) > 0.4).all()  # one cluster fits most of every device's data
    size = model_bytes(result.params)
    assert all(h["bytes_down"] == 12 * 3 * size and h["bytes_up"] == 12 * size for h in result.history)


def test_fedsoft_rejects_bad_parameters(digits):
    with pytest.raises(ValueError, match="FedSoft.mu"):
        FedSoft(mu=-1.0)
    engine = Engine(build_scenario(digits, "S2", group_sizes=[1, 1], seed=0), device="cpu")
    with pytest.raises(ValueError, match="FedSoft.sigma: σ = 0.5 exceeds 1/S = 0.25"):
        FedSoft(S=4, sigma=0.5, rounds=1).fit(engine, seed=0)


def test_serving_local_models_serves_each_device_its_last_trained_model(digits):
    """``serve="local"``: after a round, device d is served exactly the local model w_d
    it uploaded; a device that has not trained is served its largest-u cluster."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FedSoft(S=3, rounds=1, serve="local")
    ctx = Context(np.random.default_rng(0), torch.Generator().manual_seed(2))
    state = algo.init(engine, ctx)
    before = algo.clustering(state)  # nobody trained: the cluster of the largest (uniform) u, cluster 0
    assert len(before.clusters) == 12 and all(torch.equal(v[d], state.c[k][0]) for k, v in before.params.items() for d in range(12))
    part = np.array([1, 4, 6, 9])
    state, plan = algo.configure_round(engine, state, part, ctx)
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator, penalty=plan.penalty).params
    state = algo.aggregate(engine, state, plan, trained, ctx)
    served = algo.clustering(state).params
    labels = state.u.argmax(1)
    for k, v in served.items():
        for i, d in enumerate(part):
            assert torch.equal(v[d], trained[k][i])
        for d in sorted(set(range(12)) - set(part.tolist())):
            assert torch.equal(v[d], state.c[k][labels[d]])


def test_serving_local_models_keeps_the_cluster_training(digits):
    """The served models change, the training does not: the cluster models after a fit
    are equal under both ``serve`` values."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    a, b = FedSoft(S=3, rounds=3), FedSoft(S=3, rounds=3, serve="local")
    ra, rb = a.fit(engine, seed=2), b.fit(engine, seed=2)
    np.testing.assert_array_equal(a.u_, b.u_)
    for k in a.c_:
        assert torch.equal(a.c_[k], b.c_[k])
    # serving the clusters is serving each device the c_ row of its largest u
    np.testing.assert_array_equal(engine.accuracy(b.c_, b.u_.argmax(1)), ra.device_accuracy)
    assert ra.n_clusters == len(set(a.u_.argmax(1).tolist())) and rb.n_clusters == 12
    assert rb.device_accuracy.mean() >= ra.device_accuracy.mean() - 0.05


def test_serving_by_validation_serves_each_device_its_fewest_error_cluster(digits):
    """``serve="validation"``: the training is unchanged and device d is served the
    cluster model with the fewest errors on its validation data, which on a digits A2
    differs from the largest-u cluster for some devices."""
    fed = build_scenario(digits, "A2", group_sizes=[6, 6], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    a, b = FedSoft(S=3, rounds=4), FedSoft(S=3, rounds=4, serve="validation")
    ra, rb = a.fit(engine, seed=2), b.fit(engine, seed=2)
    for k in a.c_:
        assert torch.equal(a.c_[k], b.c_[k])
    error = engine.mean_losses(b.c_, "val", measure="zero_one").numpy()
    best = error.argmin(0)
    np.testing.assert_array_equal(error[best, np.arange(12)], error.min(0))
    np.testing.assert_array_equal(rb.device_accuracy, engine.accuracy(b.c_, best))
    assert (best != b.u_.argmax(1)).any()
    assert rb.n_clusters == len(set(best.tolist()))


def test_best_validated_breaks_ties_low_and_keeps_largest_u_without_validation_data():
    class Stub:  # two devices, three clusters; device 1 has no validation samples
        def mean_losses(self, c, split, measure):
            assert (split, measure) == ("val", "zero_one")
            return torch.tensor([[0.2, 0.0], [0.1, 0.0], [0.1, 0.0]])

        def counts(self, split):
            return np.array([10, 0])

    u = np.array([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7]])
    np.testing.assert_array_equal(best_validated(Stub(), {}, u), [1, 2])


def test_starting_from_own_models_continues_each_devices_last_local_model(digits):
    """``start="own"`` (the authors' code): every device starts as one shared random
    model; after a round a participant's next update starts exactly from its upload,
    a device that has not trained still from the shared model, and the pull is the
    same soft penalty toward the clusters as under ``start="centre"``."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FedSoft(S=3, rounds=2, start="own")
    ctx = Context(np.random.default_rng(0), torch.Generator().manual_seed(2))
    state = algo.init(engine, ctx)
    shared = {k: v[0] for k, v in state.w.items()}
    assert all(torch.equal(v[d], shared[k]) for k, v in state.w.items() for d in range(12))
    assert not any(all(torch.equal(shared[k], state.c[k][s]) for k in shared) for s in range(3))
    part = np.array([1, 4, 6, 9])
    state, plan = algo.configure_round(engine, state, part, ctx)
    assert all(torch.equal(plan.params[k][d], shared[k]) for k in shared for d in part)
    centre = soft_penalty(state.c, state.u, algo.mu)
    for k in shared:
        torch.testing.assert_close(plan.penalty.center[k], centre.center[k])
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator, penalty=plan.penalty).params
    state = algo.aggregate(engine, state, plan, trained, ctx)
    state, plan = algo.configure_round(engine, state, np.arange(12), ctx)
    for k in shared:
        for i, d in enumerate(part):
            assert torch.equal(plan.params[k][d], trained[k][i])
        for d in sorted(set(range(12)) - set(part.tolist())):
            assert torch.equal(plan.params[k][d], shared[k])
    # the default starts every participant at its centre m_k instead
    default = FedSoft(S=3, rounds=2)
    s0 = default.init(engine, Context(np.random.default_rng(0), torch.Generator().manual_seed(2)))
    s0, p0 = default.configure_round(engine, s0, part, ctx)
    assert s0.w is None and all(torch.equal(p0.params[k], p0.penalty.center[k]) for k in shared)
    with pytest.raises(ValueError, match="start"):
        FedSoft(start="local")


def test_select_clients_draws_k_distinct_clients_in_proportion_to_v():
    """Alg. 1's selection: K distinct clients per cluster, never one with v_sk = 0,
    all of the support where it has at most K clients, and (over many draws) client k
    drawn first with probability v_sk."""
    v = np.array([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    rng = np.random.default_rng(0)
    chosen = select_clients(v, 2, rng)
    assert chosen.dtype == bool and chosen.shape == (3, 4)
    assert chosen[0].sum() == 2 and not chosen[0, 3]
    assert chosen[1].tolist() == [False, False, False, True]  # support smaller than K
    assert not chosen[2].any()  # a cluster no client weighs draws nobody
    ones = np.array([[0.7, 0.2, 0.1]])
    freq = np.mean([select_clients(ones, 1, rng)[0] for _ in range(4000)], axis=0)
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1], atol=0.03)
    with_k3 = select_clients(ones, 3, rng)
    assert with_k3.all()


def test_selection_trains_the_drawn_clients_and_averages_them_uniformly(digits):
    """``K`` > 0: only the union of the clusters' draws trains, and cluster s becomes
    the plain mean of the uploads of the clients it drew, whatever their sizes."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FedSoft(S=3, rounds=2, K=2, sigma=0.01)
    ctx = Context(np.random.default_rng(0), torch.Generator().manual_seed(2))
    state = algo.init(engine, ctx)
    everyone = np.arange(12)
    state, plan = algo.configure_round(engine, state, everyone, ctx)
    assert state.selected.shape == (3, 12) and (state.selected.sum(1) == 2).all()
    np.testing.assert_array_equal(plan.devices, np.flatnonzero(state.selected.any(0)))
    size = model_bytes(state.c)
    assert plan.bytes_down == 12 * 3 * size and plan.bytes_up == len(plan.devices) * size
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator, penalty=plan.penalty).params
    after = algo.aggregate(engine, state, plan, trained, ctx)
    row = {d: i for i, d in enumerate(plan.devices.tolist())}
    for s in range(3):
        drew = [row[d] for d in np.flatnonzero(state.selected[s])]
        for k in trained:
            torch.testing.assert_close(after.c[k][s], trained[k][drew].mean(0))
    assert FedSoft(K=0).K == 0
    with pytest.raises(ValueError, match="K"):
        FedSoft(K=-1)
