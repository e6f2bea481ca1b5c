"""Shared fixtures: real data only (scikit-learn digits; MNIST when ../shared is present)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterfed.data import load_dataset

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
