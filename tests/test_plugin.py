"""A method outside clusterfed (tests/plugin, entry point ``clusterfed.algorithms``)
runs through the stages and the MLflow registry with no edit of clusterfed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

PLUGIN = Path(__file__).parent / "plugin"


def _install_offline(site: Path) -> None:
    """What ``pip install tests/plugin`` leaves behind that importlib.metadata reads: a
    dist-info with the package's entry point, beside its source on the path."""
    info = site / "clusterfed_toy-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clusterfed-toy\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text('[clusterfed.algorithms]\nrandom_groups = clusterfed_toy:RandomGroups\n')


def test_an_out_of_tree_method_runs_through_the_stages(tmp_path):
    site = tmp_path / "site"
    _install_offline(site)
    work = tmp_path / "work"
    work.mkdir()
    params = {
        "seeds": [10],
        "training": {"lr": 0.05, "device": "cpu"},
        "coldstart": {"algorithms": ["random_groups", "fedavg"], "rounds": 3, "random_groups": {"k": 2}},
        "continual": {"enabled": False},
        "unsupervised": {"enabled": False},
    }
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PLUGIN / "src")])}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clusterfed.cli", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)

    for stage in ("partition", "coldstart", "evaluate"):
        done = cli(stage)
        assert done.returncode == 0, done.stderr
    clustering = json.loads((work / "data/coldstart/random_groups/seed_10/clustering.json").read_text())
    assert sorted(d for c in clustering["clusters"] for d in c["devices"]) == list(range(10))
    history = json.loads((work / "data/coldstart/random_groups/seed_10/history.json").read_text())
    assert [r["round"] for r in history] == [1, 2, 3]
    metrics = json.loads((work / "metrics/metrics.json").read_text())["coldstart"]
    assert list(metrics) == ["random_groups", "fedavg"] and metrics["random_groups"]["n_clusters"] <= 2
    assert "random_groups" in (work / "plots/accuracy.csv").read_text()
    # the MLflow registry takes its cluster models like any built-in method's
    assert cli("models", "register").returncode == 0
    served = cli("models", "lookup", "--device", "0", "--algorithm", "random_groups")
    assert served.returncode == 0 and "random_groups" in served.stdout, served.stdout + served.stderr
    # its declared parameter is validated like a built-in one, naming the key
    params["coldstart"]["random_groups"]["k"] = 0
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    refused = cli("validate")
    assert refused.returncode == 2 and "coldstart.random_groups.k: Input should be greater than 0" in refused.stderr
    # and the README table command lists it
    assert "`coldstart.random_groups.k`" in cli("params-doc").stdout
