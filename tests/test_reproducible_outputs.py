"""Identical params give byte-identical stage outputs (what DVC hashes), so a forced
re-run leaves ``dvc status`` clean; wall times live outside the tracked outputs."""

import json
import random
from pathlib import Path

import torch
from safetensors.torch import load_file

from clusterfed import stages
from clusterfed.layout import RunLayout
from clusterfed.config import parse_params
from clusterfed.tensorfile import save_tensors

PARAMS = {
    "seeds": [10],
    "scenario": {"name": "S2", "group_sizes": [2, 2]},
    "training": {"lr": 0.05, "device": "cpu"},
    "coldstart": {"algorithms": ["fedavg", "ifca"], "rounds": 2},
    "continual": {
        "algorithms": ["cfaacl", "fedprox_ewc"], "timesteps": 2, "rounds": 1, "samples_per_device": 40,
        "test_samples_per_device": 10, "cfaacl": {"init_epochs": 2}, "feddrift": {"init_epochs": 2},
    },
    "unsupervised": {
        "n_clients": 3, "samples_per_category": 10, "methods": ["fedcref"],
        "fedcref": {"local_epochs": 1, "fl_rounds": 1, "max_iterations": 2},
    },
}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_stages(root: Path) -> None:
    params = parse_params(PARAMS)
    layout = RunLayout(root)
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    stages.continual(params, layout, progress=False)
    stages.unsupervised(params, layout)
    stages.evaluate(params, layout)


def test_every_stage_twice_gives_identical_bytes(tmp_path):
    _run_stages(tmp_path / "a")
    _run_stages(tmp_path / "b")
    tracked = {sub: _files(tmp_path / "a" / sub) for sub in ("data", "metrics", "plots")}
    assert tracked == {sub: _files(tmp_path / "b" / sub) for sub in ("data", "metrics", "plots")}
    assert any(name.endswith("state.json") for name in tracked["data"])  # checkpoints are compared too
    assert any(name.endswith("community_models.safetensors") for name in tracked["data"])  # FedCRef's too
    assert not any(b"wall" in blob for blob in tracked["data"].values())
    walls = [json.loads(line) for line in RunLayout(tmp_path / "a").wall_times.read_text().splitlines()]
    assert [(w["algorithm"], w["t"]) for w in walls] == [(a, t) for a in ("cfaacl", "fedprox_ewc") for t in range(3)]


def test_safetensors_metadata_is_written_in_sorted_order(tmp_path):
    tensors = {"b.weight": torch.arange(6.0).reshape(2, 3), "a.bias": torch.ones(2, dtype=torch.float64)}
    keys = [f"k{i}" for i in range(20)]
    blobs = []
    for attempt in range(3):
        random.Random(attempt).shuffle(keys)
        save_tensors(tensors, tmp_path / f"{attempt}.safetensors", metadata={k: k.upper() for k in keys})
        blobs.append((tmp_path / f"{attempt}.safetensors").read_bytes())
    assert blobs[0] == blobs[1] == blobs[2]
    n = int.from_bytes(blobs[0][:8], "little")
    header = json.loads(blobs[0][8 : 8 + n])
    assert list(header["__metadata__"]) == sorted(keys) and n % 8 == 0
    loaded = load_file(str(tmp_path / "0.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
