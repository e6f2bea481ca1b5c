"""FedProx and FedNova against FedAvg on real digits data, and FedNova's
normalised averaging on constructed updates."""

import numpy as np
import pytest
import torch

from clusterfed.algorithms import FedAvg
from clusterfed.algorithms.fednova import FedNova, local_steps, normalized_average
from clusterfed.algorithms.fedprox import FedProx
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario


@pytest.fixture(scope="module")
def a2(digits):
    fed = build_scenario(digits, "A2", group_sizes=[4, 4], seed=1)  # devices of 89 and 9 samples
    return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def _curve(result):
    return [h["accuracy"] for h in result.history]


def test_fedprox_with_mu_zero_is_fedavg_and_mu_changes_the_trajectory(a2):
    fedavg = FedAvg(rounds=5).fit(a2, seed=3)
    assert _curve(FedProx(mu=0.0, rounds=5).fit(a2, seed=3)) == _curve(fedavg)
    prox = FedProx(mu=1.0, rounds=5).fit(a2, seed=3)
    assert _curve(prox) != _curve(fedavg)
    assert prox.history == [dict(h, accuracy=p["accuracy"]) for h, p in zip(fedavg.history, prox.history)]


def test_normalized_average_on_constructed_updates():
    w = {"b": torch.zeros(1, 1)}
    trained = {"b": torch.tensor([[2.0], [4.0]])}
    # d = (w − w_i)/τ_i = (−2, −1); τ_eff = 2.5; w − τ_eff·Σ p_i d_i = 3.75 (FedAvg: 3)
    out = normalized_average(w, trained, p=np.array([1.0, 1.0]), tau=np.array([1, 4]))
    torch.testing.assert_close(out["b"], torch.tensor([[3.75]]))
    same = normalized_average(w, trained, p=np.array([1.0, 3.0]), tau=np.array([5, 5]))
    torch.testing.assert_close(same["b"], torch.tensor([[3.5]]))  # equal τ: FedAvg


def test_local_steps_count_partial_batches():
    assert local_steps(np.array([89, 9, 10, 0]), 10, 2).tolist() == [18, 2, 2, 0]


def test_fednova_is_fedavg_for_equal_sizes_and_not_otherwise(digits, a2):
    fed = build_scenario(digits, "S2", group_sizes=[3, 3], seed=1)  # equal sizes: equal τ
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    nova = FedNova(rounds=4)
    assert _curve(nova.fit(engine, seed=2)) == pytest.approx(_curve(FedAvg(rounds=4).fit(engine, seed=2)), abs=1e-6)
    result = FedNova(rounds=4).fit(a2, seed=2)
    assert len(set(local_steps(a2.data.train.counts.numpy(), 10, 1).tolist())) == 2  # unequal τ
    assert _curve(result) != _curve(FedAvg(rounds=4).fit(a2, seed=2))


def test_ifca_sampled_devices_estimate_their_identity_alone(a2, monkeypatch):
    """Only IFCA's sampled devices compute losses; their identities equal the full
    estimate's, and a round's pairs are the sampled devices with those identities."""
    import clusterfed.algorithms.baselines as baselines
    from clusterfed.algorithms import IFCA

    params = a2.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    full = baselines.estimate_identity(a2, params)
    some = np.array([1, 4, 6])
    assert baselines.estimate_identity(a2, params, some).tolist() == full[some].tolist()
    evaluated = []
    original = baselines.estimate_identity
    monkeypatch.setattr(baselines, "estimate_identity",
                        lambda e, p, d=None: evaluated.append(None if d is None else len(d)) or original(e, p, d))
    result = IFCA(n_clusters=3, rounds=4, participation=0.5).fit(a2, seed=2)
    assert evaluated[:4] == [4, 4, 4, 4] and evaluated[4:] == [None]  # 4 of 8 per round; all once at the end
    assert len(result.history) == 4


def test_ifca_restarts_recover_the_label_shifts_a_single_start_misses(digits):
    """Shifted digits (4 label shifts × 3 devices): from seeds 1 and 2 one random start
    leaves a shift without a model (3 clusters); the best of 4 starts by IFCA's
    objective finds all four (ARI 1). The 4 × 3 restart rounds are one clustering
    entry whose traffic is theirs."""
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.algorithms import IFCA
    from clusterfed.algorithms.base import model_bytes
    from clusterfed.scenarios.partitions import build_partition

    fed = build_partition(digits, "shifted", seed=0, group_sizes=[3, 3, 3, 3], samples_per_device=80)
    engine = Engine(fed, training=TrainingConfig(lr=0.1, batch_size=20), device="cpu")
    truth = np.repeat(np.arange(4), 3)

    def labels(result):
        out = np.full(12, -1)
        for i, c in enumerate(result.clusters):
            out[sorted(c.devices)] = i
        return out

    for seed in (1, 2):
        single = IFCA(n_clusters=4, rounds=40, participation=1.0).fit(engine, seed=seed)
        assert len(single.clusters) == 3 and len(single.history) == 40
        best = IFCA(n_clusters=4, rounds=40, participation=1.0, restarts=4, restart_rounds=3).fit(engine, seed=seed)
        assert adjusted_rand_score(truth, labels(best)) == 1.0
        assert len(best.history) == 41 and best.history[0]["phase"] == "clustering"
        size = model_bytes(engine.init_params(1, torch.Generator().manual_seed(0), distinct=False))
        assert best.history[0]["bytes_down"] == 4 * 3 * 12 * 4 * size  # restarts × rounds × devices × k models
        assert best.history[0]["bytes_up"] == 4 * 3 * 12 * size
