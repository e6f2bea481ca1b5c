"""The engine on a GPU trains what it trains on the CPU.

Every random draw (sample orders, dropout masks, initial weights, participants) comes
from CPU generators and is moved to the device, so a CUDA run follows the CPU run's
steps and differs only by float rounding. These tests run only where CUDA is present
(a lent GPU machine: ``python3 -m pytest tests/test_cuda.py``); CI has no GPU and skips
them. Digits, two rounds or timesteps: enough for cluster decisions and every local
objective (plain, proximal, composed, Adam, dropout) to run on the device.
"""

import numpy as np
import pytest
import torch

from clusterfed.algorithms import FAACL, FedAvg, FedProx, IFCA
from clusterfed.continual import CFAACL, FedProxAPD, FedProxSSGD, FedWeIT
from clusterfed.continual.driver import run_continual
from clusterfed.continual.schedules import make_schedule
from clusterfed.continual.state import timestep_seed
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario, federation_from_concepts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TRAINING = TrainingConfig(lr=0.05, l2=0.001, batch_size=10)
GPU = "cuda"
ATOL = 1e-4  # float rounding over a few hundred steps; a different draw moves weights by ~1e-2


def _close(cpu: dict, gpu: dict) -> float:
    """The largest |difference| between two parameter dicts (GPU tensors brought back)."""
    assert cpu.keys() == gpu.keys()
    return max(float((cpu[k] - gpu[k].cpu()).abs().max()) for k in cpu)


@pytest.mark.parametrize("method", [FedAvg(rounds=2), FedProx(rounds=2, mu=0.1), IFCA(rounds=2, n_clusters=2),
                                    FAACL(rounds=4, init_epochs=2)], ids=lambda m: m.name)
def test_a_coldstart_fit_on_cuda_equals_the_cpu_fit(digits, method):
    fed = build_scenario(digits, "S2", group_sizes=[3, 3], seed=1)
    runs = [method.fit(Engine(fed, hidden=32, training=TRAINING, device=d), seed=3) for d in ("cpu", GPU)]
    cpu, gpu = runs
    assert [c.devices for c in cpu.clusters] == [c.devices for c in gpu.clusters]
    np.testing.assert_array_equal(cpu.model_of_device, gpu.model_of_device)
    assert _close(cpu.params, gpu.params) < ATOL
    np.testing.assert_allclose(cpu.device_accuracy, gpu.device_accuracy, atol=0.02)  # a borderline test sample


@pytest.mark.parametrize("method", [CFAACL(rounds=2), FedWeIT(rounds=2), FedProxAPD(rounds=2),
                                    FedProxSSGD(rounds=2)], ids=lambda m: m.name)
def test_continual_timesteps_on_cuda_equal_the_cpu_ones(digits, method, tmp_path):
    schedule = make_schedule("multitask", 4, 2)

    def run(device):
        def engine_at(t):
            fed = federation_from_concepts(digits, "S2", schedule[:, t], seed=timestep_seed(10, t), n_concepts=2,
                                           samples_per_device=120, test_samples_per_device=30)
            return Engine(fed, hidden=32, training=TRAINING, device=device)

        return run_continual(method, engine_at, schedule, seed=10, checkpoint_dir=tmp_path / device,
                             fingerprint=device)

    (cpu_rows, cpu), (gpu_rows, gpu) = run("cpu"), run(GPU)
    assert [r["n_clusters"] for r in cpu_rows] == [r["n_clusters"] for r in gpu_rows]
    np.testing.assert_allclose([r["accuracy"] for r in cpu_rows], [r["accuracy"] for r in gpu_rows], atol=0.02)
    assert _close(cpu.clustering.params, gpu.clustering.params) < ATOL
