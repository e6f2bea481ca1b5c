"""One round of local SGD for many (model, device data) pairs at once.

Pair p trains model ``params[p]`` on device ``device_of_pair[p]``'s training data
with mini-batch SGD. All pairs step together: a step gathers one batch per pair
into ``[P, B, ...]`` and updates every pair in one batched forward/backward.
Devices with fewer samples finish their epoch early and are masked out of the
remaining steps, and partial last batches average over their valid samples only,
so each pair follows the trajectory it would follow alone (the device-by-device
reference in ``tests/engine/test_engine.py``).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.evaluation import activation_floats
from clusterfed.engine.robust import finite_norms, row_squared_norms
from clusterfed.engine.stacked import StackedParams, stacked_forward
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.models import MLP, Pull, is_regularized

CHUNK_FLOATS = 2**20  # parameters of the pairs trained together (4 MiB: several MNIST MLPs)
# Activations of the pairs one autograd step trains together: their leaf-module outputs,
# counted three times (the functional ReLU / pooling outputs kept for the backward, and
# the gradients). Per-FedAvg's full-batch personalisation of 100 FLACC CNNs at once
# took 46 GB on a GPU without it.
AUTOGRAD_BUDGET_BYTES = 2 * 2**30


def epoch_orders(counts: torch.Tensor, max_n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of each pair's samples, ``[P, max_n]``; padding sorts last."""
    keys = torch.rand(len(counts), max_n, generator=generator).to(counts.device)
    keys[torch.arange(max_n, device=counts.device)[None, :] >= counts[:, None]] = 2.0
    return keys.argsort(dim=1)


@dataclass(frozen=True)
class Minibatch:
    """One step of an epoch over a block of pairs: columns ``cols`` of every pair's
    (padded) sample order, per-sample weights ``weight [P, B]`` (the mean over the
    pair's valid samples; 0 once it ran out) and ``active [P]`` (1.0 while the pair has
    samples left); ``everyone``: every pair is active (nothing to mask). ``rows``: the
    active pairs are among the first ``rows`` (pairs by decreasing sample count; at
    least two); ``P`` when they are not a prefix."""

    cols: slice
    weight: torch.Tensor
    active: torch.Tensor
    everyone: bool
    rows: int


def minibatches(counts: torch.Tensor, batch_size: int) -> list[Minibatch]:
    """The steps of one epoch of pairs with ``counts`` samples each: the mini-batch
    schedule ``local_sgd`` and ``composed_sgd`` share. Pairs with fewer samples finish
    early; a partial last batch averages over its valid samples only."""
    n_steps = math.ceil(int(counts.max()) / batch_size)
    n_full = int(counts.min()) // batch_size  # steps in which every pair has a full batch
    positions = torch.arange(batch_size, device=counts.device)
    ones = torch.ones(len(counts), batch_size, device=counts.device)
    full = (ones / ones.sum(1, keepdim=True), ones[:, 0])
    steps = []
    for step in range(n_steps):
        cols = slice(step * batch_size, (step + 1) * batch_size)
        if step < n_full:
            steps.append(Minibatch(cols, *full, True, len(counts)))
            continue
        valid = ((step * batch_size + positions)[None, :] < counts[:, None]).to(torch.float32)
        active = valid.any(1).to(torch.float32)
        n_active = int(active.sum())
        # at least two rows: a bmm of one matrix is one GEMM that threads split, which
        # changes its sums with the thread count (two or more split by matrix)
        prefix = max(n_active, min(2, len(counts))) if bool(active[:n_active].all()) else len(counts)
        steps.append(Minibatch(cols, valid / valid.sum(1, keepdim=True).clamp(min=1), active, bool(active.all()),
                               prefix))
    return steps


def padded(order: torch.Tensor, steps: list[Minibatch]) -> torch.Tensor:
    """A sample order ``[P, max_n]`` padded to the columns ``steps`` read."""
    pad = steps[-1].cols.stop - order.shape[1]
    return F.pad(order, (0, pad)) if pad > 0 else order


