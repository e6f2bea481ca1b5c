"""Cluster models on disk: safetensors + spec.json, rebuilt to identical predictions."""

import json

import numpy as np
import pytest
import torch

from clusterfed.models import build_model, glorot_init_
from clusterfed.tracking.model_files import (
    FORMAT,
    ModelSpec,
    cluster_state_dict,
    load_cluster_model,
    save_cluster_model,
)


def _trained_like(architecture: str, input_shape: tuple[int, ...], seed: int, **shape) -> torch.nn.Module:
    module = build_model(architecture, input_shape, 10, hidden=32, **shape)
    glorot_init_(module, torch.Generator().manual_seed(seed))
    with torch.no_grad():  # non-zero biases too, so a dropped tensor would show
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(seed + 1))
    return module.eval()


@pytest.mark.parametrize("architecture, input_shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8))])
def test_roundtrip_gives_identical_predictions(tmp_path, digits, architecture, input_shape):
    module = _trained_like(architecture, input_shape, seed=3)
    spec = ModelSpec(architecture, input_shape, 10, 32, provenance={"cluster": 4})
    path = save_cluster_model(tmp_path / "m", module.state_dict(), spec)
    loaded = load_cluster_model(path)

    x = torch.as_tensor(digits.x_test[:200])
    with torch.no_grad():
        assert torch.equal(loaded.module(x), module(x))
    assert np.array_equal(loaded.predict(digits.x_test[:200]), module(x).argmax(-1).numpy())
    assert loaded.spec == spec
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "spec.json"]
    assert json.loads((path / "spec.json").read_text())["format"] == FORMAT


def test_cnn_shape_travels_in_the_spec(tmp_path, digits):
    module = _trained_like("cnn", (1, 8, 8), seed=5, conv_channels=(4, 6), kernel_size=5)
    spec = ModelSpec("cnn", (1, 8, 8), 10, 32, conv_channels=(4, 6), kernel_size=5)
    path = save_cluster_model(tmp_path / "m", module.state_dict(), spec)
    assert json.loads((path / "spec.json").read_text())["conv_channels"] == [4, 6]
    loaded = load_cluster_model(path)
    x = torch.as_tensor(digits.x_test[:50])
    with torch.no_grad():
        assert torch.equal(loaded.module(x), module(x))
    assert loaded.module.conv1.weight.shape == (4, 1, 5, 5)


def test_spec_files_without_cnn_shape_load_with_the_defaults(tmp_path):
    module = _trained_like("cnn", (1, 8, 8), seed=0)
    path = save_cluster_model(tmp_path / "m", module.state_dict(), ModelSpec("cnn", (1, 8, 8), 10, 32))
    raw = json.loads((path / "spec.json").read_text())
    del raw["conv_channels"], raw["kernel_size"]  # as written before they were configurable
    (path / "spec.json").write_text(json.dumps(raw))
    assert load_cluster_model(path).spec.conv_channels == (16, 32)


def test_row_of_stacked_params_is_that_models_state_dict(digits):
    models = [_trained_like("mlp", (1, 8, 8), seed=s) for s in (1, 2, 3)]
    stacked = {k: torch.stack([m.state_dict()[k] for m in models]) for k in models[0].state_dict()}
    row = cluster_state_dict(stacked, 1)
    assert all(torch.equal(row[k], models[1].state_dict()[k]) for k in row)


def test_flat_inputs_are_accepted_and_wrong_shapes_refused(tmp_path, digits):
    module = _trained_like("mlp", (1, 8, 8), seed=0)
    loaded = load_cluster_model(save_cluster_model(tmp_path / "m", module.state_dict(), ModelSpec("mlp", (1, 8, 8), 10, 32)))
    x = digits.x_test[:20]
    assert np.array_equal(loaded.predict(x.reshape(20, 64)), loaded.predict(x))
    with pytest.raises(ValueError, match=r"expected inputs of shape \[N, 1, 8, 8\]"):
        loaded.predict(np.zeros((3, 5), dtype=np.float32))


def test_a_spec_that_does_not_fit_the_weights_is_refused_before_writing(tmp_path):
    module = _trained_like("mlp", (1, 8, 8), seed=0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        save_cluster_model(tmp_path / "m", module.state_dict(), ModelSpec("mlp", (1, 8, 8), 10, 64))
    assert not (tmp_path / "m").exists()


def test_other_formats_are_refused(tmp_path):
    module = _trained_like("mlp", (1, 8, 8), seed=0)
    path = save_cluster_model(tmp_path / "m", module.state_dict(), ModelSpec("mlp", (1, 8, 8), 10, 32))
    spec = json.loads((path / "spec.json").read_text())
    (path / "spec.json").write_text(json.dumps({**spec, "format": "pickle"}))
    with pytest.raises(ValueError, match="not a clusterfed cluster model"):
        load_cluster_model(path)
