"""End to end on real digits: partition -> coldstart -> evaluate through the stage functions."""

import json

import numpy as np
import pytest
from safetensors.torch import load_file

from clusterfed import stages
from clusterfed.build import checkpoint_fingerprint
from clusterfed.layout import RunLayout
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
                "rounds": 20,
                "faacl": {"epsilon": 0.5, "init_epochs": 40},
            },
            "continual": {"enabled": False},  # a cold-start run: evaluate reports no continual section
        }
    )
    layout = RunLayout(root)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    report = stages.evaluate(params, layout)
    return root, report["coldstart"]


def test_faacl_recovers_the_s2_groups_end_to_end(run):
    root, metrics = run
    assert metrics["faacl"]["ari"] == 1.0
    assert metrics["faacl"]["n_clusters"] == 2
    assert metrics["fedavg"]["n_clusters"] == 1
    assert metrics["faacl"]["accuracy"] > metrics["fedavg"]["accuracy"] + 0.3  # S2 breaks FedAvg
    assert json.loads((root / "metrics" / "metrics.json").read_text()) == {"coldstart": metrics}
    assert set(metrics["faacl"]) >= {"accuracy", "accuracy_stderr", "n_clusters", "ari"}


def test_outputs_are_readable_and_consistent(run):
    root, _ = run
    run_dir = root / "data" / "coldstart" / "faacl" / "seed_10"
    clustering = json.loads((run_dir / "clustering.json").read_text())
    assert sorted(d for c in clustering["clusters"] for d in c["devices"]) == list(range(10))
    models = load_file(str(run_dir / "models.safetensors"))
    assert models["output.bias"].shape == (len(clustering["clusters"]), 10)
    accuracy = json.loads((run_dir / "device_accuracy.json").read_text())
    assert np.mean(accuracy) == pytest.approx(json.loads((root / "metrics" / "metrics.json").read_text())["coldstart"]["faacl"]["accuracy"], abs=1e-5)
    rows = (root / "plots" / "accuracy.csv").read_text().splitlines()
    assert rows[0] == "algorithm,round,accuracy,mb_sent"
    assert len([r for r in rows if r.startswith("faacl,")]) > 20
    assert (root / "plots" / "accuracy_vs_traffic.png").stat().st_size > 0
    assert (root / "plots" / "accuracy.png").stat().st_size > 0


def test_failed_stage_leaves_nothing_half_written(tmp_path):
    params = parse_params({"seeds": [10], "coldstart": {"algorithms": ["fedavg"], "rounds": 1}})
    with pytest.raises(FileNotFoundError):
        stages.coldstart(params, RunLayout(tmp_path), progress=False)  # no partitions
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    assert not (tmp_path / "data" / "coldstart").exists()


def test_an_interrupted_coldstart_stage_resumes_to_the_same_outputs(tmp_path, monkeypatch):
    """The second method crashes in round 5 (snapshots every 2 rounds); the rerun
    resumes both fits, writes outputs byte-identical to an uninterrupted stage and
    deletes the snapshots."""
    from clusterfed.algorithms import IFCA

    params = parse_params({
        "seeds": [10], "scenario": {"name": "S2", "group_sizes": [2, 2]},
        "training": {"lr": 0.05, "device": "cpu"},
        "coldstart": {"algorithms": ["fedavg", "ifca"], "rounds": 6, "checkpoint_every": 2},
    })
    whole, broken = RunLayout(tmp_path / "whole"), RunLayout(tmp_path / "broken")
    for layout in (whole, broken):
        stages.partition(params, layout)
    stages.coldstart(params, whole, progress=False)

    honest, rounds = IFCA.configure_round, {"n": 0}

    def crash_in_round_5(self, *args, **kwargs):
        rounds["n"] += 1
        if rounds["n"] == 5:
            raise KeyboardInterrupt
        return honest(self, *args, **kwargs)

    monkeypatch.setattr(IFCA, "configure_round", crash_in_round_5)
    with pytest.raises(KeyboardInterrupt):
        stages.coldstart(params, broken, progress=False)
    monkeypatch.setattr(IFCA, "configure_round", honest)
    assert not broken.coldstart.exists()  # nothing half-written
    snapshots = sorted(p.parent.relative_to(broken.coldstart_checkpoints).as_posix()
                       for p in broken.coldstart_checkpoints.rglob("state.json"))
    assert snapshots == ["fedavg/seed_10", "ifca/seed_10"]
    assert json.loads((broken.coldstart_checkpoint("ifca", 10) / "state.json").read_text())["meta"]["round"] == 4

    stages.coldstart(params, broken, progress=False)
    files = sorted(p.relative_to(whole.coldstart) for p in whole.coldstart.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(broken.coldstart) for p in broken.coldstart.rglob("*") if p.is_file())
    for f in files:
        assert (whole.coldstart / f).read_bytes() == (broken.coldstart / f).read_bytes(), f
    assert not broken.coldstart_checkpoints.exists()


