"""The continual driver's checkpoints: a rerun resumes only its own run's timesteps."""

import numpy as np
import pytest

from clusterfed import stages
from clusterfed.config import parse_params
from clusterfed.continual.baselines import ContinualFedAvg
from clusterfed.continual.driver import run_continual
from clusterfed.continual.schedules import make_schedule
from clusterfed.continual.state import timestep_seed
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.layout import RunLayout, saved_checkpoints
from clusterfed.scenarios import federation_from_concepts
from clusterfed.snapshot import StaleCheckpoint


def _run(digits, schedule, directory, fingerprint, stop_after=None):
    """Run continual FedAvg; returns (rows, timesteps computed rather than resumed)."""
    computed = []

    def engine_at(t):
        computed.append(t)
        fed = federation_from_concepts(digits, "S2", schedule[:, t], seed=timestep_seed(10, t), n_concepts=2,
                                       samples_per_device=60, test_samples_per_device=20)
        return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")

    rows, _ = run_continual(ContinualFedAvg(rounds=1), engine_at, schedule, seed=10, checkpoint_dir=directory,
                            fingerprint=fingerprint, stop_after=stop_after)
    return rows, computed


def test_a_run_of_new_settings_replaces_the_old_checkpoints_and_resumes_its_own(digits, tmp_path):
    schedule = make_schedule("sequential", 4, 4)
    _run(digits, schedule, tmp_path, "old settings")  # a finished run leaves t = 0..4 behind
    with pytest.warns(StaleCheckpoint, match=r"5 timestep checkpoint\(s\) written with other parameters.*deleting them now"):
        _, computed = _run(digits, schedule, tmp_path, "new settings", stop_after=1)  # interrupted after t = 1
    assert computed == [0, 1]
    assert len(saved_checkpoints(tmp_path)) == 2  # the old run's timesteps are gone, not mixed in
    rows, computed = _run(digits, schedule, tmp_path, "new settings")
    assert computed == [2, 3, 4]  # resumed after t = 1 (the old run's t = 4 no longer blocks it)
    full, _ = _run(digits, schedule, tmp_path / "uninterrupted", "new settings")
    assert rows == full


def test_a_finished_run_is_not_recomputed(digits, tmp_path):
    schedule = make_schedule("multitask", 4, 3)
    rows, _ = _run(digits, schedule, tmp_path, "same")
    again, computed = _run(digits, schedule, tmp_path, "same")
    assert computed == [] and again == rows
    assert [r["t"] for r in rows] == [0, 1, 2, 3] and np.isfinite([r["accuracy"] for r in rows]).all()


def test_a_past_timestep_reloads_as_it_was_saved(digits, tmp_path):
    from clusterfed.continual.checkpoint import load_checkpoint

    schedule = make_schedule("multitask", 4, 3)
    rows, _ = _run(digits, schedule, tmp_path, "same")
    for t in range(4):
        state = load_checkpoint(tmp_path, t)
        ids = [c.id for c in state.clustering.clusters]
        assert [ids[m] for m in state.clustering.model_of_device(4)] == rows[t]["cluster_of_device"]
    with pytest.raises(FileNotFoundError, match=r"t_004.*no checkpoint of timestep 4"):
        load_checkpoint(tmp_path, 4)


def test_the_stage_keeps_exactly_the_runs_the_parameters_ask_for(tmp_path):
    """DVC persists the stage's outputs (for the checkpoints), so a method or seed taken
    out of the parameters must be deleted by the stage itself."""
    def params(algorithms, seeds):
        return parse_params({
            "seeds": seeds, "scenario": {"name": "S2", "group_sizes": [2, 2]}, "training": {"lr": 0.05, "device": "cpu"},
            "continual": {"algorithms": algorithms, "timesteps": 1, "rounds": 1, "samples_per_device": 30,
                          "test_samples_per_device": 10},
            "unsupervised": {"enabled": False},
        })

    layout = RunLayout(tmp_path)
    stages.continual(params(["fedavg", "fedprox_ewc"], [10, 55]), layout, progress=False)
    kept = layout.continual_run("fedavg", 10).timesteps.read_bytes()
    stages.continual(params(["fedavg"], [10]), layout, progress=False)
    runs = sorted(str(p.relative_to(layout.continual)) for p in layout.continual.glob("*/seed_*"))
    assert runs == ["fedavg/seed_10"]
    assert not (layout.continual / "fedprox_ewc").exists()
    assert layout.continual_run("fedavg", 10).timesteps.read_bytes() == kept  # resumed, not redone
    stages.continual(params(["fedavg"], [55]), layout, progress=False, keep_other_runs=True)  # as the benchmarks gather runs
    assert sorted(str(p.relative_to(layout.continual)) for p in layout.continual.glob("*/seed_*")) == [
        "fedavg/seed_10", "fedavg/seed_55"]
