"""Local SGD of the thesis MLP on inputs that are mostly one value per feature (numba).

The dense step (``MLP._sgd_step``) spends most of its time in two batch-10 GEMMs with
the first layer, x·W1ᵀ and W1's rank-B update dhᵀ·x (``benchmarks/RESULTS.md`` §11).
An MNIST image differs from its pixels' most common value (0, or −μ/σ once
standardised) in 150 of 784 pixels on average. Write x = z + m with m the per-feature
mode and z sparse. Then, exactly,

    dhᵀ·x = dhᵀ·z + (Σ_b dh_b)·mᵀ      and, with W1 = s·(V + a·mᵀ),
    x·W1ᵀ = s·(z·Vᵀ + c + (z·m + m·m)·a),   c = V·m,

so a step reads and updates only the rows of V at the batch's non-zero z (V held
pixel-major: one contiguous row of ``hidden`` floats per feature), plus the vectors a
and c. The L2 decay (``1 − 2·lr·l2`` every step) is the scalar s. After each epoch
s and a are folded back into V and c is recomputed, so neither drifts.

Each pair runs all its epochs in one compiled call that releases the GIL, so
``local_sgd``'s worker threads train pairs in parallel. Same steps as the dense
kernel (same sample orders, partial last batches averaged over their samples, decay
on the pair's own steps): equal to it up to float rounding (tests/engine).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numba
import numpy as np
import torch

from clusterfed.engine.tensors import PaddedSplit


@dataclass(frozen=True)
class SparseRows:
    """A split's samples flattened over devices as x = z + m: ``mode`` m (one value per
    feature, the most common among the real samples) and z in CSR. Sample ``i`` of
    device ``d`` is row ``d * max_n + i``; its entries are ``indptr[r]:indptr[r+1]`` of
    ``feature`` / ``value``, and ``zm[r]`` = z_r·m. Padding rows are empty."""

    indptr: np.ndarray  # [n_devices * max_n + 1] int64
    feature: np.ndarray  # [nnz] int32
    value: np.ndarray  # [nnz] float32
    zm: np.ndarray  # [n_devices * max_n] float32
    mode: np.ndarray  # [features] float32
    max_n: int
    samples: int  # real rows

    @property
    def density(self) -> float:
        """Share of the real samples' features that differ from the mode."""
        return len(self.value) / max(1, self.samples * len(self.mode))


_ROWS: dict[int, tuple[weakref.ref, SparseRows]] = {}  # id(x) -> (x, its rows), while x lives


def sparse_rows(data: PaddedSplit) -> SparseRows:
    """The split as x = z + m (built once per tensor and cached while it lives)."""
    ref, cached = _ROWS.get(id(data.x), (None, None))
    if ref is None or ref() is not data.x:
        flat = data.x.detach().reshape(data.x.shape[0] * data.x.shape[1], -1).cpu()
        real = data.mask.reshape(-1).cpu()
        mode = flat[real].mode(0).values if bool(real.any()) else flat.new_zeros(flat.shape[1])
        z = (flat - mode).mul_(real[:, None]).numpy()  # padding rows: no entries
        rows, cols = np.nonzero(z)
        indptr = np.zeros(z.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=z.shape[0]), out=indptr[1:])
        m = mode.numpy().astype(np.float32)
        cached = SparseRows(indptr, cols.astype(np.int32), z[rows, cols].astype(np.float32),
                            (z @ m).astype(np.float32), m, int(data.x.shape[1]), int(real.sum()))
        key = id(data.x)
        _ROWS[key] = (weakref.ref(data.x, lambda _: _ROWS.pop(key, None)), cached)
    return cached


def train_pairs(params: dict[str, torch.Tensor], rows: SparseRows, data: PaddedSplit, device_of_pair: torch.Tensor,
                orders: list[torch.Tensor], *, lr: float, l2: float, batch_size: int) -> None:
    """Every epoch of ``orders`` (``[P, max_n]`` sample orders, padding last) for each
    pair, in place on ``params`` (the MLP's four tensors, one row per pair)."""
    w1, b1, w2, b2 = (params[k].numpy() for k in ("hidden.weight", "hidden.bias", "output.weight", "output.bias"))
    y = data.y.reshape(-1).numpy()
    counts = data.counts[device_of_pair].tolist()
    devices = device_of_pair.tolist()
    stacked = torch.stack(orders, 1).numpy()  # [P, epochs, max_n]
    mm = np.float32(np.dot(rows.mode.astype(np.float64), rows.mode))
    for p, (d, n) in enumerate(zip(devices, counts)):
        _pair_epochs(w1[p], b1[p], w2[p], b2[p], rows.indptr, rows.feature, rows.value, rows.zm, rows.mode, mm,
                     y, d * rows.max_n, np.ascontiguousarray(stacked[p, :, :n]), batch_size, np.float32(lr),
                     np.float32(1.0 - 2.0 * lr * l2))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"}, boundscheck=False)
