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

import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.stacked import StackedParams, stacked_forward
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.models import is_regularized


def epoch_orders(counts: torch.Tensor, max_n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of each pair's samples, ``[P, max_n]``; padding sorts last."""
    keys = torch.rand(len(counts), max_n, generator=generator).to(counts.device)
    keys[torch.arange(max_n, device=counts.device)[None, :] >= counts[:, None]] = 2.0
    return keys.argsort(dim=1)


def autograd_sgd_step(
    model: nn.Module,
    params: StackedParams,
    x: torch.Tensor,
    y: torch.Tensor,
    sample_weight: torch.Tensor,
    *,
    lr: float,
    l2: float,
) -> None:
    """In-place SGD step of ``Σ_b w_b·CE_b + l2·Σ‖W‖²`` for any architecture, by autograd.

    Models whose sample weights are all zero (finished devices) are left untouched.
    """
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    logits = stacked_forward(model, leaves, x, shared_input=False)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
    grads = torch.autograd.grad((ce * sample_weight).sum(), list(leaves.values()))
    active = (sample_weight.sum(1) > 0).to(x.dtype)
    decay = 1.0 - 2.0 * lr * l2 * active  # d/dW of l2·‖W‖² is 2·l2·W
    with torch.no_grad():
        for (k, p), g in zip(params.items(), grads):
            if is_regularized(k):
                p.mul_(decay.view(-1, *([1] * (p.dim() - 1))))
            p.add_(g, alpha=-lr)  # in place: no parameter-sized temporaries per step


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
) -> StackedParams:
    """Train every pair for ``epochs`` local epochs; returns new stacked parameters.

    The loss of a pair is the batch-mean cross-entropy plus ``l2 * Σ‖W‖²`` over its
    kernels (Keras' L2 regulariser, thesis B.3). The architecture's analytic
    ``stacked_sgd_step`` is used when it has one, else ``autograd_sgd_step``.
    Inputs are not modified.
    """
    params = {k: v.detach().clone() for k, v in params.items()}
    step_fn = getattr(type(model), "stacked_sgd_step", None)
    if step_fn is None:
        def step_fn(p, xb, yb, w, *, lr, l2):
            autograd_sgd_step(model, p, xb, yb, w, lr=lr, l2=l2)

    counts = data.counts[device_of_pair]
    max_n = data.x.shape[1]
    n_steps = math.ceil(int(counts.max()) / batch_size)
    pad = n_steps * batch_size - max_n
    positions = torch.arange(batch_size, device=counts.device)
    rows = device_of_pair[:, None]
    for _ in range(epochs):
        order = epoch_orders(counts, max_n, generator)
        if pad > 0:
            order = F.pad(order, (0, pad))
        for step in range(n_steps):
            idx = order[:, step * batch_size : (step + 1) * batch_size]
            valid = ((step * batch_size + positions)[None, :] < counts[:, None]).to(torch.float32)
            weight = valid / valid.sum(1, keepdim=True).clamp(min=1)  # batch mean
            step_fn(params, data.x[rows, idx], data.y[rows, idx], weight, lr=lr, l2=l2)
    return params
