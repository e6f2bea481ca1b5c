"""Shared fixtures: real data only (scikit-learn digits; MNIST when ../shared is present)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import clusterfed.engine.engine as engine_module
from clusterfed.data import load_dataset
from clusterfed.engine.robust import update_norms
from clusterfed.engine.stacked import take

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def digits():
    return load_dataset("digits", seed=0)


@pytest.fixture(scope="session")
def mnist():
    if not (SHARED_DATASETS / "MNIST" / "raw").is_dir():
        pytest.skip("real MNIST not found in ../shared/datasets")
    return load_dataset("mnist", SHARED_DATASETS)


@pytest.fixture
def poison_uploads(monkeypatch):
    """``poison_uploads(device, attack)``: from then on in the test, every local-SGD
    upload of ``device`` is ``attack(start, trained)`` (``start``: the model the pair
    began from). The update norms the engine screens are those of the poisoned uploads,
    as the server measures what it receives."""
    honest = engine_module.local_sgd

    def poison(device: int, attack) -> None:
        def sgd(model, params, data, device_idx, *, return_norms=False, **kw):
            trained = honest(model, params, data, device_idx, **kw)
            rows = kw.get("start_rows")
            start = params if rows is None else take(params, rows)
            bad = device_idx == device
            out = {k: torch.where(bad.view(-1, *[1] * (v.dim() - 1)), attack(start[k], v), v) for k, v in trained.items()}
            return (out, update_norms(out, start)) if return_norms else out

        monkeypatch.setattr(engine_module, "local_sgd", sgd)

    return poison
