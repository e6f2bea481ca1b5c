"""The `unsupervised` stage on digits: outputs, metrics over seeds and plots."""

import json

import numpy as np
import pytest

from clusterfed.config import ParamsError, parse_params
from clusterfed.layout import PlotFiles, UnsupervisedOutputs
from clusterfed.stages.unsupervised import build_clients, plot_unsupervised, run_unsupervised

SMALL = {"seeds": [10, 55], "continual": {"enabled": False},
         "unsupervised": {"n_clients": 5, "samples_per_category": 30, "methods": ["fedcref", "local"],
                          "fedcref": {"local_epochs": 20, "fl_rounds": 2, "max_iterations": 2}}}


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    params = parse_params(SMALL)
    root = tmp_path_factory.mktemp("unsupervised")
    metrics = run_unsupervised(params.unsupervised, params.seeds, None, root / "data")
    plot_unsupervised(params.unsupervised, params.seeds, UnsupervisedOutputs(root / "data"), PlotFiles(root / "plots"))
    return params, root, metrics


def test_every_method_and_seed_writes_its_results(stage):
    params, root, metrics = stage
    for method in ("fedcref", "local"):
        for seed in (10, 55):
            run = root / "data" / method / f"seed_{seed}"
            assert {p.name for p in run.iterdir()} == {
                "history.json", "summary.json", "communities.json", "graph.json", "community_models.safetensors"}
            rows = json.loads((run / "history.json").read_text())
            assert rows[0]["iteration"] == 0 and rows[0]["communities"] == 0
    assert json.loads((root / "data" / "metrics.json").read_text()) == metrics
    assert set(metrics["methods"]) == {"fedcref", "local"} and metrics["global_k"] == 10


def test_metrics_are_means_over_seeds(stage):
    params, root, metrics = stage
    acc = [json.loads((root / "data/local" / f"seed_{s}" / "summary.json").read_text())["acc_end"] for s in (10, 55)]
    assert metrics["methods"]["local"]["acc_end"] == pytest.approx(np.mean(acc))
    assert metrics["methods"]["local"]["communities"] == 0.0  # no federation, no community


def test_plots_fig4_and_the_association_graph(stage):
    params, root, _ = stage
    assert {p.name for p in (root / "plots/unsupervised").iterdir()} == {"iterations.csv", "iterations.png", "association_graph.png"}
    lines = (root / "plots/unsupervised/iterations.csv").read_text().splitlines()
    header = lines[0].split(",")
    assert {"algorithm", "iteration", "communities", "isolated", "wrong_associations", "accuracy",
            "active_clients"} <= set(header)
    assert {line.split(",")[0] for line in lines[1:]} == {"fedcref", "local"}


def test_same_seed_same_clients():
    section = parse_params(SMALL).unsupervised
    a, _ = build_clients(section, None, 10)
    b, _ = build_clients(section, None, 10)
    assert a.k == b.k and all(np.array_equal(x, y) for x, y in zip(a.initial, b.initial))


def test_bad_keys_are_named():
    with pytest.raises(ParamsError, match="unsupervised.fedcref.theta"):
        parse_params({"unsupervised": {"fedcref": {"theta": 1.5}}})
    with pytest.raises(ParamsError, match="data.root: required for unsupervised.dataset 'mnist'"):
        parse_params({"unsupervised": {"dataset": "mnist"}})


@pytest.mark.parametrize("initial, shape", [("dec", "small"), ("dec_paper", "paper")])
def test_initial_dec_picks_the_dec_shape(monkeypatch, initial, shape):
    """``initial: dec_paper`` runs each client's DEC with the original d-500-500-2000-10
    encoder, ``dec`` with the small one; the labels they return become the initial
    clustering."""
    import importlib

    stage_module = importlib.import_module("clusterfed.stages.unsupervised")  # the package re-exports a function of that name
    seen = {}

    def fake_local_dec(clients, *, seed, **kwargs):
        seen.update(kwargs, seed=seed)
        return [np.zeros(len(x), dtype=np.int64) for x in clients.x]

    monkeypatch.setattr(stage_module, "local_dec", fake_local_dec)
    section = parse_params({**SMALL, "unsupervised": {**SMALL["unsupervised"], "initial": initial}}).unsupervised
    clients, _ = build_clients(section, None, 10)
    assert seen == {"shape": shape, "seed": 10}
    assert all((q == 0).all() for q in clients.initial)


def test_stable_after_and_retrain_on_leave_are_params_keys():
    section = parse_params({"unsupervised": {"fedcref": {"stable_after": 2, "retrain_on_leave": True}}}).unsupervised
    from clusterfed.stages.unsupervised import fedcref_params

    assert fedcref_params(section).stable_after == 2
    assert fedcref_params(section).retrain_on_leave is True
    assert fedcref_params(parse_params({}).unsupervised).retrain_on_leave is False
    with pytest.raises(ParamsError, match="unsupervised.fedcref.stable_after"):
        parse_params({"unsupervised": {"fedcref": {"stable_after": 0}}})
    with pytest.raises(ParamsError, match="unsupervised.fedcref.retrain_on_leave"):
        parse_params({"unsupervised": {"fedcref": {"retrain_on_leave": "sometimes"}}})
