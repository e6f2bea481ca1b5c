"""A small real run (digits, S2) tracked into a fresh SQLite store per test module."""

from __future__ import annotations

import os

import pytest

from clusterfed import stages
from clusterfed.layout import RunLayout
from clusterfed.config import parse_params

os.environ.update(DO_NOT_TRACK="1", MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false")
os.environ.pop("MLFLOW_TRACKING_URI", None)  # tests use the embedded store under tmp_path
os.environ.pop("MLFLOW_EXPERIMENT_NAME", None)

# Local gives every device its own cluster (10 models), FedAvg one shared model,
# Ditto (personalised) a model per device beside a global one that is not served:
# lookups must tell them apart. A few epochs are enough; nothing here scores them.
TINY = {
    "seeds": [10],
    "training": {"lr": 0.05, "device": "cpu"},
    "coldstart": {"algorithms": ["local", "fedavg", "ditto"], "rounds": 3},
    "continual": {"enabled": False},
}


@pytest.fixture(scope="session")
def stage_outputs(tmp_path_factory):
    """partition -> coldstart -> evaluate through the stage functions, as ``dvc repro`` runs them."""
    root = tmp_path_factory.mktemp("stages")
    params = parse_params(TINY)
    layout = RunLayout(root)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    stages.evaluate(params, layout)
    return params, root
