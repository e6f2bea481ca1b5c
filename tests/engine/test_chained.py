"""Sequential visits (``Engine.chained_models``, ``train(visit="sequential")``) on digits:
each pair starts from the model the previous pair of its model uploaded."""

import numpy as np
import pytest
import torch

from clusterfed.algorithms.baselines import FedAvg
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.stacked import take
from clusterfed.scenarios import build_scenario


@pytest.fixture
def engine(digits):
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)  # devices of different sizes
    return Engine(fed, hidden=32, training=TrainingConfig(lr=0.05, l2=0.001, batch_size=10), device="cpu")


def _equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _reference_chain(engine, start, devices, seed, skip=()):
    """Each device alone, in turn, from what the last accepted one uploaded."""
    gen = torch.Generator().manual_seed(seed)
    current, uploads = start, []
    for d in devices:
        out = engine.local_models(current, np.array([0]), np.array([d]), gen)
        uploads.append(out.params)
        if d not in skip:
            current = out.params
    return {k: torch.cat([u[k] for u in uploads]) for k in uploads[0]}


def test_one_chain_equals_the_devices_trained_in_turn(engine):
    start = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    devices = np.array([4, 0, 5, 2])
    chained = engine.chained_models(start, np.zeros(4, dtype=np.int64), devices, torch.Generator().manual_seed(7))
    assert chained.n_rejected == 0 and chained.devices.tolist() == devices.tolist()
    assert _equal(chained.params, _reference_chain(engine, start, devices, seed=7))
    # the same draws from the server's model give another second upload
    gen = torch.Generator().manual_seed(7)
    engine.local_models(start, np.array([0]), devices[:1], gen)
    from_server = engine.local_models(start, np.array([0]), devices[1:2], gen).params
    assert not _equal(take(chained.params, [1]), from_server)


def test_train_averages_each_models_own_chain(engine):
    """Two models' pairs interleaved: each chain starts from its own row, and each model
    becomes the |Z^train|-weighted average of its chain's uploads."""
    start = engine.init_params(2, torch.Generator().manual_seed(0), distinct=True)
    models, devices = np.array([1, 0, 1, 0, 1]), np.array([0, 1, 2, 3, 4])
    chained = engine.chained_models(start, models, devices, torch.Generator().manual_seed(3))
    first = engine.local_models(start, np.array([1, 0]), devices[:2], torch.Generator().manual_seed(3))
    assert _equal(take(chained.params, [0, 1]), first.params)  # step 0: both chains from their own rows
    averaged = engine.train(start, models, devices, torch.Generator().manual_seed(3), visit="sequential").params
    counts = engine.counts()[devices].astype(np.float64)
    for m in (0, 1):
        rows = np.flatnonzero(models == m)
        w = torch.as_tensor(counts[rows] / counts[rows].sum(), dtype=torch.float32)
        expected = (chained.params["output.bias"][rows] * w[:, None]).sum(0)
        assert torch.allclose(averaged["output.bias"][m], expected, atol=1e-6)


def test_a_rejected_upload_is_passed_over(engine):
    engine.data.train.x[5] = float("nan")  # device 5 uploads NaN: rejected
    start = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    devices = np.array([0, 5, 2])
    chained = engine.chained_models(start, np.zeros(3, dtype=np.int64), devices, torch.Generator().manual_seed(7))
    assert chained.rejected.tolist() == [1]
    reference = _reference_chain(engine, start, devices, seed=7, skip=(5,))
    assert _equal(take(chained.params, [0, 2]), take(reference, [0, 2]))  # device 2 went on from device 0's model


def test_fedavg_sequential_equals_parallel_with_one_device_a_round(engine):
    """A chain of one is a parallel round; with several devices a round the two differ."""
    def fit(visit, participation):
        algo = FedAvg(rounds=2, participation=participation, visit=visit)
        return algo.fit(engine, seed=5).device_accuracy

    one = 1 / engine.n_devices
    assert np.array_equal(fit("sequential", one), fit("parallel", one))
    assert not np.array_equal(fit("sequential", 1.0), fit("parallel", 1.0))


def test_train_names_a_bad_visit(engine):
    start = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    with pytest.raises(ValueError, match="visit: expected 'parallel' or 'sequential', got 'random'"):
        engine.train(start, np.array([0]), np.array([0]), torch.Generator(), visit="random")