@pytest.fixture(scope="module")
def newcomer_run(tmp_path_factory):
    """Shifted digits (4 label shifts), 2 of 12 devices join after the federation,
    half of the devices take part in each round."""
    root = tmp_path_factory.mktemp("newcomers")
    params = parse_params(
        {
            "seeds": [3],
            "scenario": {"name": "shifted", "group_sizes": [3, 3, 3, 3], "samples_per_device": 100,
                         "test_samples_per_device": 40, "newcomers": 0.2},
            "training": {"lr": 0.05, "device": "cpu", "participation": 0.5},
            "coldstart": {"algorithms": ["fedavg", "ifca", "stocfl"], "rounds": 30, "ifca": {"n_clusters": 4},
                          "stocfl": {"tau": 0.3}},
            "continual": {"enabled": False},
            "evaluate": {"target_accuracy": 0.5},
        }
    )
    layout = RunLayout(root)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    report = stages.evaluate(params, layout)
    return root, report["coldstart"]


def test_newcomers_are_held_out_and_served_after_the_federation(newcomer_run):
    root, metrics = newcomer_run
    groups = json.loads((root / "data" / "partitions" / "groups.json").read_text())["3"]
    newcomers = groups["newcomers"]
    assert len(newcomers) == 2 and groups["groups"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for name in ("fedavg", "ifca"):
        run_dir = root / "data" / "coldstart" / name / "seed_3"
        clustering = json.loads((run_dir / "clustering.json").read_text())
        federated = sorted(set(range(12)) - set(newcomers))
        assert clustering["devices"] == federated
        assert sorted(d for c in clustering["clusters"] for d in c["devices"]) == federated
        assert clustering["ground_truth_groups"] == [groups["groups"][d] for d in federated]
        served = json.loads((run_dir / "newcomers.json").read_text())
        assert served["devices"] == newcomers and served["rule"] == "lowest_loss"
        assert len(served["accuracy"]) == 2
        assert metrics[name]["newcomer_accuracy"] == pytest.approx(np.mean(served["accuracy"]))
    assert json.loads((root / "data" / "coldstart" / "fedavg" / "seed_3" / "newcomers.json").read_text())["model_index"] == [0, 0]


def test_stocfl_serves_newcomers_with_the_cluster_of_their_group(newcomer_run):
    root, metrics = newcomer_run
    run_dir = root / "data" / "coldstart" / "stocfl" / "seed_3"
    clustering = json.loads((run_dir / "clustering.json").read_text())
    served = json.loads((run_dir / "newcomers.json").read_text())
    groups = json.loads((root / "data" / "partitions" / "groups.json").read_text())["3"]["groups"]
    assert metrics["stocfl"]["ari"] == 1.0 and served["rule"] == "own"
    model_of_group = {clustering["ground_truth_groups"][i]: m for i, m in enumerate(clustering["model_of_device"])}
    assert served["model_index"] == [model_of_group[groups[d]] for d in served["devices"]]


def test_partial_participation_traffic_and_rounds_to_target(newcomer_run):
    root, metrics = newcomer_run
    history = json.loads((root / "data" / "coldstart" / "fedavg" / "seed_3" / "history.json").read_text())
    model = load_file(str(root / "data" / "coldstart" / "fedavg" / "seed_3" / "models.safetensors"))
    size = sum(v[0].numel() * 4 for v in model.values())
    # 10 federated devices at participation 0.5: 5 download and 5 upload the model each round.
    assert {(r["bytes_down"], r["bytes_up"]) for r in history} == {(5 * size, 5 * size)}
    assert metrics["fedavg"]["mb_per_round"] == pytest.approx(10 * size / 1e6)
    ifca = json.loads((root / "data" / "coldstart" / "ifca" / "seed_3" / "history.json").read_text())
    assert {r["bytes_down"] for r in ifca} == {4 * 5 * size}  # each participant downloads all 4 models
    reached = next(r["round"] for r in ifca if r["accuracy"] >= 0.5)
    assert metrics["ifca"]["rounds_to_target"] == reached
    assert metrics["ifca"]["mb_to_target"] == pytest.approx(reached * 25 * size / 1e6)
    assert metrics["ifca"]["target_reached"] == "1/1"


def test_traffic_scores_split_clustering_and_training_rounds():
    from clusterfed.evaluation import summarize_runs, traffic_scores

    history = [
        {"phase": "clustering", "accuracy": 0.2, "bytes_down": 3_000_000, "bytes_up": 1_000_000},
        {"phase": "training", "accuracy": 0.6, "bytes_down": 1_000_000, "bytes_up": 1_000_000},
        {"phase": "training", "accuracy": 0.9, "bytes_down": 1_000_000, "bytes_up": 1_000_000},
    ]
    scores = traffic_scores(history, 0.6)
    assert scores == {"mb_per_round": 8 / 3, "mb_per_round_clustering": 4.0, "mb_per_round_training": 2.0,
                      "rounds": 3, "rounds_to_target": 2, "mb_to_target": 6.0}
    never = traffic_scores(history, 0.95)
    assert never["rounds_to_target"] is None and never["mb_to_target"] is None
    summary = summarize_runs([
        {"device_accuracy": [0.5, 0.7], "n_clusters": 2, "ari": None, "nmi": None, **scores},
        {"device_accuracy": [0.9, 0.9], "n_clusters": 3, "ari": None, "nmi": None, **never},
    ])
    assert summary["accuracy"] == pytest.approx(0.75) and summary["n_clusters"] == 2.5
    assert summary["ari"] is None and summary["rounds_to_target"] is None
    assert summary["target_reached"] == "1/2" and summary["mb_per_round_training"] == 2.0


def test_checkpoint_fingerprint_follows_only_what_the_model_uses():
    """An MLP run's checkpoints survive a change of the CNN-only keys; a CNN's do not."""
    base = {"data": {"dataset": "digits"}}
    mlp = parse_params(base)
    mlp_other_cnn = parse_params({**base, "model": {"conv_channels": [32, 64], "kernel_size": 5}})
    assert checkpoint_fingerprint(mlp, "cfaacl", 10) == checkpoint_fingerprint(mlp_other_cnn, "cfaacl", 10)
    cnn = parse_params({**base, "model": {"name": "cnn"}})
    cnn_5x5 = parse_params({**base, "model": {"name": "cnn", "kernel_size": 5}})
    assert checkpoint_fingerprint(cnn, "cfaacl", 10) != checkpoint_fingerprint(cnn_5x5, "cfaacl", 10)
    assert checkpoint_fingerprint(mlp, "cfaacl", 10) != checkpoint_fingerprint(mlp, "cfaacl", 11)


def test_checkpoint_fingerprint_ignores_where_the_dataset_lies():
    """A run resumed with the same MNIST files at another path (a carried copy on a lent
    machine) keeps its checkpoints; another dataset does not."""
    here = parse_params({"data": {"dataset": "mnist", "root": "../shared/datasets"}})
    moved = parse_params({"data": {"dataset": "mnist", "root": ".mnist"}})
    digits = parse_params({"data": {"dataset": "digits"}})
    assert checkpoint_fingerprint(here, "feddrift", 10) == checkpoint_fingerprint(moved, "feddrift", 10)
    assert checkpoint_fingerprint(here) == checkpoint_fingerprint(moved)
    assert checkpoint_fingerprint(here, "feddrift", 10) != checkpoint_fingerprint(digits, "feddrift", 10)


def test_support_graph_and_edges_per_round_for_algorithms_with_supporters(run):
    root, _ = run
    history = json.loads((root / "data" / "coldstart" / "faacl" / "seed_10" / "history.json").read_text())
    assert any(r["support_edges"] for r in history)  # FAACL's clustering rounds test support
    lines = (root / "plots" / "support" / "edges.csv").read_text().splitlines()
    rows = [line for line in lines if line.startswith("faacl,")]
    assert lines[0] == "algorithm,round,support_edges,one_way_edges,helping_memberships" and len(rows) == len(history)
    for line, r in zip(rows, history):
        assert line == (f"faacl,{r['round']},{float(r['support_edges'])},{float(r['one_way_edges'])},"
                        f"{float(r['helping_memberships'])}")
        assert r["one_way_edges"] <= r["support_edges"] and r["helping_memberships"] == 0  # default merge: a partition
    assert (root / "plots" / "support" / "faacl.png").stat().st_size > 0
    # FedAvg and the oracle never have supportive clusters: no picture for them
    assert not (root / "plots" / "support" / "fedavg.png").exists()
    assert not (root / "plots" / "support" / "centralized.png").exists()
