"""C-FAACL's concept searches (thesis Alg. 8–9), recurrence and resumption, on digits."""

import shutil

import numpy as np
import pytest
import torch

from clusterfed.algorithms import Cluster, Clustering
from clusterfed.config import ParamsError, parse_params
from clusterfed.continual.cfaacl import CFAACL, global_concept_search, local_concept_search
from clusterfed.continual.driver import concept_reuse_rate, run_continual
from clusterfed.continual.memory import Memory, MemoryEntry
from clusterfed.continual.schedules import make_schedule, recurrences, validate_schedule
from clusterfed.continual.state import timestep_seed
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.stacked import take
from clusterfed.scenarios import federation_from_concepts

CONCEPT_KW = dict(n_concepts=2, samples_per_device=120, test_samples_per_device=30)


def _engine(digits, concepts, seed):
    fed = federation_from_concepts(digits, "S2", np.asarray(concepts), seed=seed, **CONCEPT_KW)
    return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


@pytest.fixture(scope="module")
def concept_models(digits):
    """Cluster 0 trained on concept 0 (devices 0-1), cluster 1 on concept 1 (devices 2-3),
    and, at a new timestep, fresh local models of devices holding concepts [1, 0, 0, 1]."""
    past = _engine(digits, [0, 0, 1, 1], seed=1)
    gen = torch.Generator().manual_seed(0)
    params = past.init_params(2, gen, distinct=False)
    for _ in range(40):
        params = past.train(params, np.array([0, 0, 1, 1]), np.arange(4), gen).params
    memory = Memory.empty(4)
    val = past.data.val
    for d in range(4):
        n = int(val.counts[d])
        memory.device[d].append(MemoryEntry(0, d // 2, val.x[d, :n].numpy(), val.y[d, :n].numpy()))
        memory.cluster.setdefault(d // 2, {}).setdefault(0, []).append(d)
    clustering = Clustering((Cluster(0, frozenset({0, 1})), Cluster(1, frozenset({2, 3}))), params)
    now = _engine(digits, [1, 0, 0, 1], seed=2)
    local = now.train(now.init_params(4, gen, distinct=False), np.arange(4), np.arange(4), gen, local_epochs=40).params
    own = now.own_losses(local, np.arange(4), "val").numpy()
    cluster_val = now.losses(params, "val").numpy()
    return now, clustering, memory, local, own, cluster_val


def _search(fn, concept_models, d):
    now, clustering, memory, local, own, cluster_val = concept_models
    n = int(now.data.val.counts[d])
    return fn(d, now, clustering, memory, local, own[d, :n], cluster_val[:, d, :n], alpha=0.1, epsilon=0.5)


def test_local_search_finds_the_devices_own_concept_only_when_it_recurs(concept_models):
    # device 3 held concept 1 in cluster 1 and holds it again: found in its own memory
    assert _search(local_concept_search, concept_models, 3) == 1
    # device 0 held concept 0 but now holds concept 1: its memory has no match
    assert _search(local_concept_search, concept_models, 0) is None


def test_global_search_finds_a_concept_another_device_served(concept_models):
    # device 0 now holds concept 1, which cluster 1 served for devices 2-3
    assert _search(global_concept_search, concept_models, 0) == 1
    # device 2 now holds concept 0, which cluster 0 served
    assert _search(global_concept_search, concept_models, 2) == 0


def test_global_search_finds_nothing_for_an_unseen_concept(concept_models):
    now, clustering, memory, local, own, cluster_val = concept_models
    only_concept_0 = Clustering((clustering.clusters[0],), take(clustering.params, [0]))
    n = int(now.data.val.counts[0])
    found = global_concept_search(
        0, now, only_concept_0, memory, local, own[0, :n], cluster_val[:1, 0, :n], alpha=0.1, epsilon=0.5
    )
    assert found is None  # device 0's concept 1 is new to this system: Alg. 10 founds a cluster


@pytest.fixture(scope="module")
def schedule():
    return make_schedule("multitask", 6, 4)  # halves swap concepts every 2 timesteps


def _run(digits, schedule, directory, stop_after=None, local_init="fresh"):
    def engine_at(t):
        return _engine(digits, schedule[:, t], seed=timestep_seed(10, t))

    algorithm = CFAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=5, local_init=local_init)
    return run_continual(
        algorithm, engine_at, schedule, seed=10, checkpoint_dir=directory, fingerprint="test", stop_after=stop_after
    )


@pytest.mark.parametrize("local_init", ["fresh", "cluster"])
def test_recurring_concepts_return_to_their_old_clusters(digits, schedule, tmp_path, local_init):
    """Either start of the devices' new models (``local_init``) finds every recurrence."""
    rows, state = _run(digits, schedule, tmp_path, local_init=local_init)
    first = rows[0]["cluster_of_device"]
    assert len(set(first)) == 2  # the cold start separates the two concepts
    served = {schedule[d, 0]: first[d] for d in range(6)}
    for t in (2, 4):  # concepts swapped: each device must move to the other old cluster
        assert rows[t]["cluster_of_device"] == [state.memory.resolve(served[c]) for c in schedule[:, t]]
    assert concept_reuse_rate(rows, schedule, state.memory.resolve) == 1.0
    assert all(r["accuracy"] > 0.85 for r in rows)


def test_resume_after_interruption_equals_uninterrupted_run(digits, schedule, tmp_path):
    full_rows, full_state = _run(digits, schedule, tmp_path / "full")
    _run(digits, schedule, tmp_path / "resumed", stop_after=2)  # "interrupted" after t = 2
    shutil.rmtree(tmp_path / "resumed" / "t_002")  # and its last checkpoint was lost
    rows, state = _run(digits, schedule, tmp_path / "resumed")
    assert rows == full_rows
    for k, v in full_state.clustering.params.items():
        torch.testing.assert_close(state.clustering.params[k], v, rtol=0, atol=0)


def test_schedules_have_the_documented_shape_and_recurrences():
    seq = make_schedule("sequential", 3, 10)
    assert seq.shape == (3, 11) and (seq == seq[0]).all()
    assert seq[0].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1]
    multi = make_schedule("multitask", 4, 10)
    assert (multi[:2] != multi[2:]).all()  # the halves always hold different concepts
    assert (1, 2) not in recurrences(seq) and (0, 4) in recurrences(seq)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([[0, 1, 0]] * 3, r"shape \(3, 3\), expected \(4, 3\)"),
        ([[0, 1], [0, 1, 0]], "rows have different lengths"),
        ([[0, 1, 2]] * 4, r"unknown concept\(s\) \[2\]"),
        ([[0.5, 1, 0]] * 4, "concept ids must be integers"),
    ],
)
def test_bad_schedules_are_refused_with_a_clear_message(schedule, message):
    with pytest.raises(ValueError, match=message):
        validate_schedule(schedule, n_devices=4, timesteps=2, n_concepts=2)


