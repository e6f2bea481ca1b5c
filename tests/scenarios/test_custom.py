"""Custom federations: checked on construction, built from arrays or a folder of .npz files,
and run through the pipeline with ``scenario.name: custom``."""

import json
from dataclasses import replace

import numpy as np
import pytest

from clusterfed import stages
from clusterfed.layout import RunLayout
from clusterfed.config import ParamsError, parse_params
from clusterfed.scenarios import Federation, build_scenario, federation_from_arrays, federation_from_folder


@pytest.fixture(scope="module")
def s2(digits):
    return build_scenario(digits, "S2", group_sizes=[2, 2], seed=1)


def _device_arrays(fed: Federation) -> list[dict]:
    """Train (train+val) and test arrays per device, as a user would hold them."""
    return [
        {"x_train": np.concatenate([d.x_train, d.x_val]), "y_train": np.concatenate([d.y_train, d.y_val]),
         "x_test": d.x_test, "y_test": d.y_test}
        for d in fed.devices
    ]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda f: {"groups": f.groups[:3]}, r"groups: expected 4 integers \(one per device\), got shape \(3,\)"),
        (lambda f: {"n_classes": 1}, r"n_classes: expected an integer >= 2, got 1"),
        (lambda f: {"devices": ()}, r"devices: no devices"),
        (lambda f: {"devices": (f.devices[0], replace(f.devices[1], y_test=np.full_like(f.devices[1].y_test, 42)))},
         r"devices\[1\]\.y_test: label 42 outside 0\.\.9 \(n_classes 10\)"),
        (lambda f: {"devices": (replace(f.devices[0], y_train=f.devices[0].y_train[:-1]),)},
         r"devices\[0\]\.y_train: \d+ labels for \d+ samples in x_train"),
        (lambda f: {"devices": (replace(f.devices[0], x_val=f.devices[0].x_val.astype(np.float64)),)},
         r"devices\[0\]\.x_val: expected a float32 array, got float64"),
        (lambda f: {"devices": (replace(f.devices[0], x_test=f.devices[0].x_test.reshape(-1, 64)),)},
         r"devices\[0\]\.x_test: samples of shape \(64,\), expected input_shape \(1, 8, 8\)"),
        (lambda f: {"devices": (replace(f.devices[0], x_train=np.where(f.devices[0].x_train > 0.5, np.nan, f.devices[0].x_train).astype(np.float32)),)},
         r"devices\[0\]\.x_train: \d+ non-finite values"),
        (lambda f: {"devices": (replace(f.devices[0], y_test=f.devices[0].y_test[:0], x_test=f.devices[0].x_test[:0]),)},
         r"devices\[0\]\.x_test: no samples"),
    ],
)
def test_a_federation_refuses_bad_arrays_naming_the_field(s2, change, message):
    changes = change(s2)
    if "devices" in changes and "groups" not in changes:
        changes["groups"] = s2.groups[: len(changes["devices"])]
    with pytest.raises(ValueError, match=message):
        replace(s2, **changes)


def test_arrays_become_a_federation_with_a_seeded_validation_split(s2):
    fed = federation_from_arrays(_device_arrays(s2), groups=s2.groups.tolist(), val_fraction=0.25, seed=3)
    assert (fed.n_devices, fed.n_classes, fed.input_shape, fed.scenario) == (4, 10, (1, 8, 8), "custom")
    assert fed.groups.tolist() == s2.groups.tolist() and fed.description["ground_truth"] is True
    for mine, theirs in zip(fed.devices, s2.devices):
        n = theirs.n_train + len(theirs.y_val)
        assert (len(mine.y_val), mine.n_train) == (round(0.25 * n), n - round(0.25 * n))
        assert np.array_equal(np.sort(np.concatenate([mine.y_train, mine.y_val])),
                              np.sort(np.concatenate([theirs.y_train, theirs.y_val])))
        assert np.array_equal(mine.x_test, theirs.x_test)
    again = federation_from_arrays(_device_arrays(s2), seed=3)
    assert np.array_equal(again.devices[2].y_val, fed.devices[2].y_val)
    assert again.description["ground_truth"] is False and again.groups.tolist() == [0, 0, 0, 0]
    # [N, H, W] images get one channel; integer pixels become float32
    flat = [{**d, "x_train": (d["x_train"][:, 0] * 16).astype(np.uint8), "x_test": d["x_test"][:, 0]} for d in _device_arrays(s2)]
    assert federation_from_arrays(flat).devices[0].x_train.dtype == np.float32


def test_a_folder_of_npz_files_is_a_federation_and_bad_files_are_named(s2, tmp_path):
    for d, arrays in enumerate(_device_arrays(s2)):
        np.savez(tmp_path / f"device_{d:02d}.npz", **arrays)
    (tmp_path / "groups.json").write_text(json.dumps(s2.groups.tolist()))
    fed = federation_from_folder(tmp_path, seed=0)
    assert fed.n_devices == 4 and fed.groups.tolist() == s2.groups.tolist()

    bad = _device_arrays(s2)[1]
    np.savez(tmp_path / "device_01.npz", **{**bad, "y_test": bad["y_test"] + 10})
    with pytest.raises(ValueError, match=r"devices\[1\]\.y_test: label \d+ outside 0\.\.\d+.*device_01\.npz"):
        federation_from_folder(tmp_path, n_classes=10)
    np.savez(tmp_path / "device_01.npz", x_train=bad["x_train"])
    with pytest.raises(ValueError, match=r"devices\[1\]: missing arrays \['y_train', 'x_test', 'y_test'\]"):
        federation_from_folder(tmp_path)
    (tmp_path / "device_01.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ValueError, match=r"device_01\.npz: not a readable \.npz file"):
        federation_from_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no \.npz files \(one per device\)"):
        federation_from_folder(tmp_path / "empty")


def test_the_pipeline_runs_a_custom_folder(s2, tmp_path):
    folder = tmp_path / "my_devices"
    folder.mkdir()
    for d, arrays in enumerate(_device_arrays(s2)):
        np.savez(folder / f"device_{d:02d}.npz", **arrays)
    (folder / "groups.json").write_text(json.dumps(s2.groups.tolist()))
    params = parse_params({
        "seeds": [10], "scenario": {"name": "custom", "path": str(folder)},
        "training": {"lr": 0.05, "device": "cpu"}, "coldstart": {"algorithms": ["fedavg"], "rounds": 2},
        "continual": {"enabled": False},
    })
    layout = RunLayout(tmp_path)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    report = stages.evaluate(params, layout)
    saved = Federation.load(layout.partition(10))
    assert saved.scenario == "custom" and saved.dataset == "my_devices" and saved.n_devices == 4
    assert report["coldstart"]["fedavg"]["ari"] == 0.0  # one model for two ground-truth groups
    with pytest.raises(ParamsError, match="scenario.path: required for scenario 'custom'"):
        parse_params({"scenario": {"name": "custom"}, "continual": {"enabled": False}})
    with pytest.raises(ParamsError, match="continual.enabled: continual concepts come from S1, S2, A1, A2, not 'custom'"):
        parse_params({"scenario": {"name": "custom", "path": str(folder)}})
