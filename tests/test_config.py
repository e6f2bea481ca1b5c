"""params.yaml is validated on load: bad keys are named and nothing runs or is written."""

import os
import re
from pathlib import Path

import pytest
import yaml

from clusterfed.cli import main
from clusterfed.config import ParamsError, load_params, parse_params

REPO = Path(__file__).resolve().parents[1]


def test_model_defaults_are_the_libraries():
    from clusterfed import models
    from clusterfed.config import ModelParams

    assert ModelParams().conv_channels == models.CONV_CHANNELS
    assert ModelParams().kernel_size == models.KERNEL_SIZE


def test_repository_params_are_valid():
    params = load_params(REPO / "params.yaml")
    assert params.data.dataset == "digits"
    assert params.coldstart.algorithms == [
        "faacl", "fedclust", "stocfl", "flacc", "fedavg", "ifca", "local", "centralized",
        "cfl", "pacfl", "flhc", "fesem", "fedgroup", "fedsoft", "fedprox", "fednova", "ditto", "perfedavg", "pfedme",
        "lgfedavg",
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"coldstart": {"faacl": {"alpha": 1.5}}}, "coldstart.faacl.alpha: Input should be less than 1"),
        ({"training": {"lr": "fast"}}, "training.lr: Input should be a valid number"),
        ({"scenario": {"nmae": "S1"}}, "scenario.nmae: unknown key"),
        ({"scenario": {"name": "S7"}}, "scenario.name: Input should be"),
        ({"training": {"batch_size": 0}}, "training.batch_size: Input should be greater than 0"),
        ({"coldstart": {"algorithms": ["faacl", "faacl"]}}, "coldstart.algorithms: Value error, algorithms listed twice"),
        ({"seeds": []}, "seeds: List should have at least 1 item"),
        ({"data": {"dataset": "mnist"}}, "data.root: required"),
        ({"scenario": {"name": "dirichlet"}, "continual": {"enabled": False}}, "scenario.n_devices: required"),
        ({"scenario": {"name": "hybrid"}, "continual": {"enabled": False}}, "scenario.second_dataset: required"),
        ({"scenario": {"name": "rotated"}}, "continual.enabled: continual concepts come from S1, S2, A1, A2"),
        ({"scenario": {"samples_per_device": [800, 200]}}, "scenario.samples_per_device: Value error, range"),
        ({"scenario": {"samples_per_device": [200, 800]}}, "scenario.samples_per_device: scenario S2 takes one"),
        ({"scenario": {"newcomers": 1.0}}, "scenario.newcomers: Input should be less than 1"),
        ({"scenario": {"s1_out_of_range": "drop"}}, "scenario.s1_out_of_range: Input should be 'relabel' or 'exclusive'"),
        ({"scenario": {"s1_out_of_range": "exclusive"}}, "scenario.s1_out_of_range: read only by scenario S1, not 'S2'"),
        ({"training": {"participation": 0.2}}, "coldstart.algorithms: ['faacl', 'centralized', 'cfl'] need every device"),
        ({"training": {"participation": 0.0}}, "training.participation: Input should be greater than 0"),
        ({"coldstart": {"algorithms": ["fedweit"]}}, "coldstart.algorithms.0: Input should be"),
        ({"model": {"kernel_size": 4}}, "model.kernel_size: Value error, kernel_size must be odd"),
        ({"model": {"conv_channels": [32]}}, "model.conv_channels.1: Field required (got [32])"),
        ({"training": {"lr": float("inf")}}, "training.lr: Input should be a finite number (got inf)"),
        ({"training": {"lr": True}}, "training.lr: Value error, expected a number, got a boolean (got True)"),
        ({"coldstart": {"faacl": {"epsilon": float("inf")}}}, "coldstart.faacl.epsilon: Input should be a finite number"),
        ({"scenario": {"noise": {"gaussian_variance": float("nan")}}}, "scenario.noise.gaussian_variance: Input should be a finite number"),
        ({"scenario": {"group_sizes": [True, 2]}}, "scenario.group_sizes: Value error, expected a number, got a boolean"),
        ({"training": {"local_epochs": True}}, "training.local_epochs: Value error, expected a number, got a boolean"),
    ],
)
def test_bad_values_name_the_key(raw, message):
    with pytest.raises(ParamsError, match=re.escape(message)):
        parse_params(raw)


def test_cli_refuses_bad_params_before_any_work(tmp_path, capsys):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["coldstart"]["faacl"]["epsilon"] = -1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["partition"]) == 2
    finally:
        os.chdir(cwd)
    assert "coldstart.faacl.epsilon" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


def test_missing_params_file_is_named(tmp_path):
    with pytest.raises(ParamsError, match="nope.yaml: file not found"):
        load_params(tmp_path / "nope.yaml")


def test_yaml_infinities_and_booleans_are_refused_as_numbers(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("training:\n  lr: .inf\n  l2: .nan\ncoldstart:\n  rounds: true\ncontinual:\n  enabled: yes\n")
    with pytest.raises(ParamsError) as info:
        load_params(path)
    lines = str(info.value).splitlines()[1:]
    assert lines == [
        "  training.lr: Input should be a finite number (got inf)",
        "  training.l2: Input should be a finite number (got nan)",
        "  coldstart.rounds: Value error, expected a number, got a boolean (got True)",
    ]  # `enabled: yes` is a boolean where one is expected: fine
