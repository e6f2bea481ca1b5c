"""The oracle ``centralized``: what each group's model pools, under the thesis
reading and under the authors' construction (their A1 "Centralize" trains the noisy
devices' model on every device's data)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clusterfed.algorithms import Centralized
from clusterfed.algorithms.protocol import Context
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import Federation, build_authors_scenario, build_scenario


def _pools(fed):
    return [p.tolist() for p in fed.oracle_pools]


def _engine(fed):
    return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def test_authors_pools_follow_their_centralize_script(digits, tmp_path):
    a1 = build_authors_scenario(digits, "A1", seed=10)  # 10 devices, even ones noisy
    assert _pools(a1) == [[1, 3, 5, 7, 9], list(range(10))]
    a2 = build_authors_scenario(digits, "A2", seed=10)  # 5 devices, even ones scarce
    assert _pools(a2) == [[1, 3], [0, 1, 2, 4]]  # their loop also appends device 1
    s1 = build_authors_scenario(digits, "S1", seed=10)
    assert _pools(s1) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]  # S1's group 0 = labels 0-4 = even devices
    s2 = build_authors_scenario(digits, "S2", seed=10)
    assert _pools(s2) == [[1, 3, 5, 7, 9], [0, 2, 4, 6, 8]]
    thesis = build_scenario(digits, "A1", group_sizes=[2, 3], seed=1)
    assert _pools(thesis) == [[0, 1], [2, 3, 4]]
    a1.save(tmp_path / "a1.npz")
    assert _pools(Federation.load(tmp_path / "a1.npz")) == _pools(a1)
    # a subset (newcomers held out) renumbers the pools and keeps only its devices
    assert _pools(a1.subset([0, 2, 3])) == [[2], [0, 1, 2]]
    assert _pools(a2.subset([1, 2])) == [[0], [0, 1]]
    with pytest.raises(ValueError, match="description.oracle_pools"):
        Federation(**{**a1.__dict__, "description": {"oracle_pools": [[0, 1], [12]]}})


def test_a1_noisy_model_trains_on_every_device_under_the_authors_construction(digits):
    fed = build_authors_scenario(digits, "A1", seed=10)
    engine = _engine(fed)
    n_train = np.array([d.n_train for d in fed.devices])
    ctx = Context(np.random.default_rng(0), torch.Generator(), ground_truth=fed.groups, oracle_pools=fed.oracle_pools)
    state = Centralized(rounds=1).init(engine, ctx)
    assert state.data.counts.tolist() == [int(n_train[1::2].sum()), int(n_train.sum())] == [544, 1126]
    pooled = state.data.x[1, :1126].reshape(1126, -1)
    clipped = (pooled.abs() <= 1.0).all(1)  # noisy images are clipped to [-1, 1], clean ones are not
    assert int(clipped.sum()) == int(n_train[0::2].sum()) == 582
    thesis = Centralized(rounds=1).init(engine, Context(np.random.default_rng(0), torch.Generator(),
                                                        ground_truth=fed.groups))
    assert thesis.data.counts.tolist() == [544, 582]  # the thesis reading: each group's own devices
    assert [sorted(c.devices) for c in state.clustering.clusters] == [[1, 3, 5, 7, 9], [0, 2, 4, 6, 8]]


def test_pools_change_the_noisy_model_not_whom_it_serves(digits):
    fed = build_authors_scenario(digits, "A1", seed=10)
    authors = Centralized(rounds=3).fit(_engine(fed), seed=2, ground_truth=fed.groups, oracle_pools=fed.oracle_pools)
    own = Centralized(rounds=3).fit(_engine(fed), seed=2, ground_truth=fed.groups)
    for result in (authors, own):
        assert [sorted(c.devices) for c in result.clusters] == [[1, 3, 5, 7, 9], [0, 2, 4, 6, 8]]
    key = next(iter(own.params))
    assert not torch.equal(authors.params[key][1], own.params[key][1])
    noisy = fed.groups == 1
    assert authors.device_accuracy[noisy].tolist() != own.device_accuracy[noisy].tolist()


def test_the_thesis_reading_is_unchanged_by_its_own_pools(digits):
    fed = build_scenario(digits, "A1", group_sizes=[3, 3], seed=1)
    a = Centralized(rounds=2).fit(_engine(fed), seed=4, ground_truth=fed.groups, oracle_pools=fed.oracle_pools)
    b = Centralized(rounds=2).fit(_engine(fed), seed=4, ground_truth=fed.groups)
    assert a.history == b.history
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    with pytest.raises(ValueError, match="oracle_pools: 1 pools for 2"):
        Centralized(rounds=1).fit(_engine(fed), seed=4, ground_truth=fed.groups, oracle_pools=(np.arange(6),))
