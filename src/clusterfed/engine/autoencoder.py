"""Many dense autoencoders trained and evaluated together (fedcref §5.2, DESIGN.md §6).

FedCRef keeps one autoencoder per (client, local cluster) and one per community;
their parameters are stacked along a leading model axis, so training every model on
its own samples is one batched forward/backward per step (Adam state stacked too),
and the reconstruction error of every model on every sample — the all-to-all exchange
of Alg. 1 line 9 — is one call. Samples are never copied per model: a model's
training set is a row of indices into one sample matrix.
"""

from __future__ import annotations

import math

import torch

from clusterfed.engine.stacked import StackedParams

# The paper's encoder d-100-64-32; the decoder mirrors it (fedcref §5.2).
AE_HIDDEN: tuple[int, ...] = (100, 64, 32)


def layer_sizes(d: int, hidden: tuple[int, ...] = AE_HIDDEN) -> list[int]:
    """Widths of every layer, input to output: d-100-64-32-64-100-d."""
    return [d, *hidden, *reversed(hidden[:-1]), d]


def init_autoencoders(
    n_models: int, d: int, generator: torch.Generator, *, hidden: tuple[int, ...] = AE_HIDDEN
) -> StackedParams:
    """``n_models`` distinct Glorot-uniform draws with zero biases (Keras' Dense default)."""
    sizes = layer_sizes(d, hidden)
    params: StackedParams = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w = torch.rand(n_models, fan_in, fan_out, generator=generator) * (2 * bound) - bound
        params[f"w{layer}"] = w
        params[f"b{layer}"] = torch.zeros(n_models, 1, fan_out)
    return params


def n_layers(params: StackedParams) -> int:
    return len(params) // 2


def encode(params: StackedParams, x: torch.Tensor, *, linear_code: bool = False) -> torch.Tensor:
    """Codes ``[M, N, 32]`` of ``x [M, N, d]``: ReLU layers up to the bottleneck, whose
    activation is the identity with ``linear_code`` (DEC's embedding)."""
    h = x
    code = n_layers(params) // 2 - 1
    for layer in range(code + 1):
        h = torch.baddbmm(params[f"b{layer}"], h, params[f"w{layer}"])
        h = h if (linear_code and layer == code) else h.relu()
    return h


def reconstruct(params: StackedParams, x: torch.Tensor, *, linear_code: bool = False) -> torch.Tensor:
    """``x̂ [M, N, d]`` of ``x [M, N, d]``: ReLU hidden layers, sigmoid output (pixels in [0, 1])."""
    h = encode(params, x, linear_code=linear_code)
    last = n_layers(params) - 1
    for layer in range(n_layers(params) // 2, last + 1):
        h = torch.baddbmm(params[f"b{layer}"], h, params[f"w{layer}"])
        h = h.sigmoid() if layer == last else h.relu()
    return h


@torch.no_grad()
def reconstruction_errors(
    params: StackedParams, x: torch.Tensor, *, chunk: int = 1024
) -> torch.Tensor:
    """Per-sample MSE ``[M, N]`` of every model on every row of ``x [N, d]``."""
    m = next(iter(params.values())).shape[0]
    out = torch.empty(m, x.shape[0])
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        xb_m = xb.expand(m, *xb.shape)
        out[:, start : start + chunk] = (reconstruct(params, xb_m) - xb_m).pow_(2).mean(-1)
    return out


def train_autoencoders(
    params: StackedParams,
    x: torch.Tensor,
    index: torch.Tensor,
    counts: torch.Tensor,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
    linear_code: bool = False,
) -> StackedParams:
    """Adam on the batch-mean MSE, model p on samples ``x[index[p, :counts[p]]]``.

    Every model shuffles its own samples each epoch and steps with its own batches;
    models with fewer samples finish their epoch early and are masked out of the
    remaining steps (their Adam step count does not advance), so each model follows
    the trajectory it would follow alone. Models with no samples are returned
    unchanged. Inputs are not modified; Adam (β = 0.9, 0.999, ε = 1e-7 as in Keras)
    starts from zero state.
    """
    params = {k: v.detach().clone() for k, v in params.items()}
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    v2 = {k: torch.zeros_like(v) for k, v in params.items()}
    beta1, beta2, eps = 0.9, 0.999, 1e-7
    n_pairs, max_n = index.shape
    steps_done = torch.zeros(n_pairs)
    n_steps = math.ceil(int(counts.max()) / batch_size) if n_pairs and int(counts.max()) > 0 else 0
    positions = torch.arange(batch_size)
    rows = torch.arange(n_pairs)[:, None]
    for _ in range(epochs):
        keys = torch.rand(n_pairs, max_n, generator=generator)
        keys[torch.arange(max_n)[None, :] >= counts[:, None]] = 2.0
        order = keys.argsort(dim=1)
        pad = n_steps * batch_size - max_n
        if pad > 0:
            order = torch.nn.functional.pad(order, (0, pad))
        for step in range(n_steps):
            slot = order[:, step * batch_size : (step + 1) * batch_size]
            valid = ((step * batch_size + positions)[None, :] < counts[:, None]).to(torch.float32)
            n_valid = valid.sum(1)
            active = n_valid > 0
            xb = x[index[rows, slot]]
            xb = torch.where(valid[..., None] > 0, xb, 0.0)  # padding slots hold sample 0: never let it in
            leaves = {k: p.requires_grad_(True) for k, p in params.items()}
            per_sample = (reconstruct(leaves, xb, linear_code=linear_code) - xb).pow(2).mean(-1)
            loss = ((per_sample * valid).sum(1) / n_valid.clamp(min=1)).sum()
            grads = torch.autograd.grad(loss, list(leaves.values()))
            steps_done += active.to(torch.float32)
            t = steps_done.clamp(min=1)
            corr1 = (1 - beta1 ** t).view(-1, 1, 1)
            corr2 = (1 - beta2 ** t).view(-1, 1, 1)
            gate = active.to(torch.float32).view(-1, 1, 1)
            with torch.no_grad():
                for (k, p), g in zip(params.items(), grads):
                    p.requires_grad_(False)
                    # Masked models keep their moments and parameters untouched.
                    m[k].mul_(1 - gate * (1 - beta1)).add_(gate * (1 - beta1) * g)
                    v2[k].mul_(1 - gate * (1 - beta2)).add_(gate * (1 - beta2) * g * g)
                    update = (m[k] / corr1) / ((v2[k] / corr2).sqrt() + eps)
                    p.sub_(lr * gate * update)
    for p in params.values():
        p.requires_grad_(False)
    return params


def model_bytes(d: int, hidden: tuple[int, ...] = AE_HIDDEN) -> int:
    """Size of one float32 autoencoder on the wire."""
    sizes = layer_sizes(d, hidden)
    return 4 * sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
