"""A continual run interrupted between timesteps, its last checkpoint lost, resumes to
exactly the uninterrupted run: every registered method, under its defaults and under
each non-default reading, on digits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from clusterfed import registry
from clusterfed.continual.driver import run_continual
from clusterfed.continual.schedules import make_schedule
from clusterfed.continual.state import timestep_seed
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import federation_from_concepts

SHORT = {"rounds": 2, "init_epochs": 1, "max_rounds": 3}  # those a method declares


def _runs() -> list[tuple[str, dict]]:
    out = []
    for name in sorted(registry.methods("continual", builtin_only=True)):
        out.append((name, {}))
        for p in registry.get("continual", name).declared():
            out += [(name, {p.name: v}) for v in p.choices or () if v != p.default]
    return out


def _run(name: str, settings: dict, digits, schedule: np.ndarray, directory, stop_after=None):
    cls = registry.get("continual", name)
    declared = {p.name for p in cls.declared()}
    method = cls(**{k: v for k, v in SHORT.items() if k in declared}, **settings)

    def engine_at(t: int) -> Engine:
        fed = federation_from_concepts(digits, "S2", schedule[:, t], n_concepts=2, seed=timestep_seed(10, t),
                                       samples_per_device=80, test_samples_per_device=20)
        return Engine(fed, hidden=32, training=TrainingConfig(lr=0.05), device="cpu")

    return run_continual(method, engine_at, schedule, seed=10, checkpoint_dir=directory, fingerprint="test",
                         stop_after=stop_after)


@pytest.mark.parametrize(("name", "settings"), _runs(), ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()) or "defaults")
def test_an_interrupted_run_resumes_to_the_same_result(name, settings, digits, tmp_path):
    schedule = make_schedule("sequential", 4, 3)  # the concepts switch at t = 2
    full_rows, full = _run(name, settings, digits, schedule, tmp_path / "full")
    _run(name, settings, digits, schedule, tmp_path / "resumed", stop_after=1)  # "interrupted" after t = 1
    shutil.rmtree(tmp_path / "resumed" / "t_001")  # and its last checkpoint was lost
    rows, state = _run(name, settings, digits, schedule, tmp_path / "resumed")
    assert len(rows) == 4 and rows == full_rows
    assert full.clustering.params.keys() == state.clustering.params.keys()
    for k, v in full.clustering.params.items():
        assert torch.equal(state.clustering.params[k], v), k
    assert full.extras.keys() == state.extras.keys()
    for group, tensors in full.extras.items():
        for k, v in tensors.items():
            assert torch.equal(state.extras[group][k], v), (group, k)
