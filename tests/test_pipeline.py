"""End to end on real digits: partition -> coldstart -> evaluate through the stage functions."""

import json

import numpy as np
import pytest
from safetensors.torch import load_file

from clusterfed import pipeline
from clusterfed.config import parse_params


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    params = parse_params(
        {
            "seeds": [10],
            "scenario": {"name": "S2", "group_sizes": [5, 5]},
            "training": {"lr": 0.05, "device": "cpu"},
            "coldstart": {
                "algorithms": ["faacl", "fedavg", "centralized"],
                "epochs": 20,
                "faacl": {"epsilon": 0.5, "init_epochs": 40},
            },
        }
    )
    pipeline.partition(params, root / "partitions")
    pipeline.coldstart(params, root / "partitions", root / "coldstart", progress=False)
    report = pipeline.evaluate(
        params, root / "partitions", root / "coldstart", root / "metrics.json", root / "plots"
    )
    return root, report["coldstart"]


def test_faacl_recovers_the_s2_groups_end_to_end(run):
    root, metrics = run
    assert metrics["faacl"]["ari"] == 1.0
    assert metrics["faacl"]["n_clusters"] == 2
    assert metrics["fedavg"]["n_clusters"] == 1
    assert metrics["faacl"]["accuracy"] > metrics["fedavg"]["accuracy"] + 0.3  # S2 breaks FedAvg
    assert json.loads((root / "metrics.json").read_text()) == {"coldstart": metrics}
    assert set(metrics["faacl"]) >= {"accuracy", "accuracy_stderr", "n_clusters", "ari"}


def test_outputs_are_readable_and_consistent(run):
    root, _ = run
    run_dir = root / "coldstart" / "faacl" / "seed_10"
    clustering = json.loads((run_dir / "clustering.json").read_text())
    assert sorted(d for c in clustering["clusters"] for d in c["devices"]) == list(range(10))
    models = load_file(str(run_dir / "models.safetensors"))
    assert models["output.bias"].shape == (len(clustering["clusters"]), 10)
    accuracy = json.loads((run_dir / "device_accuracy.json").read_text())
    assert np.mean(accuracy) == pytest.approx(json.loads((root / "metrics.json").read_text())["coldstart"]["faacl"]["accuracy"], abs=1e-5)
    rows = (root / "plots" / "accuracy" / "faacl.csv").read_text().splitlines()
    assert rows[0] == "round,accuracy" and len(rows) > 21
    assert (root / "plots" / "accuracy.png").stat().st_size > 0


def test_failed_stage_leaves_nothing_half_written(tmp_path):
    params = parse_params({"seeds": [10], "coldstart": {"algorithms": ["fedavg"], "epochs": 1}})
    with pytest.raises(FileNotFoundError):
        pipeline.coldstart(params, tmp_path / "missing", tmp_path / "coldstart", progress=False)
    assert list(tmp_path.iterdir()) == []
