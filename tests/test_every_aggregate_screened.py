"""Every built-in method's aggregates go through the one screening point (DESIGN.md §8):
with one device uploading 1e30 models, or holding NaN data (its models, Fisher
estimates, gradients and data bases are then NaN), every cold-start and continual
method, FedCRef's community FedAvg included, keeps finite, bounded models, and only
that device's uploads are rejected. (Accuracy under attack: benchmarks/poisoned_device.py.)"""

import numpy as np
import pytest
import torch

import clusterfed.build as build_module
import clusterfed.engine.engine as engine_module
from clusterfed import registry
from clusterfed.algorithms.fedcref import FedCRefParams, fedcref
from clusterfed.algorithms.fedcref.baselines import perfect_association
from clusterfed.build import build_continual_algorithm, build_schedule, timestep_engines
from clusterfed.config import parse_params
from clusterfed.continual.driver import run_continual
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario
from clusterfed.scenarios.unsupervised import make_clients

POISONED = 0
#: Short schedules: a few rounds, few local epochs, every phase reached.
FAST = {
    "faacl": {"init_epochs": 2, "max_rounds": 2}, "fedclust": {"init_epochs": 2}, "stocfl": {"local_epochs": 1},
    "flacc": {"local_epochs": 1}, "cfl": {"start_round": 1}, "flhc": {"cluster_round": 1},
    "pfedme": {"K": 1},
}


def _poison_uploads(monkeypatch, poison_uploads):
    poison_uploads(POISONED, lambda start, trained: torch.full_like(trained, 1e30))
    honest_composed = engine_module.composed_sgd  # FedWeIT, APD, Stable SGD: decomposed/dropout uploads

    def composed(model, variables, composition, data, device_idx, **kw):
        trained = honest_composed(model, variables, composition, data, device_idx, **kw)
        rows = device_idx == POISONED
        return {k: torch.where(rows.view(-1, *([1] * (v.dim() - 1))), torch.full_like(v, 1e30), v)
                for k, v in trained.items()}

    monkeypatch.setattr(engine_module, "composed_sgd", composed)


def _poison_data(engine: Engine) -> Engine:
    engine.data.train.x[POISONED] = float("nan")
    return engine


def _bounded(params) -> bool:
    return all(bool(torch.isfinite(v).all()) and float(v.abs().max()) < 1e3 for v in params.values())


@pytest.fixture(scope="module")
def fed(digits):
    return build_scenario(digits, "S2", group_sizes=[3, 3], seed=4, samples_per_device=60, test_samples_per_device=20)


@pytest.mark.parametrize("attack", ["1e30", "nan-data"])
@pytest.mark.parametrize("name", list(registry.declarations("coldstart", builtin_only=True)))
def test_cold_start_aggregates_reject_only_the_poisoned_device(name, attack, fed, monkeypatch, poison_uploads):
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    if attack == "1e30":
        _poison_uploads(monkeypatch, poison_uploads)
    else:
        _poison_data(engine)
    method = registry.get("coldstart", name)(rounds=3, **FAST.get(name, {}))
    result = method.fit(engine, seed=1, ground_truth=fed.groups)
    assert _bounded(result.params)
    rejected = np.asarray(result.rejected_by_device)
    assert (rejected[1:] == 0).all()  # no honest upload is rejected
    if name != "centralized":  # the oracle trains on pooled data: no device uploads
        assert rejected[POISONED] > 0


@pytest.mark.parametrize("attack", ["1e30", "nan-data"])
@pytest.mark.parametrize("name", list(registry.declarations("continual", builtin_only=True)))
def test_continual_aggregates_reject_only_the_poisoned_device(name, attack, monkeypatch, tmp_path, poison_uploads):
    params = parse_params({
        "seeds": [3], "scenario": {"name": "S2", "group_sizes": [3, 3]}, "training": {"lr": 0.05, "device": "cpu"},
        "continual": {"algorithms": [name], "timesteps": 2, "rounds": 2, "samples_per_device": 60,
                      "test_samples_per_device": 20},
        "unsupervised": {"enabled": False},
    })
    if attack == "1e30":
        _poison_uploads(monkeypatch, poison_uploads)
    else:
        honest = build_module.build_engine
        monkeypatch.setattr(build_module, "build_engine", lambda p, f: _poison_data(honest(p, f)))
    schedule = build_schedule(params)
    rows, state = run_continual(
        build_continual_algorithm(name, params), timestep_engines(params, schedule, 3), schedule,
        seed=3, checkpoint_dir=tmp_path, fingerprint="test",
    )
    assert _bounded(state.clustering.params)
    devices = {d for r in rows for d in r["rejected_devices"]}
    assert devices == {POISONED}


def test_fedcref_community_average_rejects_a_client_with_nan_data(digits):
    """The true association graph puts the NaN client in communities (eq. (2) would
    not associate it: ``steps.one_way_matrix``), so its NaN uploads reach the FedAvg."""
    x = digits.x_train.reshape(len(digits.x_train), -1) / digits.x_train.max()
    clients, truth = make_clients(x, digits.y_train, n_clients=4, samples_per_category=15, overlap=0.0, dirtiness=0.3,
                                  seed=2)
    clients.x[POISONED][:] = np.nan
    params = FedCRefParams(local_epochs=1, fl_rounds=2, max_iterations=2)
    result = fedcref(clients, params, seed=2, associate=perfect_association(truth))
    rejected = {c for h in result.history for c in h["rejected_clients"]}
    assert rejected == {POISONED} and len(result.communities) > 0
    assert _bounded(result.community_params)
