"""A federation's data as device tensors laid out for batched training and evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from clusterfed.scenarios import Federation


@dataclass(frozen=True)
class PaddedSplit:
    """Per-device samples padded to a common length: ``x[d, i]`` is valid for i < counts[d].

    ``virtual``: the rows are not devices of the federation but pooled groups
    (``pooled``), so an upload trained on row r is nobody's (its uploader id is
    ``n_devices + r``, counted as an upload and against no device)."""

    x: torch.Tensor  # [n_devices, max_n, *input_shape]
    y: torch.Tensor  # [n_devices, max_n]
    counts: torch.Tensor  # [n_devices] int64
    virtual: bool = False

    @property
    def mask(self) -> torch.Tensor:
        """``[n_devices, max_n]`` bool, True on real samples."""
        positions = torch.arange(self.y.shape[1], device=self.y.device)
        return positions[None, :] < self.counts[:, None]


@dataclass(frozen=True)
class FederationTensors:
    """Every device's train / validation / test split, padded, on one torch device."""

    train: PaddedSplit
    val: PaddedSplit
    test: PaddedSplit

    @property
    def n_devices(self) -> int:
        return int(self.train.counts.shape[0])

    def split(self, name: str) -> PaddedSplit:
        if name not in ("train", "val", "test"):
            raise ValueError(f"unknown split {name!r}; expected 'train', 'val' or 'test'")
        return getattr(self, name)

    @classmethod
    def from_federation(cls, fed: Federation, device: torch.device) -> "FederationTensors":
        return cls(**{s: _padded(fed, s, device) for s in ("train", "val", "test")})


def _padded(fed: Federation, split: str, device: torch.device) -> PaddedSplit:
    xs = [getattr(dev, f"x_{split}") for dev in fed.devices]
    ys = [getattr(dev, f"y_{split}") for dev in fed.devices]
    counts = [len(y) for y in ys]
    x = np.zeros((fed.n_devices, max(counts), *fed.input_shape), dtype=np.float32)
    y = np.zeros((fed.n_devices, max(counts)), dtype=np.int64)
    for d, (xd, yd) in enumerate(zip(xs, ys)):
        x[d, : len(yd)] = xd
        y[d, : len(yd)] = yd
    return PaddedSplit(
        x=torch.as_tensor(x, device=device),
        y=torch.as_tensor(y, device=device),
        counts=torch.as_tensor(counts, device=device),
    )


def pooled(split: PaddedSplit, pools: Sequence[np.ndarray]) -> PaddedSplit:
    """One virtual device per pool of devices holding all their samples (the oracle
    ``centralized`` baseline trains on these; pools may overlap)."""
    mask = split.mask
    xs, ys = [], []
    for pool in pools:
        members = torch.as_tensor(np.asarray(pool, dtype=np.int64), device=split.y.device)
        keep = mask[members]
        xs.append(split.x[members][keep])
        ys.append(split.y[members][keep])
    counts = [len(y) for y in ys]
    x = split.x.new_zeros((len(xs), max(counts), *split.x.shape[2:]))
    y = split.y.new_zeros((len(ys), max(counts)))
    for g, (xg, yg) in enumerate(zip(xs, ys)):
        x[g, : len(yg)] = xg
        y[g, : len(yg)] = yg
    return PaddedSplit(x=x, y=y, counts=torch.as_tensor(counts, device=split.y.device), virtual=True)
