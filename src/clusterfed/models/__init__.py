"""Model architectures of thesis appendix B.3 and a small CNN.

Each architecture is an ``nn.Module`` (one model, for serving and export) with a
``stacked_forward`` that runs M copies at once on parameters stacked along a leading
axis (the engine's layout, same names and per-model shapes as the module's
``state_dict``). The stacked forward is written with batched matmuls and grouped
convolutions rather than ``torch.func.vmap`` over the module: on CPU, vmap's
batched ``linear`` backward was 3-4x slower for the thesis MLP.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

Params = dict[str, torch.Tensor]
#: A training-time transform of hidden activations ``[M, N, hidden]`` (dropout masks).
Dropout = Callable[[torch.Tensor], torch.Tensor]
#: What an SGD step calls between taking its gradients and applying them (the engine's
#: quadratic penalty): ``pull(params, active, first)`` with the step's models, which of
#: them have samples (bool ``[M]``) and the row of the first among the models pulled.
Pull = Callable[[Params, torch.Tensor, int], None]

MODELS: tuple[str, ...] = ("mlp", "cnn")
# The CNN's default shape: cheap enough for CPU runs (FLACC's MNIST CNN is (32, 64), 5).
CONV_CHANNELS: tuple[int, int] = (16, 32)
KERNEL_SIZE: int = 3
# Floats of one [models, batch, hidden] activation in the MLP's analytic step (128 MiB).
ACTIVATION_BUDGET: int = 2**25


class MLP(nn.Module):
    """Thesis B.3: one hidden ReLU layer and a softmax output (softmax lives in the loss)."""

    def __init__(self, input_shape: tuple[int, ...], n_classes: int, *, hidden: int = 128):
        super().__init__()
        self.hidden = nn.Linear(math.prod(input_shape), hidden)
        self.output = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(torch.relu(self.hidden(x.flatten(1))))

    @staticmethod
    def stacked_forward(
        params: Params, x: torch.Tensor, *, shared_input: bool, dropout: Dropout | None = None
    ) -> torch.Tensor:
        """Logits ``[M, N, K]``; x is ``[N, ...]`` (shared) or ``[M, N, ...]``.
        ``dropout`` (training only) transforms the hidden activations ``[M, N, hidden]``."""
        h = _stacked_linear(params["hidden.weight"], params["hidden.bias"], x, shared_input).relu()
        h = h if dropout is None else dropout(h)
        return _stacked_linear(params["output.weight"], params["output.bias"], h, False)

    @staticmethod
    @torch.no_grad()
    def stacked_sgd_step(
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        sample_weight: torch.Tensor,
        *,
        lr: float,
        l2: float,
        pull: Pull | None = None,
    ) -> None:
        """One in-place SGD step of M models on their own batches ``x [M, B, ...]``.

        Analytic backward of ``Σ_b w_b·CE_b + l2·Σ‖W‖²`` with the weight gradients
        accumulated straight into the parameters (``baddbmm_``): the engine's hot loop
        then never materialises an [M, hidden, in] gradient. Equal to the autograd step
        (tests/engine) within float tolerance. Models whose weights are all zero
        (finished devices) are left untouched. Models go through in chunks whose hidden
        activations stay under ``ACTIVATION_BUDGET`` floats (full-batch steps of wide
        MLPs would otherwise hold several [M, B, hidden] tensors at once). ``pull`` moves
        the models after the gradients are taken, before they are applied.
        """
        x = x.flatten(2)
        m, b = x.shape[:2]
        chunk = max(1, ACTIVATION_BUDGET // (b * params["hidden.weight"].shape[1]))
        for s in range(0, m, chunk):
            rows = slice(s, s + chunk)
            MLP._sgd_step(
                {k: v[rows] for k, v in params.items()}, x[rows], y[rows], sample_weight[rows], lr=lr, l2=l2,
                pull=None if pull is None else lambda p, active, first, s=s: pull(p, active, s + first),
            )

    @staticmethod
    @torch.no_grad()
    def stacked_gradients(
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        sample_weight: torch.Tensor,
        *,
        l2: float,
        dropout: torch.Tensor | None = None,
    ) -> Params:
        """∇ of ``Σ_b w_b·CE_b + l2·Σ‖W‖²`` for M models on their own batches ``x [M, B, ...]``,
        analytic (equal to autograd, tests/engine): what a step through a composition of θ
        (``engine/composed.py``) chains on. ``dropout`` ``[M, B, hidden]`` multiplies the
        hidden activations (inverted-dropout masks)."""
        x = x.flatten(2)
        w1, b1, w2, b2 = (params[k] for k in ("hidden.weight", "hidden.bias", "output.weight", "output.bias"))
        h = torch.baddbmm(b1[:, None, :], x, w1.mT).relu_()
        kept = h if dropout is None else h * dropout
        dlogits = torch.baddbmm(b2[:, None, :], kept, w2.mT).softmax(-1)
        dlogits.scatter_add_(-1, y[..., None], -torch.ones_like(y[..., None], dtype=x.dtype))
        dlogits.mul_(sample_weight[..., None])
        dh = torch.bmm(dlogits, w2).mul_(h > 0)
        if dropout is not None:
            dh.mul_(dropout)
        return {
            "hidden.weight": torch.baddbmm(w1, dh.mT, x, beta=2.0 * l2),
            "hidden.bias": dh.sum(1),
            "output.weight": torch.baddbmm(w2, dlogits.mT, kept, beta=2.0 * l2),
            "output.bias": dlogits.sum(1),
        }

    @staticmethod
    def _sgd_step(params: Params, x, y, sample_weight, *, lr: float, l2: float, pull: Pull | None = None) -> None:
        w1, b1, w2, b2 = (params[k] for k in ("hidden.weight", "hidden.bias", "output.weight", "output.bias"))
        h = torch.baddbmm(b1[:, None, :], x, w1.mT).relu_()
        dlogits = torch.baddbmm(b2[:, None, :], h, w2.mT).softmax(-1)
        dlogits.scatter_add_(-1, y[..., None], -torch.ones_like(y[..., None], dtype=x.dtype))
        dlogits.mul_(sample_weight[..., None])
        dh = torch.bmm(dlogits, w2).mul_(h > 0)  # relu'(z) = [z > 0] = [relu(z) > 0]
        active = sample_weight.sum(1) > 0
        if pull is not None:  # every gradient above is at the pre-step θ
            pull(params, active, 0)
        decay = 1.0 - 2.0 * lr * l2
        if bool(active.all()):
            w2.baddbmm_(dlogits.mT, h, beta=decay, alpha=-lr)
            w1.baddbmm_(dh.mT, x, beta=decay, alpha=-lr)
        else:
            factor = torch.where(active, decay, 1.0).to(x.dtype)[:, None, None]
            w2.mul_(factor).baddbmm_(dlogits.mT, h, alpha=-lr)
            w1.mul_(factor).baddbmm_(dh.mT, x, alpha=-lr)
        b2.sub_(dlogits.sum(1), alpha=lr)
        b1.sub_(dh.sum(1), alpha=lr)


class CNN(nn.Module):
    """Two conv / ReLU / 2x2 max-pool blocks and a dense head, for CIFAR-sized inputs too.

    The defaults (3x3 kernels, 16 and 32 channels, 128 hidden units) are cheap enough
    for CPU runs; FLACC §V-A's MNIST network is ``kernel_size=5,
    conv_channels=(32, 64), hidden=512``. Convolutions keep the spatial size
    (padding ``kernel_size // 2``), so the head sees ``c2 · (H // 4) · (W // 4)`` features.
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        n_classes: int,
        *,
        hidden: int = 128,
        conv_channels: tuple[int, int] = CONV_CHANNELS,
        kernel_size: int = KERNEL_SIZE,
    ):
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd (same-size padding), got {kernel_size}")
        channels, height, width = input_shape
        c1, c2 = conv_channels
        self.conv1 = nn.Conv2d(channels, c1, kernel_size, padding=kernel_size // 2)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size, padding=kernel_size // 2)
        self.hidden = nn.Linear(c2 * (height // 4) * (width // 4), hidden)
        self.output = nn.Linear(hidden, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.output(torch.relu(self.hidden(x.flatten(1))))

    @staticmethod
    def stacked_forward(
        params: Params, x: torch.Tensor, *, shared_input: bool, dropout: Dropout | None = None
    ) -> torch.Tensor:
        """Logits ``[M, N, K]`` by grouped convolutions (one group per model);
        ``dropout`` (training only) transforms the dense hidden activations.

        Images and kernels go channels-last: oneDNN's fast path for grouped convs on
        CPU (one SGD step of 20 default CNNs 3.1x faster, of 20 FLACC CNNs 1.17x;
        ``benchmarks/cnn_step.py``), the same values as the NCHW layout."""
        m = params["conv1.weight"].shape[0]
        pad = params["conv1.weight"].shape[-1] // 2
        last = torch.channels_last
        w1 = params["conv1.weight"].flatten(0, 1).contiguous(memory_format=last)
        w2 = params["conv2.weight"].flatten(0, 1).contiguous(memory_format=last)
        if shared_input:  # [N, C, H, W]: every model sees the same images
            h = F.conv2d(x.contiguous(memory_format=last), w1, params["conv1.bias"].flatten(), padding=pad)
        else:  # [M, N, C, H, W] -> [N, M*C, H, W]
            n = x.shape[1]
            x = x.transpose(0, 1).reshape(n, -1, *x.shape[-2:]).contiguous(memory_format=last)
            h = F.conv2d(x, w1, params["conv1.bias"].flatten(), padding=pad, groups=m)
        h = F.max_pool2d(h.relu(), 2)
        h = F.conv2d(h, w2, params["conv2.bias"].flatten(), padding=pad, groups=m)
        h = F.max_pool2d(h.relu(), 2)  # [N, M*c2, h, w], channels-last
        h = h.contiguous().view(h.shape[0], m, -1).transpose(0, 1)  # [M, N, features] in (c, h, w) order
        h = _stacked_linear(params["hidden.weight"], params["hidden.bias"], h, False).relu()
        h = h if dropout is None else dropout(h)
        return _stacked_linear(params["output.weight"], params["output.bias"], h, False)


def _stacked_linear(
    weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, shared_input: bool
) -> torch.Tensor:
    """``x @ W_m^T + b_m`` for every model m; weight ``[M, out, in]`` as in ``nn.Linear``."""
    m, out_features, _ = weight.shape
    if shared_input:  # one GEMM [N, in] @ [in, M*out] instead of M copies of x
        x = x.flatten(1)
        return (x @ weight.flatten(0, 1).T).view(len(x), m, out_features).transpose(0, 1) + bias[
            :, None
        ]
    return torch.baddbmm(bias[:, None, :], x.flatten(2), weight.mT)


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    n_classes: int,
    *,
    hidden: int = 128,
    conv_channels: tuple[int, int] = CONV_CHANNELS,
    kernel_size: int = KERNEL_SIZE,
) -> nn.Module:
    """The architecture template ``name`` for inputs of ``input_shape`` (C, H, W);
    ``conv_channels`` and ``kernel_size`` shape the CNN and are ignored by the MLP."""
    if name == "mlp":
        return MLP(input_shape, n_classes, hidden=hidden)
    if name == "cnn":
        return CNN(
            input_shape, n_classes, hidden=hidden, conv_channels=tuple(conv_channels), kernel_size=kernel_size
        )
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def glorot_init_(module: nn.Module, generator: torch.Generator) -> None:
    """Keras' defaults used by the thesis: Glorot-uniform kernels, zero biases."""
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            fan_out, fan_in = p.shape[0], math.prod(p.shape[1:])
            if p.dim() > 2:  # conv kernel [out, in, kh, kw]
                receptive = math.prod(p.shape[2:])
                fan_in, fan_out = p.shape[1] * receptive, p.shape[0] * receptive
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            with torch.no_grad():  # drawn where the generator lives, so every device gets the same draw
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=generator))


def is_regularized(parameter_name: str) -> bool:
    """L2 applies to kernels only, as Keras' ``kernel_regularizer`` in the thesis."""
    return parameter_name.endswith("weight")
