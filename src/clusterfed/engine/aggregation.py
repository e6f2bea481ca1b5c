"""Weighted model averaging (thesis Alg. 4, last line), for many clusters at once."""

from __future__ import annotations

import torch

from clusterfed.engine.stacked import StackedParams


def weighted_average(
    trained: StackedParams,
    target_of_pair: torch.Tensor,
    weights: torch.Tensor,
    previous: StackedParams,
    *,
    chunk: int = 2**20,
) -> StackedParams:
    """θ_c = Σ_p w_p θ_p / Σ_p w_p over the pairs p trained for target c.

    A target that no pair trained keeps its ``previous`` parameters. Pure: neither
    input is modified. The products w_p θ_p are formed ``chunk`` elements at a time:
    4 MiB temporaries stay in cache and in the allocator's heap, where 64 MiB ones are
    fresh pages every time (2.6x slower for 2000 MNIST MLPs, ``benchmarks/RESULTS.md`` §10).
    """
    n_targets = next(iter(previous.values())).shape[0]
    total = torch.zeros(n_targets, device=weights.device).index_add_(0, target_of_pair, weights)
    has_pairs = total > 0
    out = {}
    for k, theta in trained.items():
        w = weights.view(-1, *([1] * (theta.dim() - 1)))
        summed = torch.zeros_like(previous[k])
        rows = max(1, chunk // max(1, theta[0].numel()))
        for r0 in range(0, len(theta), rows):  # w_p θ_p a block of rows at a time: no P·|θ| temporary
            r = slice(r0, r0 + rows)
            summed.index_add_(0, target_of_pair[r], theta[r] * w[r])
        summed.div_(total.clamp(min=1e-12).view(-1, *([1] * (theta.dim() - 1))))  # in place: the mean
        if not bool(has_pairs.all()):  # only the untrained rows are copied back, not a where over all
            untrained = torch.nonzero(~has_pairs).flatten()
            summed.index_copy_(0, untrained, previous[k].index_select(0, untrained))
        out[k] = summed
    return out
