"""Continual baselines: FedDrift's drift/merge rules and FedProx-EWC's penalty, on digits."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfed.continual.baselines import FedDrift, FedProxEWC
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import QuadraticPenalty, local_sgd
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.scenarios import federation_from_concepts

KW = dict(n_concepts=2, samples_per_device=120, test_samples_per_device=30)


def _engine(digits, concepts, seed):
    fed = federation_from_concepts(digits, "S2", np.asarray(concepts), seed=seed, **KW)
    return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def test_feddrift_separates_concepts_and_founds_clusters_on_drift(digits):
    algorithm = FedDrift(delta=3.0, drift_threshold=0.5, rounds=5, init_epochs=40, detection="cluster")
    state = algorithm.cold_start(_engine(digits, [0, 0, 0, 1, 1, 1], seed=1), seed=1)
    cluster_of = state.cluster_of_device(6)
    assert adjusted_rand_score([0, 0, 0, 1, 1, 1], cluster_of) == 1.0  # δ keeps conflicting concepts apart
    concept_1_cluster = int(cluster_of[3])
    # devices 0-2 switch to concept 1: their loss jumps, they drift and found new
    # clusters, which merge into the old concept-1 cluster (distance < δ)
    state = algorithm.step(state, _engine(digits, [1, 1, 1, 1, 1, 1], seed=2), t=1, seed=1)
    assert state.cluster_of_device(6).tolist() == [concept_1_cluster] * 6


def _recurrence(digits, detection: str, **losses) -> tuple[int, set[int], list[int], set[int]]:
    """Devices 0-2 leave concept 0 at t = 1 (its cluster empties) and return at t = 2:
    (concept 0's cluster at t = 0, the cluster ids at t = 0, the clusters of devices
    0-2 at t = 2, the cluster ids at t = 2)."""
    losses = losses or dict(delta=3.0, drift_threshold=0.5)
    algorithm = FedDrift(rounds=5, init_epochs=40, detection=detection, **losses)
    state = algorithm.cold_start(_engine(digits, [0, 0, 0, 1, 1, 1], seed=1), seed=1)
    concept_0, ids_t0 = int(state.cluster_of_device(6)[0]), set(state.clustering.ids)
    state = algorithm.step(state, _engine(digits, [1, 1, 1, 1, 1, 1], seed=2), t=1, seed=1)
    assert [c.devices for c in state.clustering.clusters if c.id == concept_0] == [frozenset()]  # kept, empty
    state = algorithm.step(state, _engine(digits, [0, 0, 0, 1, 1, 1], seed=3), t=2, seed=1)
    return concept_0, ids_t0, state.cluster_of_device(6)[:3].tolist(), set(state.clustering.ids)


@pytest.mark.parametrize("losses", [{}, dict(loss="zero_one", delta=15.0, drift_threshold=15.0)], ids=["nats", "error"])
def test_feddrift_best_detection_reuses_the_model_of_a_recurring_concept(digits, losses):
    """FedDrift's drift test reads the best existing model's loss: devices whose
    concept recurs go back to the cluster that learnt it, though it has no devices;
    under ``cluster`` they drift from their own cluster's model and found a new
    cluster, which cannot merge with an empty one. Both with cross-entropy and with
    the error in points (the authors' accuracies) as the loss."""
    concept_0, ids_t0, back, ids_t2 = _recurrence(digits, "best", **losses)
    assert len(ids_t0) == 2 and back == [concept_0] * 3
    assert ids_t2 == ids_t0  # no cluster founded after t = 0

    concept_0, ids_t0, back, ids_t2 = _recurrence(digits, "cluster", **losses)
    assert len(ids_t0) == 2 and len(set(back)) == 1
    assert back[0] not in ids_t0 and concept_0 in ids_t2  # a new cluster beside the old, empty one


def test_quadratic_penalty_adds_its_gradient_to_the_step(digits):
    engine = _engine(digits, [0, 1], seed=3)
    params = engine.init_params(2, torch.Generator().manual_seed(0), distinct=True)
    data = engine.data.train
    one_batch = PaddedSplit(x=data.x[:, :10], y=data.y[:, :10], counts=torch.tensor([10, 10]))
    center = engine.init_params(2, torch.Generator().manual_seed(5), distinct=True)
    weight = {k: torch.full_like(v, 0.3) for k, v in params.items()}
    kw = dict(epochs=1, lr=0.05, l2=0.001, batch_size=10)
    plain = local_sgd(engine.model, params, one_batch, torch.arange(2), generator=torch.Generator().manual_seed(1), **kw)
    pulled = local_sgd(
        engine.model, params, one_batch, torch.arange(2), generator=torch.Generator().manual_seed(1),
        penalty=QuadraticPenalty(weight, center), **kw,
    )
    for k in params:
        expected = plain[k] - 0.05 * 0.3 * (params[k] - center[k])
        torch.testing.assert_close(pulled[k], expected, rtol=1e-5, atol=1e-6)


def test_fedprox_ewc_accumulates_fisher_and_anchors(digits):
    algorithm = FedProxEWC(mu=0.01, ewc_lambda=10.0, rounds=3)
    state = algorithm.cold_start(_engine(digits, [0, 0, 0, 0], seed=4), seed=4)
    first = {k: v.clone() for k, v in state.extras["fisher"].items()}
    assert all((v >= 0).all() and v.sum() > 0 for v in first.values())
    state = algorithm.step(state, _engine(digits, [1, 1, 1, 1], seed=5), t=1, seed=4)
    for k, v in state.extras["fisher"].items():
        assert (v >= first[k]).all() and (v > first[k]).any()  # summed over timesteps
        torch.testing.assert_close(state.extras["anchor"][k], state.clustering.params[k])


def test_each_timestep_row_counts_the_uploads_its_engine_calls_rejected(digits, tmp_path):
    """Device 2's data is NaN at every timestep: FedProx-EWC's rounds reject its
    model upload and its Fisher estimate (``remember``, a hook) — the driver's tally
    sees both, with no counter in the method."""
    from clusterfed.continual.baselines import FedProxEWC
    from clusterfed.continual.driver import run_continual
    from clusterfed.continual.schedules import make_schedule
    from clusterfed.continual.state import timestep_seed
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios import federation_from_concepts

    schedule = make_schedule("multitask", 4, 2)

    def engine_at(t):
        fed = federation_from_concepts(digits, "S2", schedule[:, t], seed=timestep_seed(10, t), n_concepts=2,
                                       samples_per_device=120, test_samples_per_device=30)
        engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
        engine.data.train.x[2] = float("nan")  # a test may poison the data; methods may not touch it
        return engine

    rows, _ = run_continual(FedProxEWC(rounds=3), engine_at, schedule, seed=10, checkpoint_dir=tmp_path,
                            fingerprint="test")
    assert [r["rejected_updates"] for r in rows] == [3 + 1] * 3  # 3 rounds + the Fisher, per timestep


def test_feddrift_founders_can_start_from_the_best_kept_model(digits):
    """``founder_init=best`` (FedDrift's code): a drifted device's new model is the kept
    model with its lowest loss, then trained ``init_epochs`` on the device alone."""
    from clusterfed.algorithms.base import generators
    from clusterfed.algorithms.protocol import Context

    algorithm = FedDrift(rounds=5, init_epochs=40, detection="cluster", founder_init="best")
    state = algorithm.cold_start(_engine(digits, [0, 0, 0, 1, 1, 1], seed=1), seed=1)
    engine = _engine(digits, [1, 1, 1, 1, 1, 1], seed=2)
    assigned = algorithm.assign(state, engine, Context(*generators(5)))
    founded = [i for i, c in enumerate(assigned.clusters) if c.id >= state.clustering.next_id()]
    founders = [min(assigned.clusters[i].devices) for i in founded]
    assert founders == [0, 1, 2]  # they left concept 0: drift under their own cluster's model
    best = engine.mean_losses(state.clustering.params, "val").numpy().argmin(0)[founders]
    assert best.tolist() == [state.clustering.model_of_device(6)[3]] * 3  # concept 1's model
    start = {k: v[torch.as_tensor(best)] for k, v in state.clustering.params.items()}
    expected = engine.train(start, np.arange(3), np.asarray(founders), Context(*generators(5)).generator,
                            local_epochs=40).params
    for k, v in expected.items():
        torch.testing.assert_close(assigned.params[k][founded], v, rtol=0, atol=0)
