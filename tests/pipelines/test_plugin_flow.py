"""A method outside clusterfed (tests/plugin, entry point ``clusterfed.algorithms``) runs
through the Prefect pipeline flow and into the MLflow registry with no edit of
clusterfed (issue 11, item 3; ``tests/test_plugin.py`` takes the DVC stage path).

The flow runs in its own process — the params schema is derived from the entry points
when ``clusterfed.config`` is imported, so a plugin installed into this process would
not reach it — against the session's Prefect test server (``prefect_server``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from prefect.client.orchestration import get_client as prefect_client
from prefect.settings import PREFECT_API_URL

from clusterfed.tracking import get_client, lookup

from tests.test_plugin import PLUGIN, _install_offline

REPO = Path(__file__).resolve().parents[2]


def test_an_out_of_tree_method_runs_through_the_prefect_flow(prefect_server, tmp_path):
    site = tmp_path / "site"
    _install_offline(site)
    work = tmp_path / "work"
    work.mkdir()
    params = {
        "seeds": [10],
        "training": {"lr": 0.05, "device": "cpu"},
        "coldstart": {"algorithms": ["random_groups"], "rounds": 2, "random_groups": {"k": 2}},
        "continual": {"enabled": False},
        "unsupervised": {"enabled": False},
    }
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(PLUGIN / "src"), str(REPO)]),
        "PREFECT_API_URL": PREFECT_API_URL.value(),  # the shared test server, not a second one
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.pipeline_flow", "--params", "params.yaml", "--root", "runs/flow"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    root = work / "runs/flow"
    metrics = json.loads((root / "metrics/metrics.json").read_text())["coldstart"]
    assert list(metrics) == ["random_groups"] and metrics["random_groups"]["n_clusters"] <= 2
    clustering = json.loads((root / "data/coldstart/random_groups/seed_10/clustering.json").read_text())
    assert sorted(d for c in clustering["clusters"] for d in c["devices"]) == list(range(10))
    history = json.loads((root / "data/coldstart/random_groups/seed_10/history.json").read_text())
    assert [r["round"] for r in history] == [1, 2]

    # the run went through the shared Prefect server: one completed clusterfed-pipeline run
    # whose parameters name this project's root
    with prefect_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if r.parameters.get("root") == "runs/flow"
                and r.parameters.get("params_path") == "params.yaml"]
        assert [r.state.is_completed() for r in runs] == [True]
        flow = client.read_flow(runs[0].flow_id)
        assert flow.name == "clusterfed-pipeline"

    # the MLflow registry serves each device its random group's model
    registry = get_client(work)
    for cluster in clustering["clusters"]:
        for d in cluster["devices"]:
            served = lookup(registry, d, experiment="clusterfed-digits-S2", stage="coldstart",
                            algorithm="random_groups", seed=10)
            assert served.devices == cluster["devices"]
