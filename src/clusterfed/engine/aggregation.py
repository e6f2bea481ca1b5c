"""Weighted model averaging (thesis Alg. 4, last line), for many clusters at once."""

from __future__ import annotations

import torch

from clusterfed.engine.stacked import StackedParams


def weighted_average(
    trained: StackedParams,
    target_of_pair: torch.Tensor,
    weights: torch.Tensor,
    previous: StackedParams,
) -> StackedParams:
    """θ_c = Σ_p w_p θ_p / Σ_p w_p over the pairs p trained for target c.

    A target that no pair trained keeps its ``previous`` parameters. Pure: neither
    input is modified.
    """
    n_targets = next(iter(previous.values())).shape[0]
    total = torch.zeros(n_targets, device=weights.device).index_add_(0, target_of_pair, weights)
    has_pairs = total > 0
    out = {}
    for k, theta in trained.items():
        w = weights.view(-1, *([1] * (theta.dim() - 1)))
        summed = torch.zeros_like(previous[k]).index_add_(0, target_of_pair, theta * w)
        mean = summed / total.clamp(min=1e-12).view(-1, *([1] * (theta.dim() - 1)))
        keep = has_pairs.view(-1, *([1] * (theta.dim() - 1)))
        out[k] = torch.where(keep, mean, previous[k])
    return out
