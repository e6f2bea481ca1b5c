"""The outlier rule's one-sort leave-one-out medians equal the per-row definition."""

import numpy as np
import pytest
import torch

from clusterfed.engine.robust import accepted, update_norms


def _accepted_row_by_row(norms: torch.Tensor, k: float) -> torch.Tensor:
    finite = torch.isfinite(norms)
    keep = finite.clone()
    values = norms[finite]
    for i, p in enumerate(torch.nonzero(finite).flatten().tolist()):
        others = torch.cat([values[:i], values[i + 1 :]])
        if len(others) and values[i] > k * others.median():  # torch: the lower median
            keep[p] = False
    return keep


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 10, 101])
def test_leave_one_out_median_rule_equals_the_definition(n):
    rng = np.random.default_rng(n)
    for trial in range(20):
        values = rng.choice([0.5, 1.0, 1.0, 2.0, 30.0, 1e3], size=n) * rng.choice([1.0, 1.1], size=n)  # ties
        if trial % 3 == 0:
            values[rng.integers(n)] = np.nan
        norms = torch.as_tensor(values, dtype=torch.float64)
        for k in (1.5, 10.0):
            assert accepted(norms, k).tolist() == _accepted_row_by_row(norms, k).tolist()


def test_update_norms_in_chunks_equal_one_pass():
    g = torch.Generator().manual_seed(0)
    trained = {"w": torch.randn(9, 5, 7, generator=g), "b": torch.randn(9, 3, generator=g)}
    start = {"w": torch.randn(9, 5, 7, generator=g), "b": torch.randn(9, 3, generator=g)}
    trained["w"][4, 0, 0] = float("inf")
    one = update_norms(trained, start, chunk=2**30)
    for chunk in (1, 35, 100):
        assert torch.equal(update_norms(trained, start, chunk=chunk).isnan(), one.isnan())
        assert torch.equal(update_norms(trained, start, chunk=chunk).nan_to_num(), one.nan_to_num())
