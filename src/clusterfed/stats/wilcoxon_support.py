"""The one-sided Wilcoxon signed-rank support test of thesis Alg. 2.

Cluster C2 supports device d of cluster C1 when d's per-sample validation losses
under C2's model are significantly no worse than under its own model, up to a
tolerance ε: ``wilcoxon(l_own + ε, l_other, alternative="greater")`` with p ≤ α
(the authors' code; DESIGN.md §9).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def support_pvalues(
    own_losses: Sequence[np.ndarray] | np.ndarray,
    other_losses: Sequence[np.ndarray] | np.ndarray,
    epsilon: float,
    *,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """p-values of H1: ``own + ε > other`` for many tests; one SciPy call per sample size.

    Test i pairs ``own_losses[i]`` with ``other_losses[i]``: either two sequences of
    1-D arrays, or two ``[T, L]`` arrays whose first ``counts[i]`` entries of row i are
    the samples (the layout of the engine's padded losses, so a caller assembles all
    its tests by indexing, with no loop per test). A test whose differences are all
    zero, or that has no sample, has no evidence either way: p = 1.
    """
    from scipy.stats import wilcoxon  # 1-2 s to import: not on every `clusterfed validate`

    if counts is None:
        own_losses, other_losses, counts = _padded(own_losses, other_losses)
    own = np.asarray(own_losses, dtype=np.float64)
    other = np.asarray(other_losses, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    if own.shape != other.shape or own.ndim != 2 or counts.shape != own.shape[:1]:
        raise ValueError(
            f"own losses {own.shape}, other losses {other.shape} and counts {counts.shape} "
            "must be [T, L], [T, L] and [T]"
        )
    p = np.ones(len(counts))
    for size in np.unique(counts):
        if size <= 0:
            continue
        tests = np.flatnonzero(counts == size)
        diff = own[tests, :size] + epsilon - other[tests, :size]
        nonzero = np.any(diff != 0, axis=1)
        if nonzero.any():
            with np.errstate(all="ignore"):
                res = wilcoxon(diff[nonzero], alternative="greater", axis=1)
            p[tests[nonzero]] = np.nan_to_num(res.pvalue, nan=1.0)
    return p


def _padded(
    own_losses: Sequence[np.ndarray], other_losses: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ragged per-test losses as ``[T, L]`` arrays and their counts."""
    if len(own_losses) != len(other_losses):
        raise ValueError("own_losses and other_losses must hold the same number of tests")
    counts = np.array([len(a) for a in own_losses], dtype=np.int64)
    for i, (a, b) in enumerate(zip(own_losses, other_losses)):
        if len(a) != len(b):
            raise ValueError(f"test {i}: {len(a)} own losses but {len(b)} other losses")
    width = int(counts.max(initial=0))
    own = np.zeros((len(counts), width))
    other = np.zeros((len(counts), width))
    for i, (a, b) in enumerate(zip(own_losses, other_losses)):
        own[i, : len(a)] = a
        other[i, : len(b)] = b
    return own, other, counts


def significant(p: np.ndarray | float, alpha: float) -> np.ndarray:
    """The one decision rule of every support test (FAACL Alg. 2, C-FAACL Alg. 8–9):
    p ≤ α. Alg. 2 rejects support when p > α, so it supports when p ≤ α, as the
    authors' code does; Alg. 8–9 print p < α, which differs only when p equals α
    exactly, and is read as the same test."""
    return np.asarray(p) <= alpha


def supports(
    own_losses: np.ndarray, other_losses: np.ndarray, *, epsilon: float, alpha: float
) -> bool:
    """One device's verdict: the other model is no worse than its own (p ≤ α)."""
    return bool(significant(support_pvalues([own_losses], [other_losses], epsilon)[0], alpha))
