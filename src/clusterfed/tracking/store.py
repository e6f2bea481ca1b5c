"""Where runs and models go: a SQLite store in the project, or ``MLFLOW_TRACKING_URI``.

The embedded default keeps everything inside the project directory (git-ignored):
``mlflow.db`` for runs and the registry, ``mlartifacts/`` for files. Setting
``MLFLOW_TRACKING_URI`` (e.g. ``http://127.0.0.1:5000``) sends both to that server
instead, with the server's own artifact store.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from clusterfed.config import Params

DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"


def tracking_uri(root: str | Path = ".") -> str:
    """``MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<root>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root).resolve() / DB_FILE}"


def get_client(root: str | Path = ".") -> MlflowClient:
    """A client for runs and the registry (both live in the same store)."""
    uri = tracking_uri(root)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def experiment_name(params: Params) -> str:
    """``clusterfed-<dataset>-<scenario>`` unless ``MLFLOW_EXPERIMENT_NAME`` says otherwise.

    One experiment per (dataset, scenario) keeps runs comparable and gives the
    registry's model names (which start with the experiment) their meaning.
    """
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"clusterfed-{params.data.dataset}-{params.scenario.name}"


def ensure_experiment(client: MlflowClient, name: str, root: str | Path = ".") -> str:
    """Id of experiment ``name``, created on first use (artifacts under ``root`` by default)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    location = None
    if "MLFLOW_TRACKING_URI" not in os.environ:
        location = (Path(root).resolve() / ARTIFACTS_DIR).as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except MlflowException as exc:  # created meanwhile by a concurrent run (sweeps on Dask)
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id
