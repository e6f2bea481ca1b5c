"""Methods run through ``Engine(sparse_inputs=True)`` as through the dense engine: the
kernel takes the same steps up to float rounding, so on digits (S2, 8 devices, 15
rounds) every method below ends with the dense run's clusters and accuracy."""

import pytest
import torch

import clusterfed.algorithms  # noqa: F401  (registers the methods)
from clusterfed import registry
from clusterfed.engine import Engine, TrainingConfig, sparse_mlp
from clusterfed.scenarios import build_scenario


@pytest.fixture(scope="module")
def federation(digits):
    return build_scenario(digits, "S2", group_sizes=[4, 4], seed=3)


# plain steps (FedAvg, IFCA, FAACL, CFL, FeSEM) and uniform pulls (FedProx, Ditto, StoCFL, FedSoft)
@pytest.mark.parametrize("name", ["fedavg", "ifca", "faacl", "cfl", "fesem", "fedprox", "ditto", "stocfl", "fedsoft"])
def test_method_with_the_sparse_kernel_ends_where_the_dense_one_does(federation, name, monkeypatch):
    calls, real = [], sparse_mlp.train_pairs
    monkeypatch.setattr(sparse_mlp, "train_pairs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    runs = []
    for sparse in (False, True):
        engine = Engine(federation, hidden=32, training=TrainingConfig(lr=0.05, l2=0.001, batch_size=10),
                        device="cpu", sparse_inputs=sparse)
        runs.append(registry.get("coldstart", name)(rounds=15).fit(engine, seed=1))
    dense, sparse = runs
    assert calls  # the kernel trained
    assert sparse.n_clusters == dense.n_clusters
    assert (sparse.model_of_device == dense.model_of_device).all()
    assert float(sparse.device_accuracy.mean()) == pytest.approx(float(dense.device_accuracy.mean()), abs=0.01)