def test_bad_schedule_in_params_names_the_key():
    with pytest.raises(ParamsError, match="continual.schedule: shape"):
        parse_params({"continual": {"timesteps": 2, "schedule": [[0, 1, 0]]}})


def test_local_init_cluster_starts_each_devices_new_model_from_its_cluster(digits, monkeypatch):
    """``local_init=cluster``: Alg. 8's "train new model d.θ" fine-tunes the model of
    the cluster the device had at t − 1."""
    from clusterfed.algorithms.base import generators
    from clusterfed.algorithms.protocol import Context

    algorithm = CFAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=2, max_rounds=1, local_init="cluster")
    state = algorithm.cold_start(_engine(digits, [0, 0, 0, 1, 1, 1], seed=1), seed=1)
    rows = state.clustering.model_of_device(6)
    assert len(set(rows.tolist())) > 1  # several cluster models, so the devices' starts differ
    engine = _engine(digits, [1, 1, 1, 0, 0, 0], seed=2)
    starts = []
    train = engine.train

    def recording_train(params, *args, **kwargs):
        starts.append({k: v.clone() for k, v in params.items()})
        return train(params, *args, **kwargs)

    monkeypatch.setattr(engine, "train", recording_train)
    algorithm.arrive(state, engine, 1, Context(*generators(5)))
    expected = take(state.clustering.params, rows.tolist())
    for k, v in expected.items():  # the first training of the timestep is the devices' new models
        torch.testing.assert_close(starts[0][k], v, rtol=0, atol=0)
