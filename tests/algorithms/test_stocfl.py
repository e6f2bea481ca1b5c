"""StoCFL (Zeng et al., 2023, Alg. 1): stochastic merging on constructed
representations, Ψ as the anchor's gradient, bi-level training and newcomers on digits."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score
from torch.nn import functional as F

from clusterfed.algorithms.base import generators, model_bytes
from clusterfed.algorithms.clustering import Cluster
from clusterfed.algorithms.stocfl import (
    StoCFL,
    admit_clients,
    cosine_similarity,
    data_representations,
    merge_sums,
    stochastic_merge,
)
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.scenarios import build_scenario


def _singletons(*devices: int) -> tuple[Cluster, ...]:
    return tuple(Cluster(id=d, devices=frozenset({d})) for d in devices)


def test_merge_unites_only_sampled_clusters_above_tau_and_chains():
    clusters = _singletons(0, 1, 2, 3, 4)
    m = np.eye(5)
    m[0, 1] = m[1, 0] = 0.9
    m[1, 2] = m[2, 1] = 0.8  # chains 0–1–2 although cos(0, 2) is low
    m[2, 3] = m[3, 2] = 0.95  # 3 is not sampled this round: stays alone
    m[0, 4] = m[4, 0] = 0.5  # exactly τ: not above it
    out, rows = stochastic_merge(m, clusters, np.array([0, 1, 2, 4]), tau=0.5)
    assert [sorted(c.devices) for c in out] == [[0, 1, 2], [3], [4]]
    assert [c.id for c in out] == [0, 3, 4]
    assert rows.tolist() == [0, 3, 4]


def test_merged_cluster_keeps_the_model_of_its_largest_part():
    clusters = (
        Cluster(id=5, devices=frozenset({5})),
        Cluster(id=1, devices=frozenset({1, 2, 3})),
        Cluster(id=4, devices=frozenset({4})),
    )
    m = np.full((3, 3), 0.9)
    out, rows = stochastic_merge(m, clusters, np.array([5, 3]), tau=0.5)  # 4 not sampled
    assert [(c.id, sorted(c.devices)) for c in out] == [(1, [1, 2, 3, 5]), (4, [4])]
    assert rows.tolist() == [1, 2]


def test_admit_makes_first_seen_clients_singletons_served_by_omega():
    clusters, rows = admit_clients(_singletons(3), np.array([0, 3, 7]))
    assert [(c.id, sorted(c.devices)) for c in clusters] == [(3, [3]), (0, [0]), (7, [7])]
    assert rows.tolist() == [0, -1, -1]


def test_repeated_partial_rounds_end_in_the_true_groups():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(3), 4)
    Ψ = np.eye(16)[groups] + 0.1 * rng.normal(size=(12, 16))  # cos ≈ 0.86 within groups, ≈ 0 across
    clusters: tuple[Cluster, ...] = ()
    Σ = np.zeros((0, 16))
    for _ in range(30):
        sampled = np.sort(rng.choice(12, size=4, replace=False))
        known = set().union(*(c.devices for c in clusters))
        clusters, _ = admit_clients(clusters, sampled)
        Σ = np.concatenate([Σ, Ψ[[d for d in sampled if d not in known]]])
        out, _ = stochastic_merge(cosine_similarity(Σ), clusters, sampled, tau=0.5)
        Σ = merge_sums(Σ, clusters, out)
        untouched = [c for c in clusters if not c.devices & set(sampled.tolist())]
        assert all(c in out for c in untouched)  # unsampled clusters are left alone
        assert all(len(set(groups[sorted(c.devices)])) == 1 for c in out)  # never mixes groups
        clusters = out
        # each cluster's row is the sum of its clients' Ψ (Alg. 1 line 10)
        np.testing.assert_allclose(Σ, [Ψ[sorted(c.devices)].sum(axis=0) for c in clusters], rtol=1e-12)
    assert {c.devices for c in clusters} == {frozenset(np.flatnonzero(groups == g).tolist()) for g in range(3)}


def test_merge_sums_adds_the_rows_of_the_parts():
    before = (Cluster(id=0, devices=frozenset({0, 5})), *_singletons(1, 2, 3))
    after = (Cluster(id=0, devices=frozenset({0, 5, 2})), Cluster(id=1, devices=frozenset({1, 3})))
    Σ = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.5], [0.25, 0.25]])
    np.testing.assert_array_equal(merge_sums(Σ, before, after), [[4.0, 0.5], [0.25, 2.25]])
    assert merge_sums(Σ, before, before) is Σ  # nothing merged: no copy


def test_cosine_similarity_of_constructed_rows():
    a = np.array([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(cosine_similarity(a), [[1.0, 0.8, 0.6], [0.8, 1.0, 0.0], [0.6, 0.0, 1.0]],
                               atol=1e-7)
    np.testing.assert_allclose(cosine_similarity(a[:1], -a), [[-1.0, -0.8, -0.6]], atol=1e-7)


@pytest.fixture(scope="module")
def s2(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    return fed, Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def test_representation_is_the_full_batch_gradient_of_the_anchor(s2):
    _, engine = s2
    ψ = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    Ψ = data_representations(engine, ψ, np.array([2, 7]), chunk=1)
    model = engine.model
    for row, d in enumerate([2, 7]):
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(ψ[k][0])
        n = int(engine.data.train.counts[d])
        loss = F.cross_entropy(model(engine.data.train.x[d, :n]), engine.data.train.y[d, :n])
        grads = torch.autograd.grad(loss, list(model.parameters()))
        names = [k for k, _ in model.named_parameters()]
        expected = torch.cat([dict(zip(names, grads))[k].flatten() for k in ψ])
        np.testing.assert_allclose(Ψ[row], expected.numpy(), rtol=1e-4, atol=1e-6)


def test_one_round_trains_omega_by_fedavg_and_theta_pulled_to_omega(s2):
    """Alg. 1 lines 18–30 with full batches (no sampling noise): ω averages plain local
    SGD from ω_0; θ_k starts at ω_0 (new clusters) with the pull λ(θ − ω_0)."""
    fed, engine = s2
    algo = StoCFL(rounds=1, participation=1.0, lam=0.5, local_epochs=3)
    result = algo.fit(engine, seed=4)
    assert engine.training.batch_size == 10  # the engine's own setting is restored
    full = Engine(fed, training=replace(engine.training, batch_size=int(engine.data.train.counts.max())), device="cpu")
    _, gen = generators(4)
    ω0 = full.init_params(1, gen, distinct=False)
    devices = np.arange(fed.n_devices)
    ω1 = full.train(ω0, np.zeros(fed.n_devices, dtype=np.int64), devices, gen, local_epochs=3).params
    k = len(result.clusters)
    start = {name: v.expand(k, *v.shape[1:]).clone() for name, v in ω0.items()}
    penalty = QuadraticPenalty(
        weight={name: torch.full_like(v, 0.5) for name, v in start.items()}, center=start
    )
    θ1 = full.train(start, result.model_of_device, devices, gen, local_epochs=3, penalty=penalty).params
    for name in ω0:
        torch.testing.assert_close(algo.global_params_[name], ω1[name], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(result.params[name], θ1[name], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(θ1["output.weight"][0], ω1["output.weight"][0], atol=1e-4)


def test_clients_not_sampled_yet_are_served_by_omega(s2):
    _, engine = s2
    algo = StoCFL(rounds=1, participation=0.25)
    result = algo.fit(engine, seed=2)
    seen = sorted(set().union(*(c.devices for c in result.clusters[:-1])))
    assert len(seen) == 3  # 3 of 12 clients sampled
    last = result.clusters[-1]
    assert last.id == -1 and sorted(last.devices) == sorted(set(range(12)) - set(seen))
    for name, v in algo.global_params_.items():
        assert torch.equal(result.params[name][-1], v[0])
    assert np.isnan(algo.cluster_representations_[-1]).all()


@pytest.fixture(scope="module")
def fitted(s2):
    _, engine = s2
    algo = StoCFL(rounds=15, participation=0.5, tau=0.5, lam=0.05, local_epochs=5)
    return algo, algo.fit(engine, seed=1)


def test_recovers_the_three_s2_groups_with_half_participation(s2, fitted):
    fed, engine = s2
    algo, result = fitted
    assert result.n_clusters == 3
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert len(result.history) == 15
    # round 1: 6 first-seen clients get ψ and send Ψ (one model's size each),
    # and all 6 download and upload ω and θ_k
    size = model_bytes(result.params)
    assert (result.history[0]["bytes_down"], result.history[0]["bytes_up"]) == (18 * size, 18 * size)
    assert result.history[-1]["bytes_down"] == 12 * size  # everyone seen: ω and θ_k only
    # Eq. (2): each cluster's representation is the mean Ψ of its clients, kept as a sum
    Ψ = data_representations(engine, algo.anchor_)
    expected = [Ψ[sorted(c.devices)].mean(axis=0) for c in result.clusters]
    np.testing.assert_allclose(algo.cluster_representations_, expected, rtol=1e-4, atol=1e-7)


def test_newcomers_join_the_cluster_of_their_group(digits, s2, fitted):
    fed, _ = s2
    algo, result = fitted
    newcomers = build_scenario(digits, "S2", group_sizes=[2, 2, 2], seed=99)
    engine = Engine(newcomers, training=TrainingConfig(lr=0.05), device="cpu")
    rows = algo.assign_newcomers(engine, seed=0)
    for d, row in enumerate(rows):
        members = sorted(result.clusters[row].devices)
        assert set(fed.groups[members]) == {newcomers.groups[d]}
    assert (algo.newcomer_similarity(engine).max(axis=1) > algo.tau).all()  # joins, no new cluster


def test_movement_representation_is_the_anchor_before_minus_after_local_sgd(digits):
    """The authors' code's Ψ for one round on 2 devices: ψ − ψ_i after 2 full-batch
    epochs of plain SGD (η 0.05, no weight decay), computed by hand with autograd."""
    fed = build_scenario(digits, "S2", group_sizes=[1, 1], seed=3)
    engine = Engine(fed, training=TrainingConfig(lr=0.05, l2=0.0), device="cpu")
    # τ = 1: no merge, so each client's cluster representation is its own Ψ
    algo = StoCFL(rounds=1, participation=1.0, tau=1.0, representation="movement",
                  representation_epochs=2, representation_batch_size=None)
    result = algo.fit(engine, seed=5)
    assert [sorted(c.devices) for c in result.clusters] == [[0], [1]]
    ψ = algo.anchor_
    model = engine.model
    names = [k for k, _ in model.named_parameters()]
    for d in range(2):
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(ψ[k][0])
        n = int(engine.data.train.counts[d])
        for _ in range(2):
            loss = F.cross_entropy(model(engine.data.train.x[d, :n]), engine.data.train.y[d, :n])
            grads = dict(zip(names, torch.autograd.grad(loss, list(model.parameters()))))
            with torch.no_grad():
                for k, p in model.named_parameters():
                    p -= 0.05 * grads[k]
        after = dict(model.named_parameters())
        expected = torch.cat([(ψ[k][0] - after[k].detach()).flatten() for k in ψ])
        np.testing.assert_allclose(algo.cluster_representations_[d], expected.numpy(), rtol=1e-4, atol=1e-7)
    # one full-batch epoch without weight decay moves the anchor by η·∇ (the paper's Ψ)
    one = StoCFL(rounds=1, participation=1.0, tau=1.0, representation="movement",
                 representation_epochs=1, representation_batch_size=None)
    one.fit(engine, seed=5)
    np.testing.assert_allclose(one.cluster_representations_, 0.05 * data_representations(engine, one.anchor_),
                               rtol=1e-4, atol=1e-7)


def test_representation_option_is_checked_by_name():
    with pytest.raises(ValueError, match="StoCFL.representation: "):
        StoCFL(representation="weights")
    with pytest.raises(ValueError, match="StoCFL.representation_epochs"):
        StoCFL(representation="movement", representation_epochs=0)
