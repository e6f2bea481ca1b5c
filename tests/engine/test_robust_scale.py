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


def test_update_norms_from_model_rows_equal_the_per_pair_copy():
    """``rows=``: the pairs' start rows are taken from the models chunk by chunk, with
    the same norms as a materialised per-pair copy of the starts."""
    g = torch.Generator().manual_seed(1)
    models = {"w": torch.randn(3, 5, 7, generator=g), "b": torch.randn(3, 4, generator=g)}
    rows = torch.tensor([2, 0, 0, 1, 2, 2, 1])
    trained = {k: v.index_select(0, rows) + 0.1 * torch.randn(len(rows), *v.shape[1:], generator=g)
               for k, v in models.items()}
    copied = {k: v.index_select(0, rows) for k, v in models.items()}
    for chunk in (1, 35, 2**30):
        assert torch.equal(update_norms(trained, models, rows=rows, chunk=chunk), update_norms(trained, copied, chunk=chunk))


def test_update_norms_of_huge_finite_rows_are_finite_and_exact():
    """A finite row whose float32 sum of squares overflows (1e30 per entry) is summed
    again in float64: its norm is finite, so the outlier rule, not the finite check,
    judges it; a row with inf stays NaN."""
    trained = {"w": torch.stack([torch.full((6,), 1e30), torch.ones(6), torch.tensor([1.0, float("inf"), 0, 0, 0, 0])])}
    norms = update_norms(trained)
    assert norms[0].item() == pytest.approx(1e30 * 6**0.5, rel=1e-6)
    assert norms[1].item() == pytest.approx(6**0.5, rel=1e-7)
    assert bool(norms[2].isnan())
