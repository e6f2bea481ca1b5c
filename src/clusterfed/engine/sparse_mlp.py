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
and c. The L2 decay (``1 − 2·lr·l2`` every step) is the scalar s. A proximal pull
μ/2·‖θ − θ_c‖² with one μ per tensor (FedProx, Ditto, StoCFL's λ) moves W1 by
(decay − lr·μ)·W1 + lr·μ·C each step: W1 = s·(V + a·mᵀ) + t·C with a scalar t, and
x·Cᵀ = z·Cᵀ + m·Cᵀ is another gather. After each epoch s, a and t are folded back
into V and c is recomputed, so nothing drifts.

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


def uniform_weights(weight: dict[str, torch.Tensor]) -> bool:
    """Whether a penalty's weight is one value per (model, tensor): the pull the kernel takes."""
    return all(bool((w.flatten(1).amin(1) == w.flatten(1).amax(1)).all()) for w in weight.values())


def train_pairs(params: dict[str, torch.Tensor], rows: SparseRows, data: PaddedSplit, device_of_pair: torch.Tensor,
                orders: list[torch.Tensor], *, lr: float, l2: float, batch_size: int,
                penalty=None, model_of_pair: torch.Tensor | None = None) -> None:
    """Every epoch of ``orders`` (``[P, max_n]`` sample orders, padding last) for each
    pair, in place on ``params`` (the MLP's four tensors, one row per pair).
    ``penalty`` (a ``QuadraticPenalty`` with ``uniform_weights``): pair p is pulled to
    row ``model_of_pair[p]`` of its centre with that row's weight."""
    keys = ("hidden.weight", "hidden.bias", "output.weight", "output.bias")
    w1, b1, w2, b2 = (params[k].numpy() for k in keys)
    y = data.y.reshape(-1).numpy()
    counts = data.counts[device_of_pair].tolist()
    devices = device_of_pair.tolist()
    stacked = torch.stack(orders, 1).numpy()  # [P, epochs, max_n]
    mm = np.float32(np.dot(rows.mode.astype(np.float64), rows.mode))
    no_pull = np.zeros(4, np.float32)
    unread_ct = np.zeros((1, w1.shape[1]), np.float32)  # stands for the centre's W1ᵀ when nothing pulls
    pixel_major: dict[int, np.ndarray] = {}  # the centre's W1ᵀ, once per model, not per pair
    for p, (d, n) in enumerate(zip(devices, counts)):
        if penalty is None:  # weight 0: the centre is never read
            mu, centre = no_pull, (unread_ct, b1[p], w2[p], b2[p])
        else:
            m = int(model_of_pair[p])
            mu = np.array([float(penalty.weight[k][m].reshape(-1)[0]) for k in keys], np.float32)
            if m not in pixel_major:
                pixel_major[m] = np.ascontiguousarray(penalty.center[keys[0]][m].detach().numpy().T)
            centre = (pixel_major[m],) + tuple(np.ascontiguousarray(penalty.center[k][m].detach().numpy())
                                               for k in keys[1:])
        _pair_epochs(w1[p], b1[p], w2[p], b2[p], *centre, mu, rows.indptr, rows.feature, rows.value, rows.zm,
                     rows.mode, mm, y, d * rows.max_n, np.ascontiguousarray(stacked[p, :, :n]), batch_size,
                     np.float32(lr), np.float32(1.0 - 2.0 * lr * l2))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"}, boundscheck=False)
def _pair_epochs(w1, b1, w2, b2, ct, cb1, cw2, cb2, mu, indptr, feature, value, zm, m, mm, y, base, orders,
                 batch, lr, decay):  # pragma: no cover
    hidden, features = w1.shape
    n_classes = w2.shape[0]
    pulled = mu[0] != 0
    v1 = np.ascontiguousarray(w1.T)  # W1 = s·(V + a·mᵀ) + t·C, V and C (= ct) pixel-major
    a = np.zeros(hidden, np.float32)
    c = np.zeros(hidden, np.float32)  # V·m
    cc = np.zeros(hidden, np.float32)  # C·m
    for i in range(features):
        if m[i] != 0:
            for j in range(hidden):
                c[j] += v1[i, j] * m[i]
            if pulled:
                for j in range(hidden):
                    cc[j] += ct[i, j] * m[i]
    s = np.float32(1.0)
    t = np.float32(0.0)
    h = np.empty((batch, hidden), np.float32)
    hc = np.empty(hidden, np.float32)
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
                    hb[j] = s * (hb[j] + c[j] + offset * a[j]) + b1[j]
                if t != 0:
                    hc[:] = cc
                    for q in range(indptr[row], indptr[row + 1]):
                        v = value[q]
                        cr = ct[feature[q]]
                        for j in range(hidden):
                            hc[j] += v * cr[j]
                    for j in range(hidden):
                        hb[j] += t * hc[j]
                for j in range(hidden):
                    if hb[j] < 0:
                        hb[j] = 0.0
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
            # the step: θ ← decay·θ − lr·∇ − lr·μ·(θ − θ_c), decay on the kernels only,
            # the pull taken at the pre-step θ
            keep = decay - lr * mu[0]
            s *= keep
            t = keep * t + lr * mu[0]
            step = lr / s
            keep2 = decay - lr * mu[2]
            for k in range(n_classes):
                wk = w2[k]
                ck = cw2[k]
                for j in range(hidden):
                    wk[j] = keep2 * wk[j] + lr * mu[2] * ck[j]
            if mu[1] != 0:
                for j in range(hidden):
                    b1[j] -= lr * mu[1] * (b1[j] - cb1[j])
            if mu[3] != 0:
                for k in range(n_classes):
                    b2[k] -= lr * mu[3] * (b2[k] - cb2[k])
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
        # fold s, a and t into V and recompute c = V·m: nothing drifts over many epochs
        c[:] = 0.0
        for i in range(features):
            vr = v1[i]
            mi = m[i]
            for j in range(hidden):
                vr[j] = s * (vr[j] + a[j] * mi)
            if t != 0:
                cr = ct[i]
                for j in range(hidden):
                    vr[j] += t * cr[j]
            if mi != 0:
                for j in range(hidden):
                    c[j] += vr[j] * mi
        a[:] = 0.0
        s = np.float32(1.0)
        t = np.float32(0.0)
    for i in range(features):
        for j in range(hidden):
            w1[j, i] = v1[i, j]
