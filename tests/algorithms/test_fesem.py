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


def test_received_assignment_needs_random_centres():
    with pytest.raises(ValueError, match="assignment 'received' needs centres 'random'"):
        FeSEM(assignment="received")
    FeSEM(assignment="received", centres="random")  # the FlexCFL reading


def test_received_assignment_joins_the_centre_nearest_the_last_received_model(digits):
    """FlexCFL's FeSEM: before its first round every client holds the shared θ, so all
    first participants join the one centre nearest θ; after training, a client that
    took part holds that centre's model as it was sent, and the next sample is assigned
    by distance from what each client holds, before training (digits, S2)."""
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    algo = FeSEM(K=3, rounds=2, centres="random", assignment="received", participation=0.5)
    ctx = Context(np.random.default_rng(0), torch.Generator().manual_seed(4))
    state = algo.init(engine, ctx)
    theta = flat(engine.init_params(1, torch.Generator().manual_seed(4), distinct=False))
    assert torch.equal(state.received, theta.expand(12, -1))
    first = np.array([0, 2, 5, 7, 8, 11])
    nearest = int(torch.cdist(theta.double(), flat(state.centres).double()).argmin())
    state, plan = algo.configure_round(engine, state, first, ctx)
    assert plan.models.tolist() == [nearest] * 6 and plan.devices.tolist() == first.tolist()
    sent = flat(state.centres)[nearest]
    assert all(torch.equal(state.received[d], sent) for d in first)
    assert all(torch.equal(state.received[d], theta[0]) for d in (1, 3, 4, 6, 9, 10))
    trained = engine.local_models(plan.params, plan.models, plan.devices, ctx.generator).params
    state = algo.aggregate(engine, state, plan, trained, ctx)
    assert torch.equal(state.received[2], sent) and torch.equal(state.received[1], theta[0])  # kept
    assert not torch.equal(flat(state.centres)[nearest], sent)  # the M-step moved the centre
    held = state.received[[1, 2, 3]]  # two that still hold θ, one that holds the sent centre
    expected = torch.cdist(held.double(), flat(state.centres).double()).argmin(1).tolist()
    _, plan = algo.configure_round(engine, state, np.array([1, 2, 3]), ctx)
    assert plan.models.tolist() == expected


def test_received_assignment_runs_end_to_end_with_a_sample_each_round(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    result = FeSEM(K=3, rounds=6, centres="random", assignment="received", participation=0.5).fit(engine, seed=2)
    assert len(result.history) == 6 and np.isfinite(result.device_accuracy).all()
    assert 1 <= result.n_clusters <= 3
