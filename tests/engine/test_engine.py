"""The batched engine equals a device-by-device reference on real digits data."""

import copy

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.aggregation import weighted_average
from clusterfed.engine.local_sgd import autograd_sgd_step, epoch_orders, local_sgd
from clusterfed.engine.stacked import take
from clusterfed.models import build_model, is_regularized
from clusterfed.scenarios import build_scenario

LR, L2, BATCH = 0.05, 0.001, 10


def sequential_local_sgd(model, params, data, device_of_pair, *, epochs, generator):
    """Reference: each pair alone, one plain nn.Module at a time, same sample order."""
    counts = data.counts[device_of_pair]
    states = []
    orders = [epoch_orders(counts, data.x.shape[1], generator) for _ in range(epochs)]
    for p, d in enumerate(device_of_pair.tolist()):
        net = copy.deepcopy(model)  # same architecture and shape as the engine's module
        net.load_state_dict({k: v[p] for k, v in params.items()})
        n = int(data.counts[d])
        for order in orders:
            idx = order[p, :n]
            for start in range(0, n, BATCH):
                b = idx[start : start + BATCH]
                loss = F.cross_entropy(net(data.x[d, b]), data.y[d, b])
                loss = loss + L2 * sum(w.pow(2).sum() for k, w in net.named_parameters() if is_regularized(k))
                net.zero_grad()
                loss.backward()
                with torch.no_grad():
                    for w in net.parameters():
                        w -= LR * w.grad
        states.append({k: v.detach() for k, v in net.state_dict().items()})
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


@pytest.fixture(scope="module")
def a2_engine(digits):
    # A2 gives devices of very different sizes: masking of finished devices matters.
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)
    assert len({d.n_train for d in fed.devices}) == 2
    return Engine(fed, hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")


@pytest.mark.parametrize(
    "architecture, shape",
    [("mlp", {}), ("cnn", {}), ("cnn", {"conv_channels": (4, 6), "kernel_size": 5})],
    ids=["mlp", "cnn", "cnn-5x5"],
)
def test_batched_local_sgd_equals_device_by_device_reference(digits, architecture, shape):
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)
    engine = Engine(
        fed, model=architecture, hidden=32, training=TrainingConfig(lr=LR, l2=L2), device="cpu", **shape
    )
    params = engine.init_params(4, torch.Generator().manual_seed(0), distinct=True)
    start = take(params, [0, 1, 2, 3, 3, 0])  # pairs: models reused across devices
    devices = torch.arange(6)
    batched = local_sgd(
        engine.model, start, engine.data.train, devices,
        epochs=2, lr=LR, l2=L2, batch_size=BATCH, generator=torch.Generator().manual_seed(7),
    )
    reference = sequential_local_sgd(
        engine.model, start, engine.data.train, devices, epochs=2, generator=torch.Generator().manual_seed(7)
    )
    for k in batched:
        torch.testing.assert_close(batched[k], reference[k], rtol=1e-4, atol=1e-5)
    assert not torch.equal(batched["output.bias"], start["output.bias"])  # it did train


