"""Which uploaded updates a round may aggregate: the one rule every aggregate goes through.

A device's update Δ_p = θ_p − θ_start (its trained model minus the model it started
from; for a Fisher estimate, the estimate itself) is **rejected** when

1. it is not finite (any NaN or ±inf), or
2. its norm is an outlier against the round's other updates:
   ‖Δ_p‖ > k · median_{q ≠ p} ‖Δ_q‖ over the round's finite updates q other than p
   (leave-one-out, so that with two devices a single huge update cannot raise its own
   yardstick; the lower median for an even count). An update without another finite
   one to compare with is judged by rule 1 only.

An update magnitude ×100 (a sign-flipped, scaled attack) or 1e30 is rejected for any
k below its ratio to the typical norm. Honest updates stray less, but in clustered
rounds not by as little as one federation's step counts suggest: the first update of
a cluster formed late is 10.3× the round's median (FedClust on label skew), since it
starts from an untrained model while the other clusters have converged
(benchmarks/outlier_census.py: at most 5.2× in IFCA, StoCFL, FLACC). A k at or below
that rejects such an update, the cluster's model never moves, and the next update is
rejected again: a lock-out. The default k = 30 sits between the two, a factor of about
3 from each. Accepted updates may optionally be clipped to ‖Δ‖ ≤ ``clip_norm``. Pure
functions over tensors.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from clusterfed.engine.stacked import StackedParams

# The one home of the screening defaults (RobustRule, params.yaml's training section).
OUTLIER_FACTOR = 30.0  # k: between honest ratios (≤ 10.3 measured) and the ×100 attacks
CLIP_NORM = None  # no clipping
MAX_REJECTED_SHARE = 0.5  # a cold-start, continual or FedCRef run fails above this share of rejected uploads
REPEATED = 3  # a device rejected this often in one run is named in a RepeatedRejections warning


@dataclass(frozen=True)
class RobustRule:
    """``k`` (outlier factor, ``None`` = finite check only) and optional ``clip_norm``."""

    k: float | None = OUTLIER_FACTOR
    clip_norm: float | None = CLIP_NORM


def row_squared_norms(d: torch.Tensor) -> torch.Tensor:
    """‖d_p‖² of each row as float64: summed in float32 (relative error ~1e-6, far
    inside the outlier factor; 24x faster than casting to float64 as it reduces); a
    finite row whose float32 sum overflows (‖d‖ ≳ 1e19) is summed again in float64, so
    only non-finite rows come back inf or NaN."""
    d = d.flatten(1)
    sq = torch.linalg.vector_norm(d, dim=1).double().pow(2)  # inf/NaN if not finite
    overflow = torch.isinf(sq)
    if bool(overflow.any()):
        sq[overflow] = torch.linalg.vector_norm(d[overflow], dim=1, dtype=torch.float64).pow(2)
    return sq


def finite_norms(squared: torch.Tensor) -> torch.Tensor:
    """√ of summed squared norms, NaN where the row was not finite."""
    return torch.where(torch.isfinite(squared), squared, torch.full_like(squared, float("nan"))).sqrt()


def update_norms(
    trained: StackedParams,
    start: StackedParams | None = None,
    *,
    rows: torch.Tensor | None = None,
    chunk: int = 2**20,
) -> torch.Tensor:
    """‖θ_p − θ_start,p‖ of each row ``[P]`` (‖θ_p‖ when ``start`` is None); NaN when the
    row is not finite. ``rows``: row p started from ``start[k][rows[p]]`` (the models
    themselves, not a per-pair copy of them). Rows are taken ``chunk`` elements at a
    time, so the differences never take more than 4·``chunk`` bytes (not 4·P·|θ|) and
    stay in cache.
    Each tensor's row norms come from ``row_squared_norms``; the tensors' squares are
    added in float64. ``local_sgd(return_norms=True)`` computes the same figures chunk
    by chunk while the trained models are in cache."""
    total = None
    for k, v in trained.items():
        n_rows = max(1, chunk // max(1, v[0].numel()))
        parts = []
        for r0 in range(0, len(v), n_rows):
            r = slice(r0, r0 + n_rows)
            if start is None:
                d = v[r]
            else:
                d = v[r] - (start[k][r] if rows is None else start[k].index_select(0, rows[r]))
            parts.append(row_squared_norms(d))
        sq = torch.cat(parts) if parts else v.new_zeros(0, dtype=torch.float64)
        total = sq if total is None else total + sq
    return finite_norms(total)


def accepted(norms: torch.Tensor, k: float | None = OUTLIER_FACTOR) -> torch.Tensor:
    """``[P]`` bool: rule 1 (finite) and rule 2 (‖Δ_p‖ ≤ k · leave-one-out median).

    The leave-one-out lower medians of all rows come from one sort: without row p, the
    lower median of the n − 1 others is the sorted value at (n − 2) // 2, shifted one
    up when p itself sorts at or below that position."""
    finite = torch.isfinite(norms)
    keep = finite.clone()
    values = norms[finite]
    n = len(values)
    if k is None or n < 2:
        return keep
    ordered, order = values.sort(stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=order.device)
    mid = (n - 2) // 2
    median_of_others = torch.where(rank <= mid, ordered[mid + 1], ordered[mid])
    keep[finite] = ~(values > k * median_of_others)
    return keep


def clip_updates(trained: StackedParams, start: StackedParams, norms: torch.Tensor, clip_norm: float) -> StackedParams:
    """θ_start + Δ · min(1, clip_norm / ‖Δ‖) for every row; pure."""
    scale = (clip_norm / norms.clamp(min=1e-12)).clamp(max=1.0).to(next(iter(trained.values())).dtype)
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    return {k: start[k] + (v - start[k]) * scale.view(-1, *([1] * (v.dim() - 1))) for k, v in trained.items()}


def screen(
    trained: StackedParams,
    start: StackedParams | None,
    rule: RobustRule = RobustRule(),
    *,
    rows: torch.Tensor | None = None,
    norms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, StackedParams]:
    """The ``[P]`` bool mask of rejected rows, and the uploads with every rejected row
    set to NaN (no aggregate or later finite check can take it) and accepted rows
    clipped when ``rule.clip_norm`` is set. ``Engine`` calls this once per upload batch.
    ``rows``: row p started from ``start``'s row ``rows[p]`` (see ``update_norms``);
    ``norms``: the update norms when the caller has them already (``local_sgd``)."""
    if norms is None:
        norms = update_norms(trained, start, rows=rows)
    rejected = ~accepted(norms, rule.k)
    if rule.clip_norm is not None and start is not None:
        if rows is not None:
            start = {k: v.index_select(0, rows) for k, v in start.items()}
        trained = clip_updates(trained, start, norms, rule.clip_norm)
    if bool(rejected.any()):
        trained = {
            k: torch.where(rejected.view(-1, *([1] * (v.dim() - 1))), torch.full_like(v, float("nan")), v)
            for k, v in trained.items()
        }
    return rejected, trained


class TooManyRejected(RuntimeError):
    """A run whose share of rejected uploads passed ``max_share``; names the devices."""


class RepeatedRejections(UserWarning):
    """Some devices were rejected ``REPEATED`` times or more in one run: faulty devices, or
    honest ones locked out. An honest device alone in a cluster formed late makes
    updates 10x those of converged clusters; judged against them with a k below that it
    is rejected each round, so its cluster's model never trains and never shrinks them."""


