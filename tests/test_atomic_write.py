"""Files are replaced whole, also when two processes write the same file at once (the
seeds of a sweep share their output folder's schedule.json)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from clusterfed.atomic_write import write_atomically
from clusterfed.scenarios.federation import DeviceSplits, Federation
from clusterfed.stages.files import read_json, write_json
from clusterfed.tensorfile import save_tensors


def test_a_second_writer_of_the_same_file_does_not_take_the_first_ones_temporary_file(tmp_path):
    """The first writer is between its write and its rename when the second one writes
    the same path. With one fixed temporary name, the second renamed the first's file
    away and the first rename failed (FileNotFoundError, as two benchmark lanes hit)."""
    target = tmp_path / "schedule.json"

    def first(tmp):
        tmp.write_text("first")
        write_atomically(target, lambda inner: inner.write_text("second"))
        assert tmp.read_text() == "first"  # still there, not renamed over the target

    write_atomically(target, first)
    assert target.read_text() == "first"  # the later rename wins, whole
    assert [p.name for p in tmp_path.iterdir()] == ["schedule.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "out" / "metrics.json"
    write_json(target, {"accuracy": 0.5})

    def fails(tmp):
        tmp.write_text("half of it")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(target, fails)
    assert read_json(target) == {"accuracy": 0.5}
    assert [p.name for p in target.parent.iterdir()] == ["metrics.json"]


def test_every_writer_leaves_only_its_file(tmp_path):
    write_json(tmp_path / "a" / "x.json", [1, 2])
    save_tensors({"w": torch.arange(4.0)}, tmp_path / "b" / "m.safetensors", metadata={"k": "v"})
    rng = np.random.default_rng(0)
    device = DeviceSplits(*(a for _ in range(3) for a in (rng.random((4, 2), dtype=np.float32), np.array([0, 1, 0, 1]))))
    fed = Federation(devices=(device,), groups=np.array([0]), n_classes=2, input_shape=(2,), scenario="S2",
                     dataset="toy", seed=0)
    fed.save(tmp_path / "c" / "fed.npz")

    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "a/x.json", "b/m.safetensors", "c/fed.npz"]
    assert json.loads((tmp_path / "a" / "x.json").read_text()) == [1, 2]
    assert torch.equal(load_file(tmp_path / "b" / "m.safetensors")["w"], torch.arange(4.0))
    assert np.array_equal(Federation.load(tmp_path / "c" / "fed.npz").devices[0].x_test, device.x_test)
