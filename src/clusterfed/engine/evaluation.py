"""Per-sample losses and accuracies of many models on device data, in batched forwards."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.stacked import StackedParams, n_models, stacked_forward, take
from clusterfed.engine.tensors import PaddedSplit


@torch.no_grad()
def all_pairs_losses(
    model: nn.Module, params: StackedParams, data: PaddedSplit, *, chunk: int = 8192
) -> torch.Tensor:
    """Cross-entropy of every model on every device's samples, ``[M, n_devices, max_n]``.

    Each chunk of samples is pushed through all M models in one batched forward.
    Entries past a device's count are padding (use ``data.mask``).
    """
    x = data.x.flatten(0, 1)
    y = data.y.flatten()
    out = []
    for start in range(0, len(y), chunk):
        logits = stacked_forward(model, params, x[start : start + chunk], shared_input=True)
        yb = y[start : start + chunk]
        out.append(
            F.cross_entropy(logits.flatten(0, 1), yb.repeat(logits.shape[0]), reduction="none")
            .view(logits.shape[0], -1)
        )
    return torch.cat(out, 1).view(n_models(params), *data.y.shape)


@torch.no_grad()
def own_model_accuracy(
    model: nn.Module, params: StackedParams, model_of_device: torch.Tensor, data: PaddedSplit
) -> torch.Tensor:
    """Accuracy of device d's own model ``params[model_of_device[d]]`` on its data, ``[n]``."""
    logits = stacked_forward(model, take(params, model_of_device), data.x, shared_input=False)
    correct = (logits.argmax(-1) == data.y) & data.mask
    return correct.sum(1) / data.counts.clamp(min=1)


@torch.no_grad()
def own_model_losses(
    model: nn.Module, params: StackedParams, model_of_device: torch.Tensor, data: PaddedSplit
) -> torch.Tensor:
    """Per-sample losses ``[n, max_n]`` of device d's own model ``params[model_of_device[d]]``."""
    logits = stacked_forward(model, take(params, model_of_device), data.x, shared_input=False)
    return F.cross_entropy(logits.flatten(0, 1), data.y.flatten(), reduction="none").view_as(data.y)


def mean_loss_gradients(
    model: nn.Module, params: StackedParams, data: PaddedSplit, devices: np.ndarray, *, chunk: int = 64
) -> np.ndarray:
    """∂ℓ(θ; D_i)/∂θ of the one model ``params`` for each device i of ``devices``: the
    full-batch gradient of its mean cross-entropy on i's samples, all parameters
    flattened in key order, ``[len(devices), d]`` float32; ``chunk`` devices per
    stacked forward/backward."""
    anchor = {k: v.to(data.x.device) for k, v in params.items()}
    rows = []
    for start in range(0, len(devices), chunk):
        idx = torch.as_tensor(devices[start : start + chunk], dtype=torch.long, device=data.x.device)
        leaves = {k: v.expand(len(idx), *v.shape[1:]).clone().requires_grad_(True) for k, v in anchor.items()}
        x, y, counts = data.x[idx], data.y[idx], data.counts[idx]
        logits = stacked_forward(model, leaves, x, shared_input=False)
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        valid = torch.arange(y.shape[1], device=y.device)[None, :] < counts[:, None]
        per_device = (ce * valid).sum(1) / counts.clamp(min=1)  # ℓ(θ; D_i), a mean over D_i
        grads = torch.autograd.grad(per_device.sum(), list(leaves.values()))
        rows.append(torch.cat([g.flatten(1) for g in grads], dim=1).detach().cpu())
    if not rows:
        return np.zeros((0, sum(v[0].numel() for v in params.values())), dtype=np.float32)
    return torch.cat(rows).numpy().astype(np.float32, copy=False)
