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
from clusterfed.engine.robust import RepeatedRejections, TooManyRejected
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
def poisoned(poison_uploads):
    """Device 3 uploads its update sign-flipped x100 (a finite attack: only the norm rule sees it)."""
    poison_uploads(POISONED, lambda start, trained: start - 100.0 * (trained - start))


def test_rejections_reach_rejections_json_metrics_and_mlflow(tmp_path, poisoned):
    from mlflow.tracking import MlflowClient

    from clusterfed.tracking import PipelineTracker

    params, layout = _params(), RunLayout(tmp_path / "run")
    stages.partition(params, layout)
    with pytest.warns(RepeatedRejections, match=r"fedavg seed 10: .*: device 3 \(6\)\. Either faulty, or honest"):
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


# FedCRef's community FedAvg (the unsupervised stage) under the same settings and reports.
FEDCREF = {"n_clients": 5, "samples_per_category": 30, "methods": ["perfect"],
           "fedcref": {"local_epochs": 2, "fl_rounds": 2, "fl_epochs": 1, "max_iterations": 2}}


def _fedcref_params(**training):
    return parse_params({
        "seeds": [10], "scenario": {"name": "S0", "group_sizes": [3]},
        "training": {"lr": 0.05, "device": "cpu", **training},
        "coldstart": {"algorithms": ["fedavg"], "rounds": 1},
        "continual": {"enabled": False}, "unsupervised": FEDCREF,
    })


@pytest.fixture
def poisoned_client(monkeypatch):
    """Client 0 (its samples come first) uploads its community FedAvg updates
    sign-flipped x100; its local autoencoders (trained for ``local_epochs``, not
    ``fl_epochs``) stay honest, so the oracle association puts it in communities."""
    import importlib

    fedcref_module = importlib.import_module("clusterfed.algorithms.fedcref.fedcref")
    stage_module = importlib.import_module("clusterfed.stages.unsupervised")
    honest_clients, honest_train = stage_module.build_clients, fedcref_module.train_autoencoders
    first = {}

    def build_clients(section, root, seed):
        clients, truth = honest_clients(section, root, seed)
        first["n"] = len(clients.x[0])
        return clients, truth

    def train(start, x_all, index, counts, *, epochs, **kw):
        trained = honest_train(start, x_all, index, counts, epochs=epochs, **kw)
        if epochs != FEDCREF["fedcref"]["fl_epochs"]:
            return trained
        rows = index[:, 0] < first["n"]
        return {k: torch.where(rows.view(-1, *([1] * (v.dim() - 1))), start[k] - 100.0 * (v - start[k]), v)
                for k, v in trained.items()}

    monkeypatch.setattr(stage_module, "build_clients", build_clients)
    monkeypatch.setattr(fedcref_module, "train_autoencoders", train)


def test_fedcref_rejections_reach_summary_metrics_mlflow_and_the_report(tmp_path, poisoned_client, capsys):
    from mlflow.tracking import MlflowClient

    from clusterfed.cli import _print_report
    from clusterfed.tracking import PipelineTracker

    params, layout = _fedcref_params(), RunLayout(tmp_path / "run")
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    stages.unsupervised(params, layout, progress=False)
    report = stages.evaluate(params, layout)
    run = layout.unsupervised_outputs().run("perfect", 10)
    assert json.loads(run.summary.read_text())["rejections"] == {
        "uploads": 46, "rejected": 20, "rejected_by_device": [20, 0, 0, 0, 0]}
    assert [r["rejected"] for r in json.loads(run.history.read_text())] == [0, 10, 10]  # iteration 0 = start
    m = json.loads(layout.metrics.read_text())["unsupervised"]["methods"]["perfect"]
    assert (m["rejected_updates"], m["rejected_share"], m["rejected_by_device"]) == (20, round(20 / 46, 6), [20, 0, 0, 0, 0])
    _print_report(report, params)
    (line,) = [r for r in capsys.readouterr().out.splitlines() if r.strip().startswith("perfect")]
    assert line.split()[-1] == "20"  # the summary's rejected column

    tracker = PipelineTracker.start(params, root=tmp_path / "store")
    tracker.log_unsupervised(params, layout, register=False)
    client = MlflowClient(tracker.tracking_uri, tracker.tracking_uri)
    (logged,) = client.search_runs([tracker.experiment_id], "attributes.run_name = 'unsupervised/perfect/seed_10'")
    assert (logged.data.metrics["rejected_updates"], logged.data.metrics["rejected_share"]) == (20, 20 / 46)
    assert [m.value for m in client.get_metric_history(logged.info.run_id, "rejected")] == [0.0, 10.0, 10.0]


def test_fedcref_fails_above_the_max_share_naming_the_client_and_writes_nothing(tmp_path, poisoned_client):
    params, layout = _fedcref_params(max_rejected_share=0.4), RunLayout(tmp_path)
    with pytest.raises(TooManyRejected, match=r"unsupervised perfect seed 10: 20 of 46 uploads rejected "
                                              r"\(43\.5% > training\.max_rejected_share 40%\): client 0 \(20\)$"):
        stages.unsupervised(params, layout, progress=False)
    assert not layout.unsupervised.exists()


def test_fedcref_screens_with_the_training_settings(tmp_path, poisoned_client):
    """``training.outlier_factor: null`` keeps only the finite check: the finite x100
    attack then passes (and, unfiltered, changes the next iteration's communities), as it
    does for every other method."""
    params = _fedcref_params(outlier_factor=None)
    stages.unsupervised(params, RunLayout(tmp_path), progress=False)
    summary = json.loads(RunLayout(tmp_path).unsupervised_outputs().run("perfect", 10).summary.read_text())
    assert summary["rejections"] == {"uploads": 44, "rejected": 0, "rejected_by_device": [0, 0, 0, 0, 0]}
