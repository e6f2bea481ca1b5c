"""FedCRef's community autoencoders in MLflow: one registered model per community and
the lookup of the model serving a client's local cluster (real digits run)."""

import json

import numpy as np
import pytest
import torch

from clusterfed.config import parse_params
from clusterfed.engine.autoencoder import reconstruction_errors
from clusterfed.layout import RunLayout
from clusterfed.stages.unsupervised import build_clients, run_unsupervised
from clusterfed.tracking import LookupFailed, PipelineTracker, get_client
from clusterfed.tracking.communities import load_community_model, lookup_local_cluster

TINY = {
    "seeds": [10],
    "continual": {"enabled": False},
    "unsupervised": {"n_clients": 6, "samples_per_category": 40, "dirtiness": 0.0, "methods": ["fedcref"],
                     "fedcref": {"theta": 0.3, "local_epochs": 60, "fl_rounds": 2}},
}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    params = parse_params(TINY)
    root = tmp_path_factory.mktemp("unsupervised")
    run_unsupervised(params.unsupervised, params.seeds, None, RunLayout(root).unsupervised)
    store = tmp_path_factory.mktemp("store")
    tracker = PipelineTracker.start(params, root=store)
    served = tracker.log_unsupervised(params, RunLayout(root))
    tracker.finish()
    return params, root, store, tracker, served


def test_one_registered_model_per_community(tracked):
    params, root, store, tracker, served = tracked
    table = json.loads((root / "data/unsupervised/fedcref/seed_10/communities.json").read_text())
    assert table["communities"], "the clean digits run forms communities"
    assert sorted(m.cluster for m in served) == [c["id"] for c in table["communities"]]
    assert all(m.stage == "unsupervised" and m.algorithm == "fedcref" and "serving" in m.aliases for m in served)
    for m, c in zip(sorted(served, key=lambda m: m.cluster), table["communities"]):
        assert m.devices == c["clients"]


def test_lookup_of_the_community_serving_a_local_cluster(tracked):
    params, root, store, tracker, served = tracked
    client = get_client(store)
    table = json.loads((root / "data/unsupervised/fedcref/seed_10/communities.json").read_text())
    for key, community in table["community_of_local_cluster"].items():
        i, q = map(int, key.split(":"))
        if community is None:
            with pytest.raises(LookupFailed, match="isolated"):
                lookup_local_cluster(client, i, q, experiment=tracker.experiment)
        else:
            assert lookup_local_cluster(client, i, q, experiment=tracker.experiment).cluster == community


def test_a_served_community_model_reconstructs_its_clusters(tracked, tmp_path):
    params, root, store, tracker, served = tracked
    client = get_client(store)
    table = json.loads((root / "data/unsupervised/fedcref/seed_10/communities.json").read_text())
    community = table["communities"][0]
    i, q = community["local_clusters"][0]
    m = lookup_local_cluster(client, i, q, experiment=tracker.experiment)
    params_g, spec = load_community_model(client.download_artifacts(m.run_id, m.artifact_path, str(tmp_path)))
    assert spec["input_dim"] == 64 and spec["provenance"]["local_clusters"] == community["local_clusters"]
    clients, _ = build_clients(params.unsupervised, None, 10)
    x = torch.as_tensor(clients.x[i])
    errors = reconstruction_errors(params_g, x)[0].numpy()
    final = json.loads((root / "data/unsupervised/fedcref/seed_10/graph.json").read_text())
    assert errors.shape == (len(x),) and np.isfinite(errors).all()
    assert final["communities"] == [c["local_clusters"] for c in table["communities"]]
