"""Tracking a finished run: the run tree, and registry lookups that serve each device its cluster."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clusterfed.models import MLP
from clusterfed.layout import RunLayout
from clusterfed.scenarios import Federation
from clusterfed.tracking import LookupFailed, get_client, lookup, model_name, track_outputs
from clusterfed.tracking.registry import in_experiment, load_model, set_service_aliases


def _track(params, root, store):
    return track_outputs(params, RunLayout(root), root=store)


@pytest.fixture(scope="module")
def tracked(stage_outputs, tmp_path_factory):
    params, root = stage_outputs
    store = tmp_path_factory.mktemp("store")
    tracker = _track(params, root, store)
    return params, root, store, tracker


def test_one_parent_run_with_a_nested_run_per_stage_and_algorithm(tracked):
    params, root, store, tracker = tracked
    client = get_client(store)
    runs = client.search_runs([tracker.experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    parent_of = {r.info.run_name: r.data.tags.get("mlflow.parentRunId") for r in runs}
    assert set(by_name) == {"pipeline", "partition", "coldstart", "coldstart/local/seed_10", "coldstart/fedavg/seed_10",
                            "coldstart/ditto/seed_10", "evaluate"}
    assert all(parent_of[s] == tracker.run_id for s in ("partition", "coldstart", "evaluate"))
    assert parent_of["coldstart/local/seed_10"] == by_name["coldstart"].info.run_id
    assert all(r.info.status == "FINISHED" for r in runs)
    assert by_name["pipeline"].data.params["coldstart.rounds"] == "3"

    run = by_name["coldstart/fedavg/seed_10"]
    history = json.loads((root / "data/coldstart/fedavg/seed_10/history.json").read_text())
    logged = client.get_metric_history(run.info.run_id, "accuracy")
    assert [(m.step, m.value) for m in sorted(logged, key=lambda m: m.step)] == [(h["round"], h["accuracy"]) for h in history]
    summary = json.loads((root / "metrics/metrics.json").read_text())
    assert by_name["pipeline"].data.metrics["coldstart.fedavg.accuracy"] == summary["coldstart"]["fedavg"]["accuracy"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"clustering.json", "history.json", "device_accuracy.json", "models"} <= artifacts
    assert {a.path for a in client.list_artifacts(by_name["evaluate"].info.run_id, "plots")} >= {"plots/accuracy.png"}


def test_lookup_serves_every_device_its_own_cluster_model(tracked):
    params, root, store, tracker = tracked
    client = get_client(store)
    fed = Federation.load(root / "data/partitions/seed_10.npz")
    for algorithm in ("local", "fedavg", "ditto"):
        run_dir = root / "data/coldstart" / algorithm / "seed_10"
        clustering = json.loads((run_dir / "clustering.json").read_text())
        device_accuracy = json.loads((run_dir / "device_accuracy.json").read_text())
        stacked = load_file(str(run_dir / "models.safetensors"))
        for d in range(fed.n_devices):
            served = lookup(client, d, experiment=tracker.experiment, algorithm=algorithm, seed=10)
            expected = next(c for c in clustering["clusters"] if d in c["devices"])
            assert served.name == model_name(tracker.experiment, "coldstart", algorithm, 10, expected["id"])
            assert (served.cluster, served.devices, served.timestep, served.version) == (expected["id"], expected["devices"], 0, 1)
            assert served.aliases == ["serving", "t0"]
            # the registered model, loaded back, is the one that produced this device's score
            x, y = fed.devices[d].x_test, fed.devices[d].y_test
            predictions = load_model(client, served).predict(x)
            assert round(float(np.mean(predictions == y)), 6) == device_accuracy[d]
            i = expected["model_index"]
            stacked_logits = MLP.stacked_forward({k: v[i : i + 1] for k, v in stacked.items()}, torch.as_tensor(x), shared_input=True)
            assert np.array_equal(predictions, stacked_logits[0].argmax(-1).numpy())
    for algorithm in ("local", "ditto"):  # a personalised method registers each device's model
        assert len({lookup(client, d, experiment=tracker.experiment, algorithm=algorithm, seed=10).name for d in range(10)}) == 10


def test_unknown_requests_say_what_the_registry_holds(tracked):
    _, _, store, tracker = tracked
    client, e = get_client(store), tracker.experiment
    with pytest.raises(LookupFailed, match=r"no models registered for experiment 'nope'; experiments with models: \['clusterfed-digits-S2'\]"):
        lookup(client, 0, experiment="nope")
    with pytest.raises(LookupFailed, match=r"device 10 is served by no model .* registered devices: 0-9"):
        lookup(client, 10, experiment=e, algorithm="fedavg", seed=10)
    with pytest.raises(LookupFailed, match=r"timestep 3 is not registered .* registered timesteps: \[0\]"):
        lookup(client, 0, experiment=e, algorithm="fedavg", seed=10, timestep=3)
    with pytest.raises(LookupFailed, match=r"no models of algorithm 'faacl' .* registered: \['ditto', 'fedavg', 'local'\]"):
        lookup(client, 0, experiment=e, algorithm="faacl")
    with pytest.raises(LookupFailed, match=r"several algorithms \['ditto', 'fedavg', 'local'\]; choose one with --algorithm"):
        lookup(client, 0, experiment=e)
    with pytest.raises(LookupFailed, match=r"no models of seed 11"):
        lookup(client, 0, experiment=e, algorithm="fedavg", seed=11)


def test_a_new_run_takes_over_service_and_retired_clusters_leave_it(stage_outputs, tmp_path):
    params, root = stage_outputs
    first = _track(params, root, tmp_path)
    second = _track(params, root, tmp_path)
    client = get_client(tmp_path)
    served = lookup(client, 4, experiment=second.experiment, algorithm="local", seed=10)
    assert (served.version, served.aliases) == (2, ["serving", "t0"])
    versions = [m for m in in_experiment(client, second.experiment) if m.name == served.name]
    assert [(m.version, m.aliases) for m in versions] == [(1, []), (2, ["serving", "t0"])]
    assert first.run_id != second.run_id

    # re-pointing service at a clustering without device 4's cluster takes the alias off it
    keep = [client.get_model_version(m.name, m.version) for m in in_experiment(client, second.experiment)
            if m.algorithm == "local" and m.aliases and 4 not in m.devices]
    set_service_aliases(client, keep, experiment=second.experiment, stage="coldstart", algorithm="local", seed=10, timestep=0)
    with pytest.raises(LookupFailed, match="device 4 is served by no model"):
        lookup(client, 4, experiment=second.experiment, algorithm="local", seed=10)
    assert lookup(client, 5, experiment=second.experiment, algorithm="local", seed=10).devices == [5]
