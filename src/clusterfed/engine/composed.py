"""Local SGD of composed models: each pair trains variables φ its model is built from.

Some continual learners train not θ itself but variables from which θ is composed:
APD's and FedWeIT's θ = B ⊙ σ(m) + A (+ Σ α A_kb) decompose every kernel into a
base, a mask and task-adaptive parts, each with its own regulariser. A
:class:`Composition` says how (``compose``, differentiable and row-wise: row p of
θ depends on row p of φ only) and what it adds to the loss (``penalty``, one value
per pair). :func:`composed_sgd` is the engine's batched mini-batch loop of
``local_sgd`` (same sample orders, same masking of finished devices, so each pair
follows the trajectory it would follow alone) with autograd through ``compose``:
the loss of pair p is its batch-mean cross-entropy of θ_p, plus ``l2·Σ‖W‖²`` over
θ_p's kernels, plus ``penalty(φ)_p``. ``dropout`` (Stable SGD) masks the hidden
activations with masks drawn from the round's generator.

Quadratic terms enter the backward pass as ⟨x, ∇⟩ with ∇ their (detached) gradient
(:func:`quadratic`): the same gradient as autograd through a square, at a quarter
of its cost (pow's backward dominated the step on the thesis MLP).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.local_sgd import epoch_orders
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


class Identity:
    """θ = φ: plain local SGD (with dropout: Stable SGD's local step)."""

    def compose(self, variables: StackedParams) -> StackedParams:
        return variables

    def penalty(self, variables: StackedParams) -> torch.Tensor | None:
        return None


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
) -> StackedParams:
    """Train every pair's variables for ``epochs`` local epochs; returns new variables
    (one row per pair). Inputs are not modified."""
    variables = {k: v.detach().clone() for k, v in variables.items()}
    forward = type(model).stacked_forward
    counts = data.counts[device_of_pair]
    max_n = data.x.shape[1]
    n_steps = math.ceil(int(counts.max()) / batch_size)
    pad = n_steps * batch_size - max_n
    positions = torch.arange(batch_size, device=counts.device)
    rows = device_of_pair[:, None]

    def drop(h: torch.Tensor) -> torch.Tensor:
        return h * dropout_masks(h.shape, dropout, generator).to(h.device)

    for _ in range(epochs):
        order = epoch_orders(counts, max_n, generator)
        if pad > 0:
            order = F.pad(order, (0, pad))
        for step in range(n_steps):
            idx = order[:, step * batch_size : (step + 1) * batch_size]
            valid = ((step * batch_size + positions)[None, :] < counts[:, None]).to(torch.float32)
            weight = valid / valid.sum(1, keepdim=True).clamp(min=1)  # batch mean
            active = valid.any(1).to(torch.float32)
            leaves = {k: v.detach().requires_grad_(True) for k, v in variables.items()}
            theta = composition.compose(leaves)
            yb = data.y[rows, idx]
            logits = forward(theta, data.x[rows, idx], shared_input=False, dropout=drop if dropout > 0 else None)
            ce = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view_as(yb)
            extra = sum(quadratic(v, 2.0 * l2 * v) for k, v in theta.items() if is_regularized(k))
            penalty = composition.penalty(leaves)
            if penalty is not None:
                extra = extra + penalty
            loss = (ce * weight).sum() + (active * extra).sum()
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
            with torch.no_grad():
                for v, g in zip(variables.values(), grads):
                    if g is not None:
                        v.sub_(g, alpha=lr)
    return variables
