"""Per-sample losses and accuracies of many models on device data, in batched forwards."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clusterfed.engine.stacked import StackedParams, n_models, stacked_forward, take
from clusterfed.engine.tensors import PaddedSplit


EVAL_BUDGET_BYTES = 256 * 2**20  # activations of one evaluation forward (the bound below)
# Samples per forward at least: narrower GEMMs take other BLAS kernels, whose sums differ
# in the last bit from the one-chunk evaluation (tests/engine: equal to it exactly).
MIN_SAMPLES = 128
#: Per-sample losses ``all_pairs_losses`` can measure.
MEASURES = ("cross_entropy", "zero_one")


def activation_floats(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Floats one sample leaves in the outputs of the template's leaf modules (its
    activations), measured once by a forward with hooks; the evaluation chunk size."""
    sizes: list[int] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: sizes.append(out[0].numel()))
        for m in model.modules()
        if not list(m.children())
    ]
    try:
        with torch.no_grad():
            p = next(model.parameters())
            model(torch.zeros(1, *input_shape, dtype=p.dtype, device=p.device))
    finally:
        for h in hooks:
            h.remove()
    return max(1, sum(sizes))


@torch.no_grad()
def all_pairs_losses(
    model: nn.Module,
    params: StackedParams,
    data: PaddedSplit,
    *,
    devices: torch.Tensor | None = None,
    max_rows: int = 2**16,
    measure: str = "cross_entropy",
) -> torch.Tensor:
    """Cross-entropy (or, with ``measure="zero_one"``, the 0-1 loss: 1 for a wrong
    prediction) of every model on the samples of ``devices`` (default: all),
    ``[M, len(devices), max_n]``; entries past a device's count are 0 (``data.mask``).

    Only real samples are evaluated: they are pushed through the models in chunks of
    at most ``max_rows`` (model, sample) rows, one batched forward per chunk with the
    samples shared by the chunk's models. Peak memory is therefore the output
    (4·M·|devices|·max_n bytes), the selected inputs, and one chunk's activations:
    at most max(``max_rows``, 128) × (activation floats per sample, ``activation_floats``)
    × 4 bytes, whatever M and the number of devices (the engine sizes ``max_rows`` so that
    this is ``EVAL_BUDGET_BYTES``).
    """
    if measure not in MEASURES:
        raise ValueError(f"measure: expected one of {MEASURES}, got {measure!r}")
    mask = data.mask if devices is None else data.mask[devices]
    x = (data.x if devices is None else data.x[devices])[mask]
    y = (data.y if devices is None else data.y[devices])[mask]
    where = torch.nonzero(mask.flatten()).flatten()  # each real sample's slot in the output
    m = n_models(params)
    per_forward = max(1, min(m, max_rows // MIN_SAMPLES))
    pieces = max(1, -(-len(y) // max(MIN_SAMPLES, max_rows // per_forward)))
    bounds = [len(y) * i // pieces for i in range(pieces + 1)]  # even: no narrow last piece
    out = torch.zeros(m, *mask.shape, dtype=torch.float32, device=y.device)
    slots = out.view(m, -1)
    for m0 in range(0, m, per_forward):
        chunk = {k: v[m0 : m0 + per_forward] for k, v in params.items()}
        for s0, s1 in zip(bounds[:-1], bounds[1:]):
            logits = stacked_forward(model, chunk, x[s0:s1], shared_input=True)
            labels = y[s0:s1].repeat(logits.shape[0])
            if measure == "zero_one":
                loss = (logits.flatten(0, 1).argmax(-1) != labels).float()
            else:
                loss = F.cross_entropy(logits.flatten(0, 1), labels, reduction="none")
            slots[m0 : m0 + per_forward, where[s0:s1]] = loss.view(logits.shape[0], -1)
    return out


def _device_chunks(params: StackedParams, data: PaddedSplit, budget: int) -> int:
    """Devices per forward of the own-model evaluation: one model copy per device plus
    its inputs, within ``budget`` bytes (at least one device)."""
    per_device = sum(v[0].numel() * v.element_size() for v in params.values())
    per_device += data.x[0].numel() * data.x.element_size()
    return max(1, budget // per_device)


@torch.no_grad()
def own_model_logits(
    model: nn.Module, params: StackedParams, model_of_device: torch.Tensor, data: PaddedSplit,
    *, budget: int = EVAL_BUDGET_BYTES,
) -> torch.Tensor:
    """Logits ``[n, max_n, K]`` of device d's own model ``params[model_of_device[d]]`` on
    its data.

    When one model copy per device fits in ``budget`` bytes, one batched forward; else
    (4800 devices × a 784-2048-10 MLP would be 31 GB) each model used runs once on the
    samples of all its devices (shared input), and models used by single devices take
    per-device copies in chunks within ``budget``. The two paths agree to float
    rounding (different GEMM kernels)."""
    step = _device_chunks(params, data, budget)
    n = len(model_of_device)
    if n <= step:
        return stacked_forward(model, take(params, model_of_device), data.x, shared_input=False)
    models, inverse, users = torch.unique(model_of_device, return_inverse=True, return_counts=True)
    out = None
    shared = torch.nonzero(users > 1).flatten()
    for u in shared.tolist():
        devices = torch.nonzero(inverse == u).flatten()
        x = data.x[devices].flatten(0, 1)
        logits = stacked_forward(model, take(params, models[u : u + 1]), x, shared_input=True)[0]
        if out is None:
            out = logits.new_empty(n, data.x.shape[1], logits.shape[-1])
        out[devices] = logits.view(len(devices), data.x.shape[1], -1)
    alone = torch.nonzero(users[inverse] == 1).flatten()
    for d0 in range(0, len(alone), step):
        devices = alone[d0 : d0 + step]
        logits = stacked_forward(model, take(params, model_of_device[devices]), data.x[devices], shared_input=False)
        if out is None:
            out = logits.new_empty(n, data.x.shape[1], logits.shape[-1])
        out[devices] = logits
    return out


@torch.no_grad()
def own_model_accuracy(
    model: nn.Module, params: StackedParams, model_of_device: torch.Tensor, data: PaddedSplit
) -> torch.Tensor:
    """Accuracy of device d's own model ``params[model_of_device[d]]`` on its data, ``[n]``."""
    logits = own_model_logits(model, params, model_of_device, data)
    correct = (logits.argmax(-1) == data.y) & data.mask
    return correct.sum(1) / data.counts.clamp(min=1)


@torch.no_grad()
def own_model_losses(
    model: nn.Module, params: StackedParams, model_of_device: torch.Tensor, data: PaddedSplit
) -> torch.Tensor:
    """Per-sample losses ``[n, max_n]`` of device d's own model ``params[model_of_device[d]]``."""
    logits = own_model_logits(model, params, model_of_device, data)
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
