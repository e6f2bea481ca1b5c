"""Continual runs count rejected uploads per device, as cold start does, and a run
whose rejected share passes ``training.max_rejected_share`` fails naming the devices."""

import json
import re

import pytest
import torch

import clusterfed.engine.engine as engine_module
from clusterfed import stages
from clusterfed.config import parse_params
from clusterfed.engine.robust import TooManyRejected
from clusterfed.layout import RunLayout

POISONED = 1


@pytest.fixture
def poisoned(poison_uploads):
    """Device 1 uploads 1e30 in every parameter (finite: only the norm rule catches it)."""
    poison_uploads(POISONED, lambda start, trained: torch.full_like(trained, 1e30))


def _params(max_share: float):
    return parse_params({
        "seeds": [10],
        "scenario": {"name": "S2", "group_sizes": [3, 3]},
        "training": {"lr": 0.05, "device": "cpu", "max_rejected_share": max_share},
        "coldstart": {"algorithms": ["fedavg"], "rounds": 2},
        "continual": {"algorithms": ["fedavg", "fedprox_ewc"], "timesteps": 2, "rounds": 2,
                      "samples_per_device": 60, "test_samples_per_device": 20},
        "unsupervised": {"enabled": False},
    })


def test_rejections_per_device_reach_timesteps_and_metrics(tmp_path, poisoned):
    params, layout = _params(0.5), RunLayout(tmp_path)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    stages.continual(params, layout, progress=False)
    # per timestep t = 0, 1, 2: 6 devices x 2 rounds, and FedProx-EWC's 6 Fisher estimates
    # (also screened uploads; this attack leaves them honest); device 1's 2 models rejected
    for name, uploads in (("fedavg", 12), ("fedprox_ewc", 18)):
        run = json.loads(layout.continual_run(name, 10).timesteps.read_text())
        assert [r["uploads"] for r in run["rows"]] == [uploads] * 3
        assert [r["rejected_devices"] for r in run["rows"]] == [[POISONED] * 2] * 3
        assert run["summary"]["uploads"] == 3 * uploads and run["summary"]["rejected_by_device"] == [0, 6, 0, 0, 0, 0]
    report = stages.evaluate(params, layout)["continual"]
    assert report["fedavg"]["rejected_updates"] == 6 and report["fedavg"]["rejected_share"] == round(6 / 36, 6)
    assert report["fedprox_ewc"]["rejected_by_device"] == [0, 6, 0, 0, 0, 0]


def test_a_continual_run_above_the_rejected_share_fails_naming_the_device(tmp_path, poisoned):
    params, layout = _params(0.1), RunLayout(tmp_path)
    message = "continual fedavg seed 10: 6 of 36 uploads rejected (16.7% > training.max_rejected_share 10%): device 1 (6)"
    with pytest.raises(TooManyRejected, match=re.escape(message)):
        stages.continual(params, layout, progress=False)
    assert not layout.continual_run("fedavg", 10).timesteps.exists()  # its results are not written