def pair_order(model_of_pair: torch.Tensor | None, counts: torch.Tensor) -> torch.Tensor | None:
    """Pairs by model (when given and some model has several pairs, so that its row
    broadcasts over a block: ``_Pull``), then by decreasing sample count; None when
    they already are in that order. Kernels train pairs in this order, in chunks: a
    chunk holds devices of similar size and stops when its largest is done, so one
    pair per model (FedSoft, Ditto) goes by sample count alone: ordered by model, the
    authors' power-law A2 devices took twice the steps."""
    if model_of_pair is not None and len(torch.unique(model_of_pair)) == len(model_of_pair):
        model_of_pair = None
    key = (-counts).tolist() if model_of_pair is None else list(zip(model_of_pair.tolist(), (-counts).tolist()))
    perm = sorted(range(len(key)), key=key.__getitem__)  # stable
    if perm == list(range(len(key))):
        return None
    return torch.as_tensor(perm, dtype=torch.long, device=counts.device)


def rows_of(params: StackedParams, rows: slice | torch.Tensor) -> StackedParams:
    """Rows ``rows`` of each tensor: views for a slice, for an index equal to
    ``arange`` and for tensors expanded along rows (stride 0); else a selection."""
    if isinstance(rows, slice):
        return {k: v[rows] for k, v in params.items()}
    out = {}
    for k, v in params.items():
        if v.stride(0) == 0:
            out[k] = v[0].expand(len(rows), *v.shape[1:])
        elif len(v) == len(rows) and bool((rows == torch.arange(len(v), device=rows.device)).all()):
            out[k] = v
        else:
            out[k] = v.index_select(0, rows)
    return out


def autograd_sgd_step(
    model: nn.Module,
    params: StackedParams,
    x: torch.Tensor,
    y: torch.Tensor,
    sample_weight: torch.Tensor,
    *,
    lr: float,
    l2: float,
    pull: Pull | None = None,
) -> None:
    """In-place SGD step of ``Σ_b w_b·CE_b + l2·Σ‖W‖²`` for any architecture, by autograd.

    Models whose sample weights are all zero (finished devices) are left untouched.
    ``pull`` moves the parameters between the gradients and the update (``_Pull``).
    """
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    logits = stacked_forward(model, leaves, x, shared_input=False)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
    grads = torch.autograd.grad((ce * sample_weight).sum(), list(leaves.values()))
    active = (sample_weight.sum(1) > 0).to(x.dtype)
    decay = 1.0 - 2.0 * lr * l2 * active  # d/dW of l2·‖W‖² is 2·l2·W
    with torch.no_grad():
        if pull is not None:
            pull(params, active > 0, 0)
        for (k, p), g in zip(params.items(), grads):
            if is_regularized(k):
                p.mul_(decay.view(-1, *([1] * (p.dim() - 1))))
            p.add_(g, alpha=-lr)  # in place: no parameter-sized temporaries per step


@dataclass(frozen=True)
class QuadraticPenalty:
    """``½ Σ w ⊙ (θ − c)²`` with one row of w and c per *model* (``local_sgd`` pulls each
    pair to its model's row; rows may be broadcast views, e.g. a scalar μ): FedProx's
    proximal term (w = μ, c = global model) and EWC's (w = λ·F, c = previous task's
    model) are both of this form, and their sum is again one: w = w1 + w2,
    c = (w1·c1 + w2·c2) / w."""

    weight: StackedParams
    center: StackedParams


@dataclass(frozen=True)
class PerFedAvgStep:
    """Per-FedAvg's first-order local step (Fallah et al., NeurIPS 2020, §5, FO):
    θ ← θ − β ∇f(θ − α∇f(θ; D); D′), with D and D′ two independent batches and
    β the engine's learning rate. Each epoch draws a second sample order for D′."""

    alpha: float


@dataclass(frozen=True)
class PFedMeStep:
    """pFedMe's local step (T Dinh et al., NeurIPS 2020, Alg. 1): on each batch,
    K gradient steps of ``personal_lr`` on f(θ̃) + λ/2‖θ̃ − w‖² give the personalised
    θ̃, then the local model moves w ← w − η λ (w − θ̃) (η: the engine's rate)."""

    lam: float
    K: int = 5
    personal_lr: float = 0.01


LocalObjective = PerFedAvgStep | PFedMeStep


