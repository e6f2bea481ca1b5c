"""FedCRef end to end on real digits (fedcref Alg. 1–2) and its baselines."""

import numpy as np
import pytest
import torch

from clusterfed.algorithms.fedcref import FedCRefParams, fedcref, no_association
from clusterfed.algorithms.fedcref.baselines import perfect_association
from clusterfed.algorithms.fedcref.steps import cluster_refine
from clusterfed.engine.autoencoder import init_autoencoders, model_bytes, reconstruction_errors, train_autoencoders
from clusterfed.evaluation.clustering_accuracy import clustering_accuracy
from clusterfed.evaluation.fedcref_scores import score_history, summarize_run
from clusterfed.scenarios.unsupervised import make_clients

# Digits: 8×8 images and ~180 a class, so a cluster holds 60 samples; the paper's θ = 0.2
# is tuned for MNIST-sized clusters (RESULTS.md), digits' weaker models need θ = 0.3.
DIGITS = FedCRefParams(θ=0.3, local_epochs=100, fl_rounds=15)


@pytest.fixture(scope="module")
def pool(digits):
    x = np.concatenate([digits.x_train, digits.x_test])
    return x.reshape(len(x), -1), np.concatenate([digits.y_train, digits.y_test])


@pytest.fixture(scope="module")
def clean(pool):
    clients, truth = make_clients(*pool, n_clients=10, samples_per_category=60, overlap=0.0, dirtiness=0.0, seed=0)
    return clients, truth, fedcref(clients, DIGITS, seed=0)


def test_clean_start_gives_pure_communities(clean):
    clients, truth, result = clean
    first = result.history[0]
    assert first["communities"] >= 7
    for group in first["groups"]:
        assert len({truth.categories[i][q] for i, q in group}) == 1  # one true category each
    rows = score_history(result.history, list(clients.initial), truth)
    assert [r["wrong_associations"] for r in rows] == [0] * len(rows)
    summary = summarize_run(rows, truth)
    assert summary["isolated_start"] == sum(clients.k)  # iteration 0: every cluster isolated
    assert summary["acc_init"] == 1.0 and summary["acc_end"] > 0.95
    # every client stays stable (ACC ≥ τ against its clean start): A empties, the run ends
    assert result.iterations == 1 and first["active_clients"] == 0
    # refinement renumbers nothing: local cluster q still holds category q, so the models
    # AE_iq of clients that left A still describe their clusters
    for i, q_i in enumerate(result.assignment):
        majority = [np.bincount(truth.y[i][q_i == q]).argmax() for q in range(clients.k[i])]
        assert majority == list(truth.categories[i])


def test_stable_after_two_keeps_every_client_refining_twice(clean):
    """The same clean start under ``stable_after=2``: the first refinement (stable, as
    above) no longer takes any client out of A; the second, stable again, empties it."""
    clients, _, default = clean
    result = fedcref(clients, FedCRefParams(θ=0.3, local_epochs=100, fl_rounds=15, stable_after=2), seed=0)
    assert default.history[0]["active_clients"] == 0
    assert [h["active_clients"] for h in result.history] == [clients.n_clients, 0]
    assert [h["refined_clients"] for h in result.history] == [clients.n_clients] * 2
    for h in result.history:  # clusters formed by a community model: at most K_i, their samples at most n_i
        assert all(0 <= c <= k and 0 <= n <= len(x) for (c, n), k, x in zip(h["from_community"], clients.k, clients.x))
    with pytest.raises(ValueError, match="stable_after"):
        FedCRefParams(stable_after=0)


