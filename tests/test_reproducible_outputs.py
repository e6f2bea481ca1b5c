"""Identical params give byte-identical stage outputs (what DVC hashes), so a forced
re-run leaves ``dvc status`` clean; wall times live outside the tracked outputs.

safetensors keeps a file's metadata in a Rust hash map seeded at random in every
process, so a file written by its own ``save``/``save_file`` has its metadata keys in a
random order: with FedCRef's two keys two writes differ only half the time, too rarely
for a comparison of two runs to catch reliably. So the stages run with safetensors'
serialisers made adversarial (``reversed_metadata``: keys always in reverse order,
never by chance sorted), and every tracked safetensors output must have its metadata
keys sorted: an output that does not sort them fails every time, however it reaches
safetensors. And no module but ``clusterfed.tensorfile`` (which sorts them) may import
a safetensors writer."""

import ast
import json
import random
from pathlib import Path

import pytest
import safetensors
import safetensors.numpy
import safetensors.torch

import clusterfed

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
    stages.unsupervised(params, layout, progress=False)
    stages.evaluate(params, layout)


def _reverse_metadata(blob: bytes) -> bytes:
    """The same safetensors bytes with the metadata keys in reverse sorted order."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    if "__metadata__" in header:
        header = {"__metadata__": dict(sorted(header.pop("__metadata__").items(), reverse=True)), **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + n :]


@pytest.fixture
def reversed_metadata(monkeypatch):
    """safetensors' serialisers (behind ``save``, ``save_file`` of its torch and numpy
    modules, and its own) write the metadata keys in reverse order instead of hash-map
    order: deterministic, and unsorted whenever there are two keys or more."""
    honest = safetensors.serialize

    def serialize(tensors, metadata=None):
        return _reverse_metadata(bytes(honest(tensors, metadata=metadata)))

    def serialize_file(tensors, filename, metadata=None):
        Path(filename).write_bytes(serialize(tensors, metadata=metadata))

    for module in (safetensors, safetensors.torch, safetensors.numpy):
        monkeypatch.setattr(module, "serialize", serialize)
        monkeypatch.setattr(module, "serialize_file", serialize_file)


def _metadata(blob: bytes) -> dict:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8 : 8 + n]).get("__metadata__", {})


def _safetensors_writers(path: Path) -> list[str]:
    """Lines of ``path`` that import or call a safetensors writer (``save``, ``save_file``, …)."""
    tree = ast.parse(path.read_text())
    modules = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
               for alias in node.names if alias.name.split(".")[0] == "safetensors"}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "safetensors":
            out += [f"{path}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("save")]
        if isinstance(node, ast.Attribute) and node.attr.startswith("save"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                out.append(f"{path}:{node.lineno} calls .{node.attr}")
    return out


def test_only_tensorfile_writes_safetensors():
    package = Path(clusterfed.__file__).parent
    repo = package.parents[1]
    files = [*package.rglob("*.py"), *(repo / "stages").rglob("*.py"), *(repo / "pipelines").rglob("*.py")]
    assert len(files) > 50
    tensorfile = package / "tensorfile.py"
    assert [w.split(" ", 1)[1] for w in _safetensors_writers(tensorfile)] == ["imports save"]  # the check sees it
    assert [w for f in files if f != tensorfile for w in _safetensors_writers(f)] == []


def test_every_stage_twice_gives_identical_bytes(tmp_path, reversed_metadata):
    _run_stages(tmp_path / "a")
    _run_stages(tmp_path / "b")
    tracked = {sub: _files(tmp_path / "a" / sub) for sub in ("data", "metrics", "plots")}
    assert tracked == {sub: _files(tmp_path / "b" / sub) for sub in ("data", "metrics", "plots")}
    assert any(name.endswith("state.json") for name in tracked["data"])  # checkpoints are compared too
    assert any(name.endswith("community_models.safetensors") for name in tracked["data"])  # FedCRef's too
    unsorted = [name for name, blob in tracked["data"].items()
                if name.endswith(".safetensors") and list(_metadata(blob)) != sorted(_metadata(blob))]
    assert unsorted == []
    assert not any(b"wall" in blob for blob in tracked["data"].values())
    walls = [json.loads(line) for line in RunLayout(tmp_path / "a").wall_times.read_text().splitlines()]
    assert [(w["algorithm"], w["t"]) for w in walls] == [(a, t) for a in ("cfaacl", "fedprox_ewc") for t in range(3)]


def test_safetensors_metadata_is_written_in_sorted_order(tmp_path, reversed_metadata):
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


def test_tensors_sharing_storage_are_written_as_copies(tmp_path):
    """A state may hold one tensor under two names (FlexCFL's FeSEM: a centre is a
    participant's local model); the file keeps both values, written apart."""
    w = torch.arange(6.0).reshape(2, 3)
    tensors = {"centre": w, "local": w, "row": w[1], "other": torch.ones(2)}
    save_tensors(tensors, tmp_path / "m.safetensors")
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    assert loaded["centre"].data_ptr() != loaded["local"].data_ptr()