def check_rejections(
    rejected_by_device: list[int], uploads: int, max_share: float, *, what: str, unit: str = "device"
) -> None:
    """Raise :class:`TooManyRejected` when more than ``max_share`` of ``uploads`` were
    rejected, naming the devices (FedCRef: ``unit="client"``) rejected and how often (most first);
    else warn (:class:`RepeatedRejections`) naming those rejected ``REPEATED`` times or more."""
    total = int(sum(rejected_by_device))
    if uploads and total / uploads > max_share:
        raise TooManyRejected(
            f"{what}: {total} of {uploads} uploads rejected ({100 * total / uploads:.1f}% > "
            f"training.max_rejected_share {100 * max_share:g}%): {_most_rejected(rejected_by_device, 1, unit)}"
        )
    if repeated := _most_rejected(rejected_by_device, REPEATED, unit):
        warnings.warn(
            f"{what}: uploads rejected {REPEATED} times or more: {repeated}. Either faulty, or honest and "
            f"locked out: each update judged an outlier against the round's other updates (e.g. alone in a "
            f"cluster formed late), so its model never trains. If none is faulty, raise "
            f"training.outlier_factor or set it to null.",
            RepeatedRejections, stacklevel=2,
        )


def _most_rejected(rejected_by_device: list[int], at_least: int, unit: str) -> str:
    """``"device 3 (5), device 0 (2)"``: devices rejected ``at_least`` times or more, most first."""
    worst = sorted(((n, d) for d, n in enumerate(rejected_by_device) if n >= at_least), reverse=True)
    return ", ".join(f"{unit} {d} ({n})" for n, d in worst)
