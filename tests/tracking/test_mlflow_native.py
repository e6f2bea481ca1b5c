"""Registered models through MLflow's own API: ``mlflow.pyfunc.load_model`` on every
cluster model and on the federation's router, and a served endpoint answering a request."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import mlflow
import numpy as np
import pytest

from clusterfed.scenarios import Federation
from clusterfed.layout import RunLayout
from clusterfed.tracking import get_client, lookup, router_name, track_outputs, tracking_uri
from clusterfed.tracking.registry import in_experiment


@pytest.fixture(scope="module")
def store(stage_outputs, tmp_path_factory):
    params, root = stage_outputs
    store = tmp_path_factory.mktemp("native")
    tracker = track_outputs(params, RunLayout(root), root=store)
    uri = tracking_uri(store)
    # mlflow.set_*_uri also set MLFLOW_*_URI in the environment: restore both afterwards
    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    saved_env = {k: os.environ.get(k) for k in keys}
    previous = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    yield root, store, tracker.experiment, Federation.load(root / "data/partitions/seed_10.npz")
    mlflow.set_tracking_uri(previous[0])
    mlflow.set_registry_uri(previous[1])
    for k, v in saved_env.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _device_scores(root, algorithm):
    return json.loads((root / "data/coldstart" / algorithm / "seed_10" / "device_accuracy.json").read_text())


def test_every_registered_cluster_model_loads_with_mlflow_pyfunc(store):
    root, store_dir, experiment, fed = store
    client = get_client(store_dir)
    served = [m for m in in_experiment(client, experiment) if "serving" in m.aliases]
    assert len(served) == 21  # local's 10 clusters, fedavg's one, ditto's 10 devices (conftest TINY)
    for m in served:
        model = mlflow.pyfunc.load_model(f"models:/{m.name}@serving")
        for d in m.devices:
            labels = model.predict(fed.devices[d].x_test)
            assert labels.dtype == np.int64 and labels.shape == fed.devices[d].y_test.shape
            assert round(float(np.mean(labels == fed.devices[d].y_test)), 6) == _device_scores(root, m.algorithm)[d]
    with pytest.raises(Exception, match="Shape of input"):
        model.predict(np.zeros((2, 5), dtype=np.float32))


def test_the_router_answers_each_device_with_its_cluster_models_prediction(store):
    root, store_dir, experiment, fed = store
    router = mlflow.pyfunc.load_model(f"models:/{router_name(experiment, 'coldstart', 'local', 10)}@serving")
    x = np.concatenate([fed.devices[d].x_test for d in range(fed.n_devices)])
    owner = np.concatenate([[d] * len(fed.devices[d].y_test) for d in range(fed.n_devices)])
    labels = router.predict({"device_id": owner, "inputs": x})
    accuracy = _device_scores(root, "local")
    for d in range(fed.n_devices):
        mine = labels[owner == d]
        assert round(float(np.mean(mine == fed.devices[d].y_test)), 6) == accuracy[d]
        assert np.array_equal(router.predict({"device_id": d, "inputs": fed.devices[d].x_test, "timestep": 0}), mine)
    # local trains one model per device: the router really switches model with the device
    assert not np.array_equal(router.predict({"device_id": 0, "inputs": x}), router.predict({"device_id": 1, "inputs": x}))
    with pytest.raises(Exception, match=r"device 12 is served by no model at timestep 0; devices: \[0, 1, .*9\]"):
        router.predict({"device_id": 12, "inputs": x[:2]})
    with pytest.raises(Exception, match=r"timestep 3 is not served; timesteps: \[0\]"):
        router.predict({"device_id": 1, "inputs": x[:2], "timestep": 3})
    with pytest.raises(Exception, match="no inputs: the array holds 0 samples"):
        router.predict({"device_id": 1, "inputs": x[:0]})
    version = get_client(store_dir).get_model_version_by_alias(router_name(experiment, "coldstart", "local", 10), "serving")
    assert version.tags["kind"] == "router" and json.loads(version.tags["timesteps"]) == [0]
    assert lookup(get_client(store_dir), 3, experiment=experiment, algorithm="local", seed=10).devices == [3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.serve
def test_mlflow_models_serve_answers_for_the_whole_federation(store):
    root, store_dir, experiment, fed = store
    port = _free_port()
    env = {
        **os.environ, "MLFLOW_TRACKING_URI": tracking_uri(store_dir), "MLFLOW_REGISTRY_URI": tracking_uri(store_dir),
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}",  # uvicorn of this venv
    }
    mlflow_cli = [sys.executable, "-m", "mlflow"]
    uri = f"models:/{router_name(experiment, 'coldstart', 'local', 10)}@serving"
    server = subprocess.Popen(
        [*mlflow_cli, "models", "serve", "-m", uri, "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                if server.poll() is not None or time.monotonic() > deadline:
                    server.kill()
                    pytest.fail(f"mlflow models serve did not start:\n{server.stdout.read()[-3000:]}")
                time.sleep(0.5)
        d = 4
        body = json.dumps({"inputs": {"device_id": [d], "inputs": fed.devices[d].x_test.tolist()}}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            labels = np.asarray(json.loads(response.read())["predictions"])
        assert round(float(np.mean(labels == fed.devices[d].y_test)), 6) == _device_scores(root, "local")[d]
    finally:
        server.terminate()
        server.wait(timeout=30)
