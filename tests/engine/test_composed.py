"""The composed-model kernel's pieces on real digits: the MLP's analytic gradient
(with and without dropout) equals autograd, the autograd fallback equals it, and a
CNN trains through ``composed_sgd`` as through ``local_sgd``."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.composed import Identity, _autograd_gradients, dropout_masks
from clusterfed.models import MLP, is_regularized
from clusterfed.scenarios import build_scenario

L2 = 0.003


@pytest.fixture(scope="module")
def engine(digits):
    fed = build_scenario(digits, "A2", group_sizes=[2, 2], seed=3)
    return Engine(fed, hidden=32, training=TrainingConfig(lr=0.05, l2=L2, batch_size=10), device="cpu")


def _batch(engine):
    """One batch of 10 per model, the last model with 4 valid samples (a partial batch)."""
    data = engine.data.train
    x, y = data.x[:4, :10], data.y[:4, :10]
    weight = torch.full((4, 10), 0.1)
    weight[3] = torch.tensor([0.25] * 4 + [0.0] * 6)
    return x, y, weight


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_mlp_analytic_gradient_equals_autograd(engine, dropout):
    params = engine.init_params(4, torch.Generator().manual_seed(0), distinct=True)
    x, y, weight = _batch(engine)
    masks = dropout_masks((4, 10, 32), dropout, torch.Generator().manual_seed(1)) if dropout else None
    got = MLP.stacked_gradients(params, x, y, weight, l2=L2, dropout=masks)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    logits = MLP.stacked_forward(leaves, x, shared_input=False, dropout=None if masks is None else (lambda h: h * masks))
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
    loss = (ce * weight).sum() + L2 * sum(v.pow(2).sum() for k, v in leaves.items() if is_regularized(k))
    want = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)
    fallback = _autograd_gradients(engine.model)(params, x, y, weight, l2=L2, dropout=masks)
    for k in want:  # architectures without an analytic gradient get the same by autograd on θ
        torch.testing.assert_close(fallback[k], want[k], rtol=1e-5, atol=1e-6)


def test_cnn_trains_through_the_composed_kernel_as_through_local_sgd(digits):
    """No analytic gradient (CNN): θ = φ through ``composed_sgd`` is ``local_sgd``'s autograd step."""
    fed = build_scenario(digits, "A2", group_sizes=[2, 2], seed=3)
    engine = Engine(fed, model="cnn", conv_channels=(4, 6), hidden=16,
                    training=TrainingConfig(lr=0.05, l2=L2, batch_size=10), device="cpu")
    params = engine.init_params(4, torch.Generator().manual_seed(2), distinct=True)
    plain = engine.local_models(params, np.arange(4), np.arange(4), torch.Generator().manual_seed(3)).params
    composed = engine.local_composed(params, Identity(), np.arange(4), torch.Generator().manual_seed(3)).params
    for k in params:
        torch.testing.assert_close(composed[k], plain[k], rtol=1e-4, atol=1e-5)


class _RecordingIdentity(Identity):
    """θ = φ, recording how many pairs each step composes."""

    def __init__(self):
        self.rows: list[int] = []

    def compose(self, variables):
        self.rows.append(next(iter(variables.values())).shape[0])
        return variables


def test_a_step_composes_only_the_pairs_with_samples_left(engine):
    """Pairs train by decreasing size, so once the smaller ones run out a step composes
    and trains only the first ``Minibatch.rows`` (as ``local_sgd``), with the same
    result as every pair alone (the reference tests in tests/continual)."""
    from clusterfed.engine.composed import composed_sgd
    from clusterfed.engine.local_sgd import minibatches

    data = engine.data.train
    counts = data.counts[:4].sort(descending=True).values
    assert len(set(counts.tolist())) > 1  # A2's devices differ in size
    params = engine.init_params(4, torch.Generator().manual_seed(0), distinct=True)
    recording = _RecordingIdentity()
    composed_sgd(engine.model, params, recording, data, torch.arange(4), epochs=2, lr=0.05, l2=L2, batch_size=10,
                 generator=torch.Generator().manual_seed(1))
    per_epoch = [b.rows for b in minibatches(counts, 10)]
    assert recording.rows == per_epoch * 2
    assert per_epoch[0] == 4 and per_epoch[-1] < 4  # the last steps leave finished pairs out


class _SharedRecording(_RecordingIdentity):
    """A recording composition that declares a shared operand of ``floats``."""

    def __init__(self, floats: int):
        super().__init__()
        self.shared_floats = floats

    def take(self, rows):
        return self


@pytest.mark.parametrize("shared_pairs", [0, 2, 4])
def test_a_shared_operand_makes_chunks_as_large_as_it_weighs(engine, monkeypatch, shared_pairs):
    """With chunks of one pair's variables, a composition whose shared operand (FedWeIT's
    knowledge base) weighs k pairs trains k pairs a chunk, so each step reads it once
    for k pairs; the trained variables are the same (to float rounding) either way."""
    from clusterfed.engine import composed

    params = engine.init_params(4, torch.Generator().manual_seed(0), distinct=True)
    per_pair = sum(v[0].numel() for v in params.values())
    monkeypatch.setattr(composed, "CHUNK_FLOATS", per_pair)
    size = max(1, shared_pairs)
    assert composed.chunk_pairs(per_pair, shared_pairs * per_pair) == size
    recording = _SharedRecording(shared_pairs * per_pair)
    out = composed.composed_sgd(engine.model, params, recording, engine.data.train, torch.arange(4), epochs=1,
                                lr=0.05, l2=L2, batch_size=10, generator=torch.Generator().manual_seed(1))
    counts = engine.data.train.counts[:4].sort(descending=True).values  # pairs train largest first
    chunks = [counts[i:i + size] for i in range(0, 4, size)]
    assert recording.rows == [b.rows for chunk in chunks for b in composed.minibatches(chunk, 10)]
    alone = composed.composed_sgd(engine.model, params, Identity(), engine.data.train, torch.arange(4), epochs=1,
                                  lr=0.05, l2=L2, batch_size=10, generator=torch.Generator().manual_seed(1))
    for k in params:
        torch.testing.assert_close(out[k], alone[k], rtol=1e-5, atol=1e-6)
