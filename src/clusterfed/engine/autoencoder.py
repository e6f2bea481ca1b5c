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

from clusterfed.engine.adam import StackedAdam
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


@torch.no_grad()
def reconstruction_errors(
    params: StackedParams, x: torch.Tensor, *, chunk: int = 128
) -> torch.Tensor:
    """Per-sample MSE ``[M, N]`` of every model on every row of ``x [N, d]``.

    Chunks of ``chunk`` samples go through every model at once; the activations of a
    chunk live in buffers reused from chunk to chunk (a fresh ``[M, chunk, d]``
    tensor per chunk costs more in page faults than its arithmetic)."""
    m = next(iter(params.values())).shape[0]
    out = torch.empty(m, x.shape[0])
    if m == 0 or x.shape[0] == 0:
        return out
    acts = _activations(params, linear_code=False)
    buffers = [torch.empty(m, min(chunk, x.shape[0]), params[f"w{layer}"].shape[2]) for layer in range(len(acts))]
    for start in range(0, x.shape[0], chunk):
        xb = x[start : start + chunk]
        n = len(xb)
        x_hat = _forward(params, xb.expand(m, *xb.shape), acts, [b[:, :n] for b in buffers])[-1]
        torch.mean(x_hat.sub_(xb).square_(), -1, out=out[:, start : start + n])
    return out


def _activations(params: StackedParams, *, linear_code: bool) -> list[str]:
    """Activation of each layer: ReLU, the bottleneck's identity with ``linear_code``
    (as :func:`encode`), sigmoid at the output (pixels in [0, 1])."""
    last, code = n_layers(params) - 1, n_layers(params) // 2 - 1
    return ["sigmoid" if layer == last else "linear" if (linear_code and layer == code) else "relu"
            for layer in range(last + 1)]


def _forward(
    params: StackedParams, x: torch.Tensor, acts: list[str], buffers: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Every layer's output for ``x [M, B, d]``, written into ``buffers`` (one per layer)."""
    h = [x]
    for layer, (act, buf) in enumerate(zip(acts, buffers)):
        z = torch.baddbmm(params[f"b{layer}"], h[-1], params[f"w{layer}"], out=buf)
        h.append(z.relu_() if act == "relu" else z.sigmoid_() if act == "sigmoid" else z)
    return h[1:]


class _Workspace:
    """Buffers of one training step of M models on batches of B samples: the layers'
    outputs, their back-propagated errors and the gradients, allocated once."""

    def __init__(self, params: StackedParams, batch_size: int) -> None:
        m = next(iter(params.values())).shape[0]
        widths = [params[f"w{layer}"].shape[2] for layer in range(n_layers(params))]
        self.d = params["w0"].shape[1]
        self.x = torch.empty(m, batch_size, self.d)
        self.h = [torch.empty(m, batch_size, w) for w in widths]
        self.delta = [torch.empty(m, batch_size, w) for w in widths]
        self.slope = torch.empty(m, batch_size, self.d)
        self.grads = {k: torch.empty_like(v) for k, v in params.items()}


def _mse_gradients(
    params: StackedParams, ws: _Workspace, weight: torch.Tensor, acts: list[str]
) -> StackedParams:
    """Gradients of Σ_m Σ_s weight[m, s] · mean_j (x̂ − x)²[m, s, j] on the batch in
    ``ws.x``, by hand-written backpropagation (the autograd graph allocates every
    gradient and activation afresh each step)."""
    h = _forward(params, ws.x, acts, ws.h)
    last = len(acts) - 1
    x_hat = h[last]
    delta = torch.sub(x_hat, ws.x, out=ws.delta[last]).mul_(weight[..., None] * (2.0 / ws.d))
    slope = torch.mul(x_hat, x_hat, out=ws.slope)
    delta.mul_(torch.sub(x_hat, slope, out=slope))  # σ'(z) = x̂ − x̂²
    for layer in range(last, -1, -1):
        below = ws.x if layer == 0 else h[layer - 1]
        torch.bmm(below.transpose(1, 2), delta, out=ws.grads[f"w{layer}"])
        torch.sum(delta, 1, keepdim=True, out=ws.grads[f"b{layer}"])
        if layer == 0:
            break
        back = torch.bmm(delta, params[f"w{layer}"].transpose(1, 2), out=ws.delta[layer - 1])
        if acts[layer - 1] == "relu":
            back.masked_fill_(h[layer - 1] <= 0, 0.0)
        delta = back
    return ws.grads


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
    models with fewer samples finish their epoch early and are left out of the
    remaining steps (their Adam step count does not advance), so each model follows
    the trajectory it would follow alone. Models with no samples are returned
    unchanged. Inputs are not modified; Adam (β = 0.9, 0.999, ε = 1e-7 as in Keras)
    starts from zero state. One step is a hand-written forward/backward into reused
    buffers and one fused Adam update of every model that has a batch
    (``torch._fused_adam_``, torch's own Adam arithmetic, over per-model views).
    """
    params = {k: v.detach().clone() for k, v in params.items()}
    n_pairs, max_n = index.shape
    n_steps = math.ceil(int(counts.max()) / batch_size) if n_pairs and int(counts.max()) > 0 else 0
    if n_steps == 0 or epochs == 0:
        return params
    acts = _activations(params, linear_code=linear_code)
    ws = _Workspace(params, batch_size)
    state = StackedAdam(params, ws.grads)
    positions = torch.arange(batch_size)
    d = x.shape[1]
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
            # padding slots hold sample 0: never let it in (zeroed, not multiplied by 0:
            # a non-finite sample 0 would leak), and weighted 0 in the loss
            torch.index_select(x, 0, index.gather(1, slot).flatten(), out=ws.x.view(-1, d))
            ws.x.masked_fill_(valid[..., None] == 0, 0.0)
            _mse_gradients(params, ws, valid / n_valid.clamp(min=1)[:, None], acts)
            state.step(torch.nonzero(n_valid > 0).flatten().tolist(), lr=lr)
    return params


def model_bytes(d: int, hidden: tuple[int, ...] = AE_HIDDEN) -> int:
    """Size of one float32 autoencoder on the wire."""
    sizes = layer_sizes(d, hidden)
    return 4 * sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))