def test_analytic_mlp_step_equals_autograd_step(a2_engine):
    params = a2_engine.init_params(3, torch.Generator().manual_seed(1), distinct=True)
    x = a2_engine.data.train.x[:3, :BATCH]
    y = a2_engine.data.train.y[:3, :BATCH]
    weight = torch.full((3, BATCH), 1.0 / BATCH)
    weight[2] = 0.0  # a finished device: must stay untouched
    analytic = {k: v.clone() for k, v in params.items()}
    autograd = {k: v.clone() for k, v in params.items()}
    type(a2_engine.model).stacked_sgd_step(analytic, x, y, weight, lr=LR, l2=L2)
    autograd_sgd_step(a2_engine.model, autograd, x, y, weight, lr=LR, l2=L2)
    for k in params:
        torch.testing.assert_close(analytic[k], autograd[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(analytic[k][2], params[k][2])


def test_weighted_average_is_sample_weighted_and_keeps_untrained_models():
    previous = {"w": torch.tensor([[0.0], [5.0], [9.0]])}
    trained = {"w": torch.tensor([[1.0], [4.0], [10.0]])}
    out = weighted_average(trained, torch.tensor([0, 0, 1]), torch.tensor([1.0, 3.0, 2.0]), previous)
    torch.testing.assert_close(out["w"], torch.tensor([[3.25], [10.0], [9.0]]))
    assert previous["w"][0, 0] == 0.0  # inputs are not mutated


def test_losses_and_accuracy_match_per_model_forward(a2_engine):
    params = a2_engine.init_params(2, torch.Generator().manual_seed(2), distinct=True)
    losses = a2_engine.losses(params, "val")
    val = a2_engine.data.val
    for m in range(2):
        net = build_model("mlp", (1, 8, 8), 10, hidden=32)
        net.load_state_dict({k: v[m] for k, v in params.items()})
        for d in range(a2_engine.n_devices):
            n = int(val.counts[d])
            expected = F.cross_entropy(net(val.x[d, :n]), val.y[d, :n], reduction="none")
            torch.testing.assert_close(losses[m, d, :n], expected, rtol=1e-5, atol=1e-6)
    acc = a2_engine.accuracy(params, np.array([1, 0, 1, 0, 1, 0]), "test")
    net = build_model("mlp", (1, 8, 8), 10, hidden=32)
    net.load_state_dict({k: v[1] for k, v in params.items()})
    test = a2_engine.data.test
    n = int(test.counts[0])
    assert acc[0] == pytest.approx((net(test.x[0, :n]).argmax(1) == test.y[0, :n]).float().mean().item())


def test_zero_one_losses_are_the_errors_of_every_model_on_every_device(a2_engine):
    params = a2_engine.init_params(3, torch.Generator().manual_seed(4), distinct=True)
    errors = a2_engine.mean_losses(params, "test", measure="zero_one")
    for m in range(3):
        own = a2_engine.accuracy(params, np.full(a2_engine.n_devices, m), "test")
        np.testing.assert_array_equal(errors[m].numpy(), (1 - torch.as_tensor(own)).numpy())
    assert 0 < errors.mean() < 1  # untrained models: some right, most wrong
    with pytest.raises(ValueError, match="measure: expected one of"):
        a2_engine.losses(params, "test", measure="hinge")


def _one_chunk_losses(model, params, data):
    """The engine's evaluation before issue 17: every model on every padded sample, one
    shared-input forward per 8192 samples."""
    from clusterfed.engine.stacked import n_models, stacked_forward

    x, y = data.x.flatten(0, 1), data.y.flatten()
    out = []
    for s in range(0, len(y), 8192):
        logits = stacked_forward(model, params, x[s : s + 8192], shared_input=True)
        out.append(F.cross_entropy(logits.flatten(0, 1), y[s : s + 8192].repeat(len(logits)), reduction="none"))
    return torch.cat(out).view(n_models(params), *data.y.shape)


@pytest.mark.parametrize("architecture", ["mlp", "cnn"])
@pytest.mark.parametrize("max_rows", [None, 7, 192, 700, 3000])
def test_losses_of_some_models_on_some_devices_equal_the_full_evaluation_exactly(digits, architecture, max_rows):
    from clusterfed.engine.evaluation import all_pairs_losses

    fed = build_scenario(digits, "A2", group_sizes=[5, 5], seed=3)  # devices of two sizes: padding
    engine = Engine(fed, model=architecture, device="cpu")
    params = engine.init_params(10, torch.Generator().manual_seed(0), distinct=True)
    val = engine.data.val
    full = _one_chunk_losses(engine.model, params, val)
    rows, devices = [1, 4, 7], np.array([0, 2, 3, 9])
    for r, d in [(list(range(10)), np.arange(10)), (rows, devices)]:
        if max_rows is None:  # the engine's own chunking (eval_rows)
            out = engine.losses(take(params, r), "val", devices=d)
        else:
            out = all_pairs_losses(
                engine.model, take(params, r), val, devices=torch.as_tensor(d), max_rows=max_rows
            )
        mask = val.mask[d]
        assert out.shape == (len(r), len(d), val.y.shape[1])
        assert torch.equal(out[:, mask], full[r][:, d][:, mask])  # bit for bit on the pairs computed
        assert not out[:, ~mask].any()  # padding is 0


def test_non_finite_updates_are_rejected_and_counted(digits):
    fed = build_scenario(digits, "S0", group_sizes=[4], seed=0)
    engine = Engine(fed, hidden=32, training=TrainingConfig(lr=LR), device="cpu")
    params = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    engine.data.train.x[2, 0] = float("nan")  # device 2 holds a corrupt sample
    out = engine.train(params, np.zeros(4, dtype=int), np.arange(4), torch.Generator().manual_seed(0))
    assert out.rejected.tolist() == [2]  # the round returns what it rejected
    assert all(torch.isfinite(v).all() for v in out.params.values())


def test_own_model_evaluation_in_device_chunks_equals_one_forward(a2_engine):
    from clusterfed.engine.evaluation import own_model_logits

    params = a2_engine.init_params(3, torch.Generator().manual_seed(5), distinct=True)
    rows = torch.tensor([2, 0, 1, 1, 0, 2])
    test = a2_engine.data.test
    one = own_model_logits(a2_engine.model, params, rows, test, budget=2**40)
    for budget in (1, 300_000):  # one device per forward; two or three
        assert torch.equal(own_model_logits(a2_engine.model, params, rows, test, budget=budget), one)
