"""A poisoned device through the pipeline: the engine's one screening step rejects its
uploads, every round reports them (``Round``, ``Engine.tally``), and the counts reach
``rejections.json``, ``metrics.json`` and MLflow; above ``training.max_rejected_share``
the cold-start stage fails naming the device and writes nothing."""

import json

import pytest
import torch

import clusterfed.engine.engine as engine_module
from clusterfed import stages
from clusterfed.config import parse_params
from clusterfed.engine.robust import TooManyRejected
from clusterfed.layout import RunLayout

POISONED = 3


def _params(**training):
    return parse_params({
        "seeds": [10],
        "scenario": {"name": "S0", "group_sizes": [5]},
        "training": {"lr": 0.05, "device": "cpu", **training},
        "coldstart": {"algorithms": ["fedavg"], "rounds": 6},
        "continual": {"enabled": False},
        "unsupervised": {"enabled": False},
    })


@pytest.fixture
def poisoned(monkeypatch):
    """Device 3 uploads its update sign-flipped x100 (a finite attack: only the norm rule sees it)."""
    honest = engine_module.local_sgd

    def attack(model, start, data, device_idx, **kw):
        trained = honest(model, start, data, device_idx, **kw)
        rows = device_idx == POISONED
        return {k: torch.where(rows.view(-1, *([1] * (v.dim() - 1))), start[k] - 100.0 * (v - start[k]), v)
                for k, v in trained.items()}

    monkeypatch.setattr(engine_module, "local_sgd", attack)


def test_rejections_reach_rejections_json_metrics_and_mlflow(tmp_path, poisoned):
    from mlflow.tracking import MlflowClient

    from clusterfed.tracking import PipelineTracker

    params, layout = _params(), RunLayout(tmp_path / "run")
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    report = stages.evaluate(params, layout)
    files = layout.coldstart_run("fedavg", 10)
    assert json.loads(files.rejections.read_text()) == {"uploads": 30, "rejected": 6, "rejected_by_device": [0, 0, 0, 6, 0]}
    assert [r["rejected_devices"] for r in json.loads(files.history.read_text())] == [[POISONED]] * 6
    m = report["coldstart"]["fedavg"]
    assert (m["rejected_updates"], m["rejected_share"], m["rejected_by_device"]) == (6, 0.2, [0, 0, 0, 6, 0])
    assert json.loads(layout.metrics.read_text())["coldstart"]["fedavg"]["rejected_updates"] == 6

    tracker = PipelineTracker.start(params, root=tmp_path / "store")
    tracker.log_coldstart(params, layout, register=False)
    client = MlflowClient(tracker.tracking_uri, tracker.tracking_uri)
    (run,) = client.search_runs([tracker.experiment_id], "attributes.run_name = 'coldstart/fedavg/seed_10'")
    assert run.data.metrics["rejected_updates"] == 6
    assert [m.value for m in client.get_metric_history(run.info.run_id, "rejected")] == [1.0] * 6


def test_too_many_rejections_fail_the_stage_naming_the_device_and_write_nothing(tmp_path, poisoned):
    params, layout = _params(max_rejected_share=0.1), RunLayout(tmp_path)
    stages.partition(params, layout)
    with pytest.raises(TooManyRejected, match=r"fedavg seed 10: 6 of 30 uploads rejected .*: device 3 \(6\)"):
        stages.coldstart(params, layout, progress=False)
    assert not layout.coldstart.exists()