def local_sgd(
    model: nn.Module,
    params: StackedParams,
    data: PaddedSplit,
    device_of_pair: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    l2: float,
    batch_size: int,
    generator: torch.Generator,
    penalty: QuadraticPenalty | None = None,
    model_of_pair: torch.Tensor | None = None,
    objective: LocalObjective | None = None,
    workers: int | None = None,
    start_rows: torch.Tensor | None = None,
    return_norms: bool = False,
    buffer: StackedParams | None = None,
    sparse: bool = False,
) -> StackedParams | tuple[StackedParams, torch.Tensor]:
    """Train every pair for ``epochs`` local epochs; returns new stacked parameters
    (and with ``return_norms`` each pair's update norm ‖θ_p − θ_start,p‖, ``[P]``).

    ``params`` has one row per pair, or with ``start_rows`` one row per model and pair p
    starts from row ``start_rows[p]``: each chunk copies its start rows from ``params``,
    so the result is the only pair-sized tensor made (at n = 1000 devices P·|θ| floats).
    ``return_norms``: the norms ``robust.update_norms`` gives (equal bit for bit),
    taken per chunk while its models are in cache instead of in another pass over
    all pairs' rows (the screening's cost at n = 1000, ``benchmarks/RESULTS.md`` §10).
    ``buffer``: tensors of at least P rows the result is written into (it is then
    views of them): a caller that trains every round reuses one, since writing P·|θ|
    floats into fresh memory cost 6x writing them into memory already mapped
    (page faults, §10).
    The loss of a pair is the batch-mean cross-entropy plus ``l2 * Σ‖W‖²`` over its
    kernels (Keras' L2 regulariser, thesis B.3). The architecture's analytic
    ``stacked_sgd_step`` is used when it has one, else ``autograd_sgd_step``.
    ``penalty`` has one row per *model*: pair p is pulled by row ``model_of_pair[p]``
    (row p when ``model_of_pair`` is None); see ``_Pull``.
    ``objective`` replaces the plain SGD step by Per-FedAvg's or pFedMe's.
    ``sparse``: SGD steps of the MLP on CPU, plain or with a pull of one weight per
    (model, tensor), go through ``sparse_mlp`` (only the first layer's rows at the
    inputs that differ from their feature's mode; equal up to float rounding); other
    steps ignore it.
    Inputs are not modified.

    Pairs are independent, so with an analytic step (the MLP: small-batch steps bound
    by streaming the weights) they train in chunks of at most ``CHUNK_FLOATS``
    parameters, each chunk through all its epochs before the next: a chunk's models
    stay in cache across steps (with all 100 MNIST MLPs at once, each step streamed
    40 MB of weights). Autograd steps (the CNN: compute-bound convolutions, fastest as
    one grouped convolution over all pairs, ``benchmarks/cnn_step.py``) take as many
    pairs at once as ``AUTOGRAD_BUDGET_BYTES`` of activations allow: all of them at
    usual batch sizes, fewer for full-batch steps. On a GPU analytic steps also take
    every pair at once: there chunks only multiply each step's kernel launches. Pairs are ordered as ``pair_order``
    says (by model where a model has several pairs, then by decreasing sample count),
    so a chunk holds devices of similar size and stops when its largest is done.
    Sample orders are drawn in the caller's pair order, so neither the order nor the
    chunking changes any pair's trajectory.

    ``workers`` (default: torch's intra-op thread count) trains that many chunks at
    once, each in its own Python thread with its share of the intra-op threads (one on
    two cores): a batch-10 step is too small for two threads to split one GEMM (one
    thread was faster than two, ``benchmarks/RESULTS.md`` §11), while chunks are
    independent (disjoint rows, no random draws), so every pair's result is the same
    bit for bit as chunk after chunk on one thread. Autograd chunks run one after
    another with every intra-op thread (two at once would hold twice the activation
    budget); on a GPU every chunk does.
    """
    if penalty is not None and objective is not None:
        raise ValueError(f"local_sgd: a penalty with the local objective {type(objective).__name__} is not supported")
    counts_given = data.counts[device_of_pair]
    orders = []  # every epoch's sample orders, drawn up front in the given pair order
    for _ in range(epochs):
        first = epoch_orders(counts_given, data.x.shape[1], generator)
        second = epoch_orders(counts_given, data.x.shape[1], generator) if isinstance(objective, PerFedAvgStep) else None
        orders.append((first, second))
    if model_of_pair is None:
        model_of_pair = torch.arange(len(device_of_pair), device=device_of_pair.device)
    model_of_pair = torch.as_tensor(model_of_pair, dtype=torch.long, device=device_of_pair.device)
    perm = pair_order(model_of_pair if penalty is not None else None, counts_given)
    source = {k: v.detach() for k, v in params.items()}
    n_pairs = len(device_of_pair)
    if perm is not None:
        device_of_pair, model_of_pair = device_of_pair[perm], model_of_pair[perm]
        orders = [(o[perm], None if s is None else s[perm]) for o, s in orders]
    step_fn = getattr(type(model), "stacked_sgd_step", None)
    analytic = step_fn is not None
    sparse_kernel = rows_csr = None
    if sparse and isinstance(model, MLP) and objective is None and data.x.device.type == "cpu":
        from clusterfed.engine import sparse_mlp as sparse_kernel  # numba, imported when first asked for

        if penalty is None or sparse_kernel.uniform_weights(penalty.weight):
            rows_csr = sparse_kernel.sparse_rows(data)
    if step_fn is None:
        def step_fn(p, xb, yb, w, *, lr, l2, pull: Pull | None = None):
            autograd_sgd_step(model, p, xb, yb, w, lr=lr, l2=l2, pull=pull)

    per_pair = sum(v[0].numel() for v in source.values())
    if analytic and data.x.device.type == "cpu":
        size = max(1, CHUNK_FLOATS // per_pair)
    elif analytic:  # a GPU: no cache to fit, and each step's kernel launches are the cost
        size = n_pairs
    else:
        per_pair_bytes = 3 * 4 * batch_size * activation_floats(model, tuple(data.x.shape[2:]))
        size = max(1, min(n_pairs, AUTOGRAD_BUDGET_BYTES // per_pair_bytes))
    if buffer is None:
        out = {k: v.new_empty((n_pairs, *v.shape[1:])) for k, v in source.items()}
    else:
        out = {k: buffer[k][:n_pairs] for k in source}
    norms_sq = torch.zeros(n_pairs, dtype=torch.float64, device=device_of_pair.device) if return_norms else None

    def train(start: int) -> None:
        rows = slice(start, start + size)
        pairs = rows if perm is None else perm[rows]  # the caller's indices of the chunk's pairs
        src = pairs if start_rows is None else start_rows[pairs]
        if perm is None:  # the chunk is its rows of the result, trained in place
            chunk = {k: v[rows] for k, v in out.items()}
            for k, v in chunk.items():
                if isinstance(src, slice):
                    v.copy_(source[k][src])
                else:
                    torch.index_select(source[k], 0, src, out=v)
        else:  # a selection, written back below
            chunk = {k: v[src].clone() if isinstance(src, slice) else v.index_select(0, src) for k, v in source.items()}
        if rows_csr is not None:
            sparse_kernel.train_pairs(chunk, rows_csr, data, device_of_pair[rows], [o[rows] for o, _ in orders],
                                      lr=lr, l2=l2, batch_size=batch_size, penalty=penalty,
                                      model_of_pair=model_of_pair[rows])
        else:
            _train_chunk(
                step_fn, chunk, data, device_of_pair[rows], [(o[rows], None if s is None else s[rows]) for o, s in orders],
                pull=None if penalty is None else _Pull(penalty, model_of_pair[rows], lr=lr, l2=l2),
                objective=objective, lr=lr, l2=l2, batch_size=batch_size,
            )
        if norms_sq is not None:  # tensor by tensor in dict order, as ``update_norms`` adds them
            sq = None
            for k, v in chunk.items():
                part = row_squared_norms(v - (source[k][src] if isinstance(src, slice) else source[k].index_select(0, src)))
                sq = part if sq is None else sq + part
            norms_sq[pairs] = sq
        if perm is not None:
            for k, v in out.items():
                v.index_copy_(0, pairs, chunk[k])

    starts = range(0, n_pairs, size)
    threads = torch.get_num_threads()
    workers = min(threads if workers is None else workers, len(starts))
    if data.x.device.type != "cpu" or not analytic:  # one GPU stream gains nothing from threads
        workers = 1
    if workers <= 1:
        for start in starts:
            train(start)
    else:
        _in_threads(train, starts, workers, max(1, threads // workers))
    return out if norms_sq is None else (out, finite_norms(norms_sq))


def _in_threads(fn, items, workers: int, intra_op: int) -> None:
    """``fn`` over ``items`` on ``workers`` Python threads (torch releases the GIL inside
    its ops), each with ``intra_op`` intra-op threads; the caller's count is restored
    (``torch.set_num_threads`` also sets MKL's process-wide count)."""
    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(intra_op,)) as pool:
            list(pool.map(fn, items))  # re-raises a worker's exception
    finally:
        torch.set_num_threads(before)


def _train_chunk(step_fn, params, data, device_of_pair, orders, *, pull, objective, lr, l2, batch_size) -> None:
    """The epochs of ``local_sgd`` for one chunk of pairs, in place on ``params``.

    Pairs come by decreasing sample count, so once some have run out of samples the
    ones still training are the first ``batch.rows``: a step takes only those rows
    (views), not the whole chunk with the finished ones masked (with the authors'
    power-law devices, 1.4-1.6x the pair-steps)."""
    steps = minibatches(data.counts[device_of_pair], batch_size)
    batch_of = Batches(data, device_of_pair)
    n_pairs = len(device_of_pair)
    for order, second in orders:
        order = padded(order, steps)
        second = None if second is None else padded(second, steps)
        for batch in steps:
            n = batch.rows
            live = params if n == n_pairs else {k: v[:n] for k, v in params.items()}
            weight, active = batch.weight[:n], batch.active[:n]
            idx = order[:n, batch.cols]
            xb, yb = batch_of(idx)
            if objective is None:
                step_fn(live, xb, yb, weight, lr=lr, l2=l2, pull=pull)
            elif isinstance(objective, PerFedAvgStep):
                inner = _clone(live)
                step_fn(inner, xb, yb, weight, lr=objective.alpha, l2=l2)  # θ − α∇f(θ; D)
                before = _clone(inner)
                idx2 = second[:n, batch.cols]
                step_fn(inner, *batch_of(idx2), weight, lr=lr, l2=l2)
                for k in live:  # θ − β∇f(θ − α∇f(θ; D); D′), first order
                    live[k].add_(inner[k] - before[k])
            else:
                _pfedme_step(step_fn, live, xb, yb, weight, active, objective, lr=lr, l2=l2)


class Batches:
    """``data.x[device_of_pair[:, None], idx]`` and the same of ``data.y``: one batch per
    pair. Taken with ``index_select`` on the samples flattened over devices (a view),
    which gathered the rows of a 10 × 10 MNIST batch 2.7× faster than that advanced
    indexing (``benchmarks/RESULTS.md`` §11, item 6); same values."""

    def __init__(self, data: PaddedSplit, device_of_pair: torch.Tensor):
        self.data = data
        self.flat = data.x.is_contiguous() and data.y.is_contiguous()
        if self.flat:
            self.x, self.y = data.x.flatten(0, 1), data.y.flatten(0, 1)
            self.base = device_of_pair[:, None] * data.x.shape[1]
        self.rows = device_of_pair[:, None]

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batches of the first ``len(idx)`` pairs."""
        n = len(idx)
        if not self.flat:
            return self.data.x[self.rows[:n], idx], self.data.y[self.rows[:n], idx]
        flat = (self.base[:n] + idx).view(-1)
        return (self.x.index_select(0, flat).view(*idx.shape, *self.x.shape[1:]),
                self.y.index_select(0, flat).view(idx.shape))


class _Pull:
    """A ``QuadraticPenalty``'s pull for one chunk of pairs, taken inside the SGD step:
    after the step's gradients and before its update, each pulled θ_p becomes
    lerp(θ_p, c, r) = (1 − r)·θ_p + r·c with r = lr·w / decay (r = lr·w on tensors
    without L2 decay). The step's update then gives
    decay·θ − lr·w ⊙ (θ − c) − lr·∇f: the penalty's gradient step at the pre-step θ
    (FedProx μ, StoCFL λ, EWC λF, FedSoft, Ditto), up to float rounding. One pass over
    the pulled θ; taking w ⊙ (θ − c) into a buffer and subtracting it after the step
    took three (a pull cost 0.61x a plain round on the authors' A2, §11 of
    ``benchmarks/RESULTS.md``).

    Pairs of a model lie next to each other (``pair_order``), so a model's rows of c
    and r broadcast over its block of pairs: no per-pair copy. Where every model has
    one pair, the block is the whole chunk with its pairs' rows taken once (a
    selection; none when they are already in pair order). Weights that are
    broadcast views (a scalar μ) stay one value; blocks whose weight is zero (StoCFL's
    ω) are skipped. A step pulls only the pairs it trains (its first
    ``Minibatch.rows``) and, among them, only the active ones."""

    def __init__(self, penalty: QuadraticPenalty, model_of_pair: torch.Tensor, *, lr: float, l2: float):
        decay = 1.0 - 2.0 * lr * l2
        rate = {k: lr / decay if is_regularized(k) else lr for k in penalty.weight}
        weight = {k: _compact(v) for k, v in penalty.weight.items()}
        models, sizes = torch.unique_consecutive(model_of_pair, return_counts=True)
        # (first pair, end, c, r, rows per pair): c and r one row per pair, or one broadcast row
        self.blocks: list[tuple[int, int, StackedParams, StackedParams, bool]] = []
        if int(sizes.max()) == 1:
            self.blocks.append((0, len(model_of_pair), rows_of(penalty.center, model_of_pair),
                                {k: _model_rows(w, model_of_pair) * rate[k] for k, w in weight.items()}, True))
            return
        start = 0
        for m, size in zip(models.tolist(), sizes.tolist()):
            w = {k: v[m if len(v) > 1 else 0][None] for k, v in weight.items()}
            if any(bool(v.any()) for v in w.values()):
                self.blocks.append((start, start + size, {k: v[m][None] for k, v in penalty.center.items()},
                                    {k: v * rate[k] for k, v in w.items()}, False))
            start += size

    def __call__(self, params: StackedParams, active: torch.Tensor, offset: int) -> None:
        """Pull the active ones of pairs ``offset … offset + len(active)``, whose
        parameters (views) are ``params`` (a ``models.Pull``)."""
        n = len(active)
        everyone = bool(active.all())
        for start, stop, c, r, per_pair in self.blocks:
            s, e = max(start, offset), min(stop, offset + n)
            if s >= e:
                continue
            here = slice(s - offset, e - offset)
            if per_pair:
                c = {k: v[s - start : e - start] for k, v in c.items()}
                r = {k: v[s - start : e - start] for k, v in r.items()}
            if not everyone:
                mask = active[here]
                r = {k: v * _rows(mask, v).to(v.dtype) for k, v in r.items()}
            for k, theta in params.items():
                theta[here].lerp_(c[k], r[k])


def _compact(v: torch.Tensor) -> torch.Tensor:
    """``v`` with every broadcast dimension (stride 0) cut to length 1: a scalar μ
    expanded to a model's shape stays one value when multiplied."""
    for d in range(v.dim()):
        if v.stride(d) == 0 and v.shape[d] > 1:
            v = v.narrow(d, 0, 1)
    return v


def _model_rows(v: torch.Tensor, models: torch.Tensor) -> torch.Tensor:
    """Rows ``models`` of ``v``, or ``v`` itself where it is one broadcast row."""
    return v if len(v) == 1 else rows_of({"v": v}, models)["v"]


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *[1] * (like.dim() - 1))


def _clone(params: StackedParams) -> StackedParams:
    return {k: v.clone() for k, v in params.items()}


def _pfedme_step(step_fn, w, xb, yb, weight, active, objective: PFedMeStep, *, lr: float, l2: float) -> None:
    """pFedMe Alg. 1 inner loop on one batch, in place on the local models ``w``."""
    theta = _clone(w)
    for _ in range(objective.K):
        pulls = {k: objective.lam * (theta[k] - w[k]) * _rows(active, v) for k, v in theta.items()}
        step_fn(theta, xb, yb, weight, lr=objective.personal_lr, l2=l2)
        for k, pull in pulls.items():
            theta[k].sub_(pull, alpha=objective.personal_lr)
    for k, v in w.items():
        v.sub_(objective.lam * (v - theta[k]) * _rows(active, v), alpha=lr)


def squared_gradients(
    model: nn.Module,
    params: StackedParams,
    data: PaddedSplit,
    device_of_pair: torch.Tensor,
    *,
    batch_size: int,
) -> StackedParams:
    """Mean squared mini-batch gradient of the loss per pair: the diagonal empirical
    Fisher information that EWC weighs parameters with."""
    counts = data.counts[device_of_pair]
    n_steps = math.ceil(int(counts.max()) / batch_size)
    positions = torch.arange(batch_size, device=counts.device)
    rows = device_of_pair[:, None]
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    steps = torch.zeros(len(device_of_pair), device=counts.device)
    for step in range(n_steps):
        at = step * batch_size + positions
        valid = (at[None, :] < counts[:, None]).to(torch.float32)
        idx = at.clamp(max=data.x.shape[1] - 1).expand(len(device_of_pair), -1)
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        logits = stacked_forward(model, leaves, data.x[rows, idx], shared_input=False)
        yb = data.y[rows, idx]
        ce = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view_as(yb)
        batch_mean = (ce * valid).sum(1) / valid.sum(1).clamp(min=1)
        grads = torch.autograd.grad(batch_mean.sum(), list(leaves.values()))
        for k, g in zip(leaves, grads):
            total[k] += g.pow(2)
        steps += valid.any(1)
    return {k: v / steps.clamp(min=1).view(-1, *[1] * (v.dim() - 1)) for k, v in total.items()}
