"""Local SGD of composed models: each pair trains variables φ its model is built from.

Some continual learners train not θ itself but variables from which θ is composed:
APD's and FedWeIT's θ = B ⊙ σ(m) + A (+ Σ α A_kb) decompose every kernel into a
base, a mask and task-adaptive parts, each with its own regulariser. A
:class:`Composition` says how (``compose``, row-wise: row p of θ depends on row p of
φ only), what it adds to the loss (``penalty``, one value per pair) and, in closed
form, the gradient in φ of a loss whose gradient in θ is given (``gradients``: the
chain rule through ``compose`` plus the penalty's gradient). :func:`composed_sgd` is
the engine's batched mini-batch loop of ``local_sgd`` (same sample orders and
``minibatches``, so each pair follows the trajectory it would follow alone, checked
against autograd through ``compose`` + ``penalty`` per device in
tests/continual/test_fcl_baselines.py): each step composes θ, takes the
architecture's analytic gradient of the batch-mean cross-entropy plus
``l2·Σ‖W‖²`` (``stacked_gradients``; autograd on θ alone for architectures
without one) and steps φ along ``gradients``. No autograd graph over the
composition: on the thesis MLP that was 4–10× FedAvg's step
(``benchmarks/composed_round.py``). ``dropout`` (Stable SGD) masks the hidden
activations with masks drawn from the round's generator.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.adam import StackedAdam
from clusterfed.engine.local_sgd import CHUNK_FLOATS, Batches, epoch_orders, minibatches, padded, pair_order, rows_of
from clusterfed.engine.stacked import StackedParams
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.models import is_regularized


def quadratic(x: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """``[P]`` per-row surrogate whose gradient in ``x`` is ``gradient`` (its value is
    not the term's): how a quadratic term joins a loss that is only differentiated."""
    return (x * gradient.detach()).flatten(1).sum(1)


class Composition(Protocol):
    """How each pair's model is composed from its trained variables."""

    def compose(self, variables: StackedParams) -> StackedParams:
        """θ (the architecture's parameter names, one row per pair) from φ; differentiable."""

    def penalty(self, variables: StackedParams) -> torch.Tensor | None:
        """``[P]`` terms added to each pair's loss (None: nothing); only their gradient
        is used, so quadratic terms may be given as :func:`quadratic` surrogates."""

    def gradients(self, variables: StackedParams, theta_grad: StackedParams) -> StackedParams:
        """∇_φ of the pair's loss given its gradient ∇_θ in θ: the chain rule through
        ``compose`` plus ∇_φ ``penalty``, in closed form (a missing key: zero)."""

    def take(self, rows: slice | torch.Tensor) -> "Composition":
        """The composition of pairs ``rows`` only (per-pair constants selected)."""

    @property
    def shared_floats(self) -> int:
        """Floats every pair's step reads beside its own rows (FedWeIT's knowledge
        base; 0: none). :func:`chunk_pairs` sizes the chunks by it."""


class Identity:
    """θ = φ: plain local SGD (with dropout: Stable SGD's local step)."""

    def compose(self, variables: StackedParams) -> StackedParams:
        return variables

    def penalty(self, variables: StackedParams) -> torch.Tensor | None:
        return None

    def gradients(self, variables: StackedParams, theta_grad: StackedParams) -> StackedParams:
        return theta_grad

    def take(self, rows: slice | torch.Tensor) -> "Identity":
        return self

    shared_floats = 0


def chunk_pairs(per_pair: int, shared_floats: int) -> int:
    """How many pairs train together: ``CHUNK_FLOATS`` of variables, which stay in cache
    across the chunk's steps, but at least as many pairs as the shared operand weighs.
    Every step of every chunk reads that operand whole (FedWeIT: J clients' A, as much
    as J / 2 pairs' variables), so it is read once per step for that many pairs, not
    once per few: 1.6× FedWeIT's round on the authors' A2 (benchmarks/RESULTS.md §12,
    session 40). Larger chunks without a shared operand are slower (APD 1.4×, SSGD 1.2×)."""
    return max(1, CHUNK_FLOATS // per_pair, shared_floats // per_pair)


def dropout_masks(shape: torch.Size, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Inverted-dropout masks: 0 with probability ``rate``, else 1 / (1 − rate)."""
    return (torch.rand(shape, generator=generator) >= rate).to(torch.float32) / (1.0 - rate)


def composed_sgd(
    model: nn.Module,
    variables: StackedParams,
    composition: Composition,
    data: PaddedSplit,
    device_of_pair: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    l2: float,
    batch_size: int,
    generator: torch.Generator,
    dropout: float = 0.0,
    adam: bool = False,
) -> StackedParams:
    """Train every pair's variables for ``epochs`` local epochs; returns new variables
    (one row per pair). Inputs are not modified. ``adam``: the steps are Adam's at
    rate ``lr`` (``StackedAdam``, zero state each call: the APD and FedWeIT authors'
    optimiser) instead of plain SGD; a pair's step count advances only on its steps.

    Sample orders (and dropout masks: one ``[P, B, hidden]`` draw per step) are drawn
    up front in the given pair order, as the per-device reference draws them; pairs
    then train by decreasing sample count (``pair_order``) in chunks of at most
    ``CHUNK_FLOATS`` variables (more with a large shared operand: :func:`chunk_pairs`),
    each chunk through all its epochs: its variables stay in cache across steps and it
    stops when its largest device is done.
    """
    counts = data.counts[device_of_pair]
    n_steps = len(minibatches(counts, batch_size))
    draws = []
    for _ in range(epochs):
        order = epoch_orders(counts, data.x.shape[1], generator)
        masks = None
        if dropout > 0:  # [P, steps, B, hidden]
            shape = (len(counts), batch_size, model.hidden.out_features)
            masks = torch.stack([dropout_masks(shape, dropout, generator) for _ in range(n_steps)], dim=1)
        draws.append((order, None if masks is None else masks.to(counts.device)))
    perm = pair_order(None, counts)
    # one copy, in the caller's pair order: chunks are taken in ``perm`` order and written
    # back (as ``local_sgd`` does), so no permuted copy of all pairs exists beside it
    variables = {k: v.detach().clone() for k, v in variables.items()}
    if perm is not None:
        composition = composition.take(perm)
        device_of_pair = device_of_pair[perm]
        draws = [(o[perm], None if m is None else m[perm]) for o, m in draws]
    gradient_fn = getattr(type(model), "stacked_gradients", None) or _autograd_gradients(model)
    per_pair = sum(v[0].numel() for v in variables.values())
    size = chunk_pairs(per_pair, composition.shared_floats)
    for start in range(0, len(device_of_pair), size):
        rows = slice(start, start + size)
        chunk = rows_of(variables, rows if perm is None else perm[rows])  # views, or a selection written back
        _train_chunk(
            gradient_fn, chunk, composition.take(rows), data, device_of_pair[rows],
            [(o[rows], None if m is None else m[rows]) for o, m in draws], lr=lr, l2=l2, batch_size=batch_size,
            adam=adam,
        )
        if perm is not None:
            for k, v in variables.items():
                v.index_copy_(0, perm[rows], chunk[k])
    return variables


@torch.no_grad()
def _train_chunk(gradient_fn, variables, composition, data, device_of_pair, draws, *, lr, l2, batch_size,
                 adam: bool = False) -> None:
    """The epochs of ``composed_sgd`` for one chunk of pairs, in place on ``variables``.

    As in ``local_sgd``, pairs come by decreasing sample count, so a step composes and
    trains only the first ``batch.rows`` pairs, those with samples left (views; their
    composition is taken once per chunk and prefix length), not the whole chunk with
    the finished ones masked: the same floats, fewer pair-steps on power-law devices."""
    steps = minibatches(data.counts[device_of_pair], batch_size)
    batch_of = Batches(data, device_of_pair)
    n_pairs = len(device_of_pair)
    prefixes = {n_pairs: (variables, composition)}
    if adam:
        buffers = {k: torch.zeros_like(v) for k, v in variables.items()}
        optimiser = StackedAdam(variables, buffers)
    for order, masks in draws:
        order = padded(order, steps)
        for s, batch in enumerate(steps):
            n = batch.rows
            if n not in prefixes:
                prefixes[n] = ({k: v[:n] for k, v in variables.items()}, composition.take(slice(0, n)))
            live, live_composition = prefixes[n]
            theta = live_composition.compose(live)
            grads = gradient_fn(theta, *batch_of(order[:n, batch.cols]), batch.weight[:n], l2=l2,
                                dropout=None if masks is None else masks[:n, s])
            gradients = live_composition.gradients(live, grads)
            if adam:  # a missing key has gradient zero; finished pairs take no step
                for k, buffer in buffers.items():
                    if k in gradients:
                        buffer[:n].copy_(gradients[k])
                    else:
                        buffer[:n].zero_()
                active = range(n_pairs) if batch.everyone else torch.nonzero(batch.active[:n]).flatten().tolist()
                optimiser.step(list(active), lr=lr)
                continue
            for k, g in gradients.items():
                if not batch.everyone:  # finished pairs: no step (their l2 and penalty included)
                    g = g * batch.active[:n].view(-1, *[1] * (g.dim() - 1))
                live[k].sub_(g, alpha=lr)


def _autograd_gradients(model: nn.Module):
    """``stacked_gradients`` by autograd on θ, for architectures without an analytic one."""
    forward = type(model).stacked_forward

    def gradients(theta, x, y, sample_weight, *, l2, dropout=None):
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in theta.items()}
            drop = None if dropout is None else (lambda h: h * dropout)
            logits = forward(leaves, x, shared_input=False, dropout=drop)
            ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
            grads = torch.autograd.grad((ce * sample_weight).sum(), list(leaves.values()))
        return {k: g + 2.0 * l2 * leaves[k].detach() if is_regularized(k) else g for (k, g) in zip(leaves, grads)}

    return gradients
