"""Local SGD of the thesis MLP on mostly-zero inputs, one pair at a time (numba).

The dense step (``MLP._sgd_step``) spends most of its time in two batch-10 GEMMs with
the first layer, x·W1ᵀ and W1's rank-B update dhᵀ·x (``benchmarks/RESULTS.md`` §11).
An MNIST image has 150 non-zero pixels of 784 on average, so both touch a fifth of W1
at most: here W1 is held pixel-major (W1ᵀ, one contiguous row of ``hidden`` floats per
pixel) and a step reads and updates only the rows of the batch's non-zero pixels. The
L2 decay of W1 (``1 − 2·lr·l2`` every step) is kept as one scalar factor s with
W1 = s·V, so a step never touches the other rows; V absorbs s after each epoch.

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
    """The non-zero entries of a split's samples flattened over devices (CSR): sample
    ``i`` of device ``d`` is row ``d * max_n + i``, its entries ``indptr[r]:indptr[r+1]``
    of ``pixel`` / ``value``."""

    indptr: np.ndarray  # [n_devices * max_n + 1] int64
    pixel: np.ndarray  # [nnz] int32
    value: np.ndarray  # [nnz] float32
    max_n: int
    features: int

    @property
    def density(self) -> float:
        """Share of non-zero entries (over padded rows too)."""
        return len(self.value) / max(1, (len(self.indptr) - 1) * self.features)


_ROWS: dict[int, tuple[weakref.ref, SparseRows]] = {}  # id(x) -> (x, its rows), while x lives


def sparse_rows(data: PaddedSplit) -> SparseRows:
    """The CSR form of ``data.x`` (built once per tensor and cached while it lives)."""
    ref, cached = _ROWS.get(id(data.x), (None, None))
    if ref is None or ref() is not data.x:
        flat = data.x.detach().reshape(data.x.shape[0] * data.x.shape[1], -1).cpu().numpy()
        rows, cols = np.nonzero(flat)
        indptr = np.zeros(flat.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=flat.shape[0]), out=indptr[1:])
        cached = SparseRows(indptr, cols.astype(np.int32), flat[rows, cols].astype(np.float32),
                            int(data.x.shape[1]), flat.shape[1])
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
    for p, (d, n) in enumerate(zip(devices, counts)):
        _pair_epochs(w1[p], b1[p], w2[p], b2[p], rows.indptr, rows.pixel, rows.value, y, d * rows.max_n,
                     np.ascontiguousarray(stacked[p, :, :n]), batch_size, np.float32(lr),
                     np.float32(1.0 - 2.0 * lr * l2))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"}, boundscheck=False)
def _pair_epochs(w1, b1, w2, b2, indptr, pixel, value, y, base, orders, batch, lr, decay):  # pragma: no cover
    hidden, features = w1.shape
    n_classes = w2.shape[0]
    v1 = np.ascontiguousarray(w1.T)  # W1 = s·V1, pixel-major
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
                    vr = v1[pixel[q]]
                    for j in range(hidden):
                        hb[j] += v * vr[j]
                for j in range(hidden):
                    z = s * hb[j] + b1[j]
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
                    c = dl[b, k]
                    wk = w2[k]
                    for j in range(hidden):
                        db[j] += c * wk[j]
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
                    c = lr * dl[b, k]
                    b2[k] -= c
                    wk = w2[k]
                    for j in range(hidden):
                        wk[j] -= c * hb[j]
                for j in range(hidden):
                    b1[j] -= lr * db[j]
                row = base + order[start + b]
                for q in range(indptr[row], indptr[row + 1]):
                    c = step * value[q]
                    vr = v1[pixel[q]]
                    for j in range(hidden):
                        vr[j] -= c * db[j]
        if s != 1.0:  # fold s into V once an epoch: s never strays far from 1
            for i in range(features):
                for j in range(hidden):
                    v1[i, j] *= s
            s = np.float32(1.0)
    for i in range(features):
        for j in range(hidden):
            w1[j, i] = v1[i, j]