def _pair_epochs(w1, b1, w2, b2, indptr, feature, value, zm, m, mm, y, base, orders, batch, lr, decay):  # pragma: no cover
    hidden, features = w1.shape
    n_classes = w2.shape[0]
    v1 = np.ascontiguousarray(w1.T)  # W1 = s·(V + a·mᵀ), V pixel-major
    a = np.zeros(hidden, np.float32)
    c = np.zeros(hidden, np.float32)  # V·m
    for i in range(features):
        if m[i] != 0:
            for j in range(hidden):
                c[j] += v1[i, j] * m[i]
    s = np.float32(1.0)
    h = np.empty((batch, hidden), np.float32)
    dh = np.empty((batch, hidden), np.float32)
    dl = np.empty((batch, n_classes), np.float32)
    for e in range(orders.shape[0]):
        order = orders[e]
        n = order.shape[0]
        for start in range(0, n, batch):
            nb = min(batch, n - start)
            weight = np.float32(1.0) / np.float32(nb)
            for b in range(nb):
                row = base + order[start + b]
                hb = h[b]
                hb[:] = 0.0
                for q in range(indptr[row], indptr[row + 1]):
                    v = value[q]
                    vr = v1[feature[q]]
                    for j in range(hidden):
                        hb[j] += v * vr[j]
                offset = zm[row] + mm
                for j in range(hidden):
                    z = s * (hb[j] + c[j] + offset * a[j]) + b1[j]
                    hb[j] = z if z > 0 else np.float32(0.0)
                top = np.float32(-np.inf)
                for k in range(n_classes):
                    acc = b2[k]
                    wk = w2[k]
                    for j in range(hidden):
                        acc += hb[j] * wk[j]
                    dl[b, k] = acc
                    top = max(top, acc)
                total = np.float32(0.0)
                for k in range(n_classes):
                    dl[b, k] = np.exp(dl[b, k] - top)
                    total += dl[b, k]
                for k in range(n_classes):
                    dl[b, k] = dl[b, k] / total * weight
                dl[b, y[row]] -= weight
                db = dh[b]
                db[:] = 0.0
                for k in range(n_classes):
                    g = dl[b, k]
                    wk = w2[k]
                    for j in range(hidden):
                        db[j] += g * wk[j]
                for j in range(hidden):
                    if hb[j] <= 0:
                        db[j] = 0.0
            # the step: W ← decay·W − lr·∇, biases without decay
            s *= decay
            step = lr / s
            for k in range(n_classes):
                wk = w2[k]
                for j in range(hidden):
                    wk[j] *= decay
            for b in range(nb):
                hb = h[b]
                db = dh[b]
                for k in range(n_classes):
                    g = lr * dl[b, k]
                    b2[k] -= g
                    wk = w2[k]
                    for j in range(hidden):
                        wk[j] -= g * hb[j]
                row = base + order[start + b]
                gm = step * zm[row]
                for j in range(hidden):
                    b1[j] -= lr * db[j]
                    a[j] -= step * db[j]
                    c[j] -= gm * db[j]
                for q in range(indptr[row], indptr[row + 1]):
                    g = step * value[q]
                    vr = v1[feature[q]]
                    for j in range(hidden):
                        vr[j] -= g * db[j]
        # fold s and a into V and recompute c = V·m: neither drifts over many epochs
        c[:] = 0.0
        for i in range(features):
            vr = v1[i]
            mi = m[i]
            for j in range(hidden):
                vr[j] = s * (vr[j] + a[j] * mi)
            if mi != 0:
                for j in range(hidden):
                    c[j] += vr[j] * mi
        a[:] = 0.0
        s = np.float32(1.0)
    for i in range(features):
        for j in range(hidden):
            w1[j, i] = v1[i, j]