def test_retrain_on_leave_trains_the_leavers_once_more_on_their_final_clusters(clean):
    """The clean start with ``retrain_on_leave``: every client leaves A at its first
    refinement (as above), then trains its models once more on the refined clusters in
    a second iteration that refines nobody; that iteration's exchange counts every
    model, and the clustering is the first refinement's."""
    clients, _, default = clean
    params = FedCRefParams(θ=0.3, local_epochs=100, fl_rounds=15, retrain_on_leave=True)
    result = fedcref(clients, params, seed=0)
    assert [h["refined_clients"] for h in result.history] == [clients.n_clients, 0]
    assert [h["active_clients"] for h in result.history] == [0, 0]
    first, second = result.history
    assert first["bytes"] == default.history[0]["bytes"] and first["groups"] == default.history[0]["groups"]
    members = sum(len(g) for g in second["groups"])
    models = sum(clients.k) * (clients.n_clients - 1)  # line 9 of the second iteration: every model again
    assert second["bytes"] == model_bytes(result.d) * (
        models + 2 * params.fl_rounds * members + len(second["groups"]) * clients.n_clients)
    for a, b in zip(result.assignment, first["assignment"]):
        np.testing.assert_array_equal(a, b)


def test_lookup_of_the_community_model_of_a_local_cluster(clean):
    _, truth, result = clean
    for g, group in enumerate(result.communities):
        for i, q in group:
            assert result.community_of(i, q) == g
    assert result.community_params["w0"].shape[0] == len(result.communities)
    isolated = result.history[-1]["isolated_clusters"]
    assert all(result.community_of(i, q) is None for i, q in isolated)


def test_refinement_moves_mislabelled_samples_back(pool):
    """A client holding 0s and 1s with 15 of 60 of each in the wrong cluster: its local
    models are trained on the dirty clusters, the community models on clean 0s and 1s of
    other clients; Alg. 2 puts every sample in its digit's cluster."""
    x, y = pool
    zeros, ones = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    client = np.concatenate([zeros[:60], ones[:60]])
    truth = y[client]
    dirty = (truth == 1).astype(np.int64)
    dirty[:15] = 1
    dirty[60:75] = 0
    x_all = torch.as_tensor(np.concatenate([x[client], x[zeros[60:]], x[ones[60:]]]))
    rows = [np.flatnonzero(dirty == 0), np.flatnonzero(dirty == 1),
            120 + np.arange(len(zeros) - 60), 120 + len(zeros) - 60 + np.arange(len(ones) - 60)]
    index = torch.zeros(4, max(map(len, rows)), dtype=torch.long)
    for p, r in enumerate(rows):
        index[p, : len(r)] = torch.as_tensor(r)
    gen = torch.Generator().manual_seed(0)
    models = train_autoencoders(init_autoencoders(4, 64, gen), x_all, index, torch.tensor([len(r) for r in rows]),
                                epochs=20, lr=1e-3, batch_size=32, generator=gen)
    errors = reconstruction_errors(models, x_all[:120]).numpy().T  # [n, local L0, L1, community G0, G1]
    assert clustering_accuracy(dirty, truth) == 0.75
    refined, selected = cluster_refine(errors, k=2)
    assert clustering_accuracy(refined, truth) == 1.0
    assert sorted(selected) == [2, 3]  # both clusters were formed by the community models


def test_perfect_associations_link_every_shared_category(pool):
    clients, truth = make_clients(*pool, n_clients=10, samples_per_category=60, overlap=0.0, dirtiness=0.3, seed=1)
    result = fedcref(clients, FedCRefParams(local_epochs=20, fl_rounds=3, max_iterations=1), seed=0,
                     associate=perfect_association(truth))
    held = np.bincount(np.concatenate(truth.categories), minlength=10)
    assert result.history[0]["communities"] == int((held >= 2).sum())
    rows = score_history(result.history, list(clients.initial), truth)
    assert rows[1]["wrong_associations"] == 0


def test_local_only_forms_no_community(pool):
    clients, truth = make_clients(*pool, n_clients=4, samples_per_category=40, overlap=0.0, dirtiness=0.3, seed=2)
    result = fedcref(clients, FedCRefParams(local_epochs=20, fl_rounds=3, max_iterations=2), seed=0,
                     associate=no_association)
    assert [h["communities"] for h in result.history] == [0] * result.iterations
    assert all(h["isolated"] == sum(clients.k) for h in result.history)
    assert result.community_params["w0"].shape[0] == 0


def test_parameters_are_checked_by_name():
    with pytest.raises(ValueError, match="fedcref.theta"):
        FedCRefParams(θ=1.5)
    with pytest.raises(ValueError, match="fedcref.tau"):
        FedCRefParams(τ=-0.1)
