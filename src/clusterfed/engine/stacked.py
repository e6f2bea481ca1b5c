"""Parameters of many models of one architecture, stacked along a leading axis.

``StackedParams`` maps each parameter name of the template to a tensor
``[n_models, *shape]``; selecting, copying and averaging models are indexing
operations, and a forward over all models is one call of the architecture's
``stacked_forward``.
"""

from __future__ import annotations

import torch
from torch import nn

from clusterfed.models import glorot_init_

StackedParams = dict[str, torch.Tensor]


def init_stacked(
    model: nn.Module,
    n_models: int,
    generator: torch.Generator,
    *,
    distinct: bool,
    device: torch.device,
) -> StackedParams:
    """``n_models`` initial models: copies of one θ, or ``distinct`` random draws."""
    draws = []
    for _ in range(n_models if distinct else 1):
        glorot_init_(model, generator)
        draws.append({k: v.detach().clone() for k, v in model.named_parameters()})
    stacked = {k: torch.stack([d[k] for d in draws]).to(device) for k in draws[0]}
    if not distinct:
        stacked = {k: v.expand(n_models, *v.shape[1:]).clone() for k, v in stacked.items()}
    return stacked


def take(params: StackedParams, index: torch.Tensor | list[int]) -> StackedParams:
    """Rows ``index`` of every parameter (a copy)."""
    index = torch.as_tensor(index, dtype=torch.long, device=next(iter(params.values())).device)
    return {k: v.index_select(0, index) for k, v in params.items()}


def n_models(params: StackedParams) -> int:
    return next(iter(params.values())).shape[0]


def stacked_forward(
    model: nn.Module, params: StackedParams, x: torch.Tensor, *, shared_input: bool
) -> torch.Tensor:
    """Logits ``[M, N, K]`` of every model: x is ``[N, ...]`` (shared) or ``[M, N, ...]``."""
    return type(model).stacked_forward(params, x, shared_input=shared_input)


def is_finite(params: StackedParams) -> torch.Tensor:
    """``[n_models]`` bool: the model has no NaN or infinite parameter."""
    ok = None
    for v in params.values():
        row = torch.isfinite(v.flatten(1)).all(dim=1)
        ok = row if ok is None else ok & row
    return ok
