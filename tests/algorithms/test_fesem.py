"""FeSEM's E-step and centre seeding on constructed models, and its clustering of
real digits data."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms.fesem import FeSEM, e_step, seed_centres
from clusterfed.algorithms.grouped import flat
from clusterfed.algorithms.protocol import Context
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario


def test_e_step_assigns_each_local_model_to_the_nearest_centre():
    local = torch.tensor([[0.0, 0.0], [0.9, 0.0], [2.1, 0.0], [5.0, 5.0]])
    centres = torch.tensor([[0.0, 0.0], [2.0, 0.0], [5.0, 4.0]])
    assert e_step(local, centres).tolist() == [0, 0, 1, 2]
    assert e_step(torch.tensor([[1.0, 0.0]]), centres).tolist() == [0]  # tie: lowest k


def test_seeding_spreads_the_centres_over_distinct_blobs():
    local = torch.tensor([[0.0, 0.0], [0.01, 0.0], [100.0, 0.0], [100.0, 0.01], [0.0, 100.0]])
    for s in range(5):
        chosen = seed_centres(local, 3, np.random.default_rng(s).exponential(size=(3, 5)))
        assert len(set(chosen.tolist())) == 3
        assert {0, 1} & set(chosen.tolist()) and {2, 3} & set(chosen.tolist()) and 4 in chosen


def test_seeding_draws_in_proportion_to_squared_distance():
    """The exponential race: with the first centre at 0, the second is 1, 2 or 3
    with probability 1 : 4 : 9 (squared distances 1, 4, 9)."""
    local = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    keys = np.random.default_rng(0).exponential(size=(20_000, 2, 4))
    keys[:, 0, 0] = 0.0  # every first draw picks client 0
    second = [seed_centres(local, 2, k)[1] for k in keys]
    freq = np.bincount(second, minlength=4) / len(second)
    assert freq[0] == 0.0
    assert np.allclose(freq[1:], np.array([1, 4, 9]) / 14, atol=0.01)


def test_leaving_out_an_unpicked_client_keeps_the_centres(digits):
    """Keys belong to clients: without a client k-means++ did not pick (a rejected
    upload), the same clients are picked (digits images as 60 clients' models)."""
    local = torch.from_numpy(digits.x_train[:60].reshape(60, -1))
    keys = np.random.default_rng(3).exponential(size=(5, 60))
    chosen = seed_centres(local, 5, keys)
    for left_out in sorted(set(range(60)) - set(chosen.tolist()))[:10]:
        rows = np.delete(np.arange(60), left_out)
        again = rows[seed_centres(local[rows], 5, keys[:, rows])]
        assert again.tolist() == chosen.tolist()


def test_fesem_recovers_the_three_s2_groups_on_digits(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FeSEM(K=3, rounds=10)
    result = algo.fit(engine, seed=2)  # a draw whose k-means++ centres hit the three groups
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert result.n_clusters == 3 and len(result.history) == 10
    assert result.device_accuracy.mean() > 0.8


def test_random_initial_centres_take_every_client_into_one_cluster_on_digits(digits):
    """``centres="random"`` (the paper's Alg. 1 initialisation): the first local models,
    all trained from one shared θ, lie far from K independent random models and all
    nearest the same one, so FeSEM is left with one cluster (FedAvg) where the
    k-means++ seeding of the same draw recovers the three groups."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    for seed in (1, 2, 3):
        result = FeSEM(K=3, rounds=10, centres="random").fit(Engine(fed, training=TrainingConfig(lr=0.05), device="cpu"),
                                                             seed=seed)
        assert result.n_clusters == 1 and len(set(result.model_of_device.tolist())) == 1
    seeded = FeSEM(K=3, rounds=10).fit(Engine(fed, training=TrainingConfig(lr=0.05), device="cpu"), seed=2)
    assert adjusted_rand_score(fed.groups, seeded.model_of_device) == 1.0


def test_previous_assignment_needs_random_centres():
    with pytest.raises(ValueError, match="assignment 'previous' needs centres 'random'"):
        FeSEM(assignment="previous")
    FeSEM(assignment="previous", centres="random")


def _flexcfl(engine, **kw):
    algo = FeSEM(K=3, rounds=2, centres="random", assignment="previous", participation=0.5, **kw)
    ctx = Context(np.random.default_rng(0), torch.Generator().manual_seed(4))
    return algo, ctx, algo.init(engine, ctx)


def test_previous_assignment_joins_the_centre_nearest_the_last_trained_model(digits):
    """FlexCFL's FeSEM: before its first round every client holds the shared θ, so all
    first participants join the one centre nearest θ; after training a participant
    holds its own local model, and the next sample is assigned by distance from what
    each client holds, before training (digits, S2)."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo, ctx, state = _flexcfl(engine)
    theta = flat(engine.init_params(1, torch.Generator().manual_seed(4), distinct=False))
    assert torch.equal(flat(state.held), theta.expand(12, -1))
    first = np.array([0, 2, 5, 7, 8, 11])
    nearest = int(torch.cdist(theta.double(), flat(state.centres).double()).argmin())
    state, plan = algo.configure_round(engine, state, first, ctx)
    assert plan.models.tolist() == [nearest] * 6 and plan.devices.tolist() == first.tolist()
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator).params
    state = algo.aggregate(engine, state, plan, trained, ctx)
    held = flat(state.held)
    assert torch.equal(held[first], flat(trained))  # each participant holds its own local model
    assert torch.equal(held[[1, 3, 4, 6, 9, 10]], theta.expand(6, -1))  # the others still hold θ
    expected = torch.cdist(held[[1, 2, 3]].double(), flat(state.centres).double()).argmin(1).tolist()
    _, plan = algo.configure_round(engine, state, np.array([1, 2, 3]), ctx)
    assert plan.models.tolist() == expected


def test_first_m_step_makes_each_joined_centre_one_participants_local_model(digits):
    """FlexCFL's 'avg' aggregation keeps one update: a centre that participants joined
    becomes exactly the local model of one of them; the others keep their model."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo, ctx, state = _flexcfl(engine, m_step="first")
    state, plan = algo.configure_round(engine, state, np.arange(12), ctx)
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator).params
    before, local = flat(state.centres), flat(trained)
    after = flat(algo.aggregate(engine, state, plan, trained, ctx).centres)
    for k in range(3):
        members = np.flatnonzero(plan.models == k)
        if len(members):
            assert any(torch.equal(after[k], local[i]) for i in members)
        else:
            assert torch.equal(after[k], before[k])
    averaged = flat(FeSEM(K=3, rounds=2, centres="random", assignment="previous").aggregate(
        engine, state, plan, trained, ctx).centres)
    k = int(plan.models[0])
    assert not torch.equal(averaged[k], after[k])  # 12 participants: the average is none of them


def test_received_serving_serves_each_client_the_centre_it_was_last_sent(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo, ctx, state = _flexcfl(engine, serve="received")
    theta = flat(engine.init_params(1, torch.Generator().manual_seed(4), distinct=False))
    part = np.array([0, 2, 5])
    state, plan = algo.configure_round(engine, state, part, ctx)
    sent = flat(state.centres)[plan.models]
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator).params
    state = algo.aggregate(engine, state, plan, trained, ctx)
    served = flat(algo.clustering(state).params)
    assert served.shape[0] == 12
    assert torch.equal(served[part], sent)  # what they were sent, not the centres' new models
    assert not torch.equal(served[part], flat(state.centres)[plan.models])
    assert torch.equal(served[1], theta[0])  # not yet sampled: the shared θ it holds


def test_flexcfl_fesem_runs_end_to_end_with_a_sample_each_round(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FeSEM(K=3, rounds=6, centres="random", assignment="previous", m_step="first", serve="received",
                 participation=0.5)
    result = algo.fit(engine, seed=2)
    assert len(result.history) == 6 and np.isfinite(result.device_accuracy).all()
    assert result.n_clusters == 12 and 1 <= len(set(algo.labels_.tolist())) <= 3
