"""The engine's batched proximal, Per-FedAvg and pFedMe local steps equal a
device-by-device reference (one plain nn.Module per pair, same sample order) on
real digits data with devices of different sizes."""

import copy

import numpy as np

import pytest
import torch
from torch.nn import functional as F

from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.local_sgd import (
    PerFedAvgStep, PFedMeStep, QuadraticPenalty, epoch_orders, local_sgd, minibatches, pair_order,
)
from clusterfed.engine.robust import update_norms
from clusterfed.engine.stacked import take
import clusterfed.engine.local_sgd as local_sgd_module
import clusterfed.models as models_module
from clusterfed.models import is_regularized
from clusterfed.engine import sparse_mlp
from clusterfed.scenarios import build_scenario
from clusterfed.scenarios.authors import build_authors_scenario

LR, L2, BATCH, EPOCHS = 0.05, 0.001, 10, 1


def _loss(net, x, y):
    ce = F.cross_entropy(net(x), y)
    return ce + L2 * sum(w.pow(2).sum() for k, w in net.named_parameters() if is_regularized(k))


def _grad(net, x, y) -> dict:
    net.zero_grad()
    _loss(net, x, y).backward()
    return {k: w.grad.detach().clone() for k, w in net.named_parameters()}


def _net(model, state):
    net = copy.deepcopy(model)
    net.load_state_dict({k: v.clone() for k, v in state.items()})
    return net


def reference(model, params, data, devices, *, objective=None, penalty=None, generator):
    """Each pair alone: plain SGD on CE + L2, with the objective's step written out."""
    counts = data.counts[devices]
    orders = []
    for _ in range(EPOCHS):
        first = epoch_orders(counts, data.x.shape[1], generator)
        second = epoch_orders(counts, data.x.shape[1], generator) if isinstance(objective, PerFedAvgStep) else None
        orders.append((first, second))
    out = []
    for p, d in enumerate(devices.tolist()):
        w = {k: v[p].clone() for k, v in params.items()}
        n = int(data.counts[d])
        for first, second in orders:
            for start in range(0, n, BATCH):
                b = first[p, :n][start : start + BATCH]
                x, y = data.x[d, b], data.y[d, b]
                if objective is None:
                    g = _grad(_net(model, w), x, y)
                    new = {k: w[k] - LR * g[k] for k in w}
                elif isinstance(objective, PerFedAvgStep):
                    g = _grad(_net(model, w), x, y)
                    tmp = {k: w[k] - objective.alpha * g[k] for k in w}
                    b2 = second[p, :n][start : start + BATCH]
                    g2 = _grad(_net(model, tmp), data.x[d, b2], data.y[d, b2])
                    new = {k: w[k] - LR * g2[k] for k in w}
                else:
                    theta = {k: v.clone() for k, v in w.items()}
                    for _ in range(objective.K):
                        g = _grad(_net(model, theta), x, y)
                        theta = {
                            k: theta[k] - objective.personal_lr * (g[k] + objective.lam * (theta[k] - w[k]))
                            for k in w
                        }
                    new = {k: w[k] - LR * objective.lam * (w[k] - theta[k]) for k in w}
                if penalty is not None:
                    new = {k: new[k] - LR * penalty.weight[k][p] * (w[k] - penalty.center[k][p]) for k in w}
                w = new
        out.append(w)
    return {k: torch.stack([s[k] for s in out]) for k in out[0]}


@pytest.fixture(scope="module")
def setup(digits):
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)  # devices of two sizes
    engine = Engine(fed, hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")
    params = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    start = take(params, [0, 1, 2, 2, 0, 1])
    return engine, start, torch.arange(6)


@pytest.mark.parametrize(
    "kind",
    ["proximal", "per_fedavg", "pfedme"],
)
def test_batched_local_objective_equals_device_by_device_reference(setup, kind):
    engine, start, devices = setup
    objective = penalty = None
    if kind == "proximal":  # FedProx μ / Ditto λ / FedSoft Σ_s μ u_s: ½ w (θ − c)²
        centre = take(engine.init_params(2, torch.Generator().manual_seed(5), distinct=True), [0, 1, 0, 1, 0, 1])
        weight = {k: torch.full_like(v, 0.3) for k, v in start.items()}
        penalty = QuadraticPenalty(weight=weight, center=centre)
    elif kind == "per_fedavg":
        objective = PerFedAvgStep(alpha=0.02)
    else:
        objective = PFedMeStep(lam=15.0, K=3, personal_lr=0.01)
    batched = local_sgd(
        engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH,
        generator=torch.Generator().manual_seed(7), penalty=penalty, objective=objective,
    )
    ref = reference(
        engine.model, start, engine.data.train, devices, objective=objective, penalty=penalty,
        generator=torch.Generator().manual_seed(7),
    )
    for k in batched:
        torch.testing.assert_close(batched[k], ref[k], rtol=1e-4, atol=1e-5)
    plain = local_sgd(
        engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH,
        generator=torch.Generator().manual_seed(7),
    )
    assert not torch.allclose(batched["output.weight"], plain["output.weight"])  # the objective matters


def test_engine_train_passes_the_objective_through(setup):
    engine, start, devices = setup
    objective = PerFedAvgStep(alpha=0.02)
    local = engine.local_models(start, devices.numpy(), devices.numpy(), torch.Generator().manual_seed(1), objective=objective).params
    direct = local_sgd(
        engine.model, start, engine.data.train, devices, epochs=1, lr=LR, l2=L2, batch_size=BATCH,
        generator=torch.Generator().manual_seed(1), objective=objective,
    )
    for k in local:
        torch.testing.assert_close(local[k], direct[k])


@pytest.mark.parametrize("model_of_pair", [[0, 1, 0, 2, 1, 2], [2, 2, 0, 0, 1, 1], [1, 0, 2, 2, 2, 0]])
def test_penalty_per_model_equals_the_per_pair_reference(setup, model_of_pair):
    """StoCFL's shape: models 0, 1 pulled to ω by λ, model 2 (ω) with weight 0; pairs in any
    order. One row of w and c per model gives the per-pair reference's models, and the
    same floats as handing the engine one (copied) row per pair."""
    engine, _, devices = setup
    models = torch.tensor(model_of_pair)
    params = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    ω = engine.init_params(1, torch.Generator().manual_seed(5), distinct=True)
    weight = {k: torch.cat([torch.full_like(v, 0.3).expand(2, *v.shape[1:]), torch.zeros_like(v)]) for k, v in ω.items()}
    per_model = QuadraticPenalty(weight=weight, center={k: v.expand(3, *v.shape[1:]) for k, v in ω.items()})
    start = take(params, models)
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH)
    batched = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                        penalty=per_model, model_of_pair=models, **kwargs)
    per_pair = QuadraticPenalty(weight=take(weight, models), center=take(per_model.center, models))
    copied = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                       penalty=per_pair, **kwargs)
    ref = reference(engine.model, start, engine.data.train, devices, penalty=per_pair,
                    generator=torch.Generator().manual_seed(7))
    via_engine = engine.local_models(params, np.array(model_of_pair), devices.numpy(),
                                     torch.Generator().manual_seed(7), penalty=per_model).params
    for k in batched:
        torch.testing.assert_close(batched[k], ref[k], rtol=1e-4, atol=1e-5)
        assert torch.equal(batched[k], copied[k])
        assert torch.equal(batched[k], via_engine[k])



def test_a_pull_moves_only_the_pairs_still_training(setup):
    """Model 0's block holds two large devices and a small one, model 1's block two
    small ones: once the small devices are done, a step trains the first two pairs,
    and the pull, cut to them, leaves model 0's third pair and model 1's block alone.
    Same floats as one row a pair, and the reference's models."""
    engine, _, _ = setup
    counts = engine.counts("train")
    devices = torch.tensor([0, 1, 3, 4, 5])
    models = torch.tensor([0, 0, 0, 1, 1])
    assert counts[[0, 1]].min() > 2 * BATCH >= counts[[3, 4, 5]].max()  # the small ones finish first
    assert [b.rows for b in minibatches(engine.data.train.counts[devices], BATCH)][-1] == 2
    params = engine.init_params(2, torch.Generator().manual_seed(0), distinct=True)
    centre = engine.init_params(2, torch.Generator().manual_seed(5), distinct=True)
    a = torch.tensor([0.3, 0.6])
    weight = {k: a.view(-1, *[1] * (v.dim() - 1)).expand_as(v).clone() for k, v in centre.items()}
    per_model = QuadraticPenalty(weight=weight, center=centre)
    per_pair = QuadraticPenalty(weight=take(weight, models), center=take(centre, models))
    start = take(params, models)
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH)
    batched = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                        penalty=per_model, model_of_pair=models, **kwargs)
    copied = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                       penalty=per_pair, **kwargs)
    ref = reference(engine.model, start, engine.data.train, devices, penalty=per_pair,
                    generator=torch.Generator().manual_seed(7))
    for k in batched:
        assert torch.equal(batched[k], copied[k])
        torch.testing.assert_close(batched[k], ref[k], rtol=1e-4, atol=1e-5)

def test_autograd_steps_train_pairs_in_chunks_within_the_activation_budget(digits, monkeypatch):
    """The CNN's autograd step takes every pair at once while their activations fit
    ``AUTOGRAD_BUDGET_BYTES`` and one pair a chunk under a budget of one byte, with the
    same models within float tolerance (Per-FedAvg's full-batch step needed this)."""
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)
    engine = Engine(fed, model="cnn", hidden=32, training=TrainingConfig(lr=LR, l2=L2), device="cpu")
    start = take(engine.init_params(2, torch.Generator().manual_seed(0), distinct=True), [0, 1, 0, 1, 0, 1])
    chunks, real = [], local_sgd_module._train_chunk

    def counted(step_fn, params, *args, **kwargs):
        chunks.append(len(params["output.bias"]))
        real(step_fn, params, *args, **kwargs)

    monkeypatch.setattr(local_sgd_module, "_train_chunk", counted)

    def train():
        return local_sgd(engine.model, start, engine.data.train, torch.arange(6), epochs=1, lr=LR, l2=L2,
                         batch_size=64, generator=torch.Generator().manual_seed(7))

    whole = train()
    assert chunks == [6]
    monkeypatch.setattr(local_sgd_module, "AUTOGRAD_BUDGET_BYTES", 1)
    chunked = train()
    assert chunks == [6, 1, 1, 1, 1, 1, 1]
    for k in whole:
        torch.testing.assert_close(chunked[k], whole[k], rtol=1e-5, atol=1e-6)


def test_pair_order_groups_by_model_only_where_a_model_has_several_pairs():
    counts = torch.tensor([5, 9, 7])
    assert pair_order(None, counts).tolist() == [1, 2, 0]
    assert pair_order(torch.tensor([0, 1, 2]), counts).tolist() == [1, 2, 0]  # one pair a model: by size
    assert pair_order(torch.tensor([0, 1, 0]), counts).tolist() == [2, 0, 1]  # model 0's block first
    assert pair_order(torch.tensor([2, 0, 1]), torch.tensor([9, 7, 5])) is None


def test_a_step_takes_only_the_pairs_still_training_when_they_lead():
    """Pairs by decreasing size: once some run out, a step takes the first ``rows`` (at
    least two); pairs not in that order keep every row, masked."""
    assert [b.rows for b in minibatches(torch.tensor([30, 20, 5, 5]), 10)] == [4, 2, 2]
    assert [b.rows for b in minibatches(torch.tensor([25, 5, 5]), 10)] == [3, 2, 2]
    assert [b.rows for b in minibatches(torch.tensor([5, 30, 30]), 10)] == [3, 3, 3]
    assert [b.rows for b in minibatches(torch.tensor([25]), 10)] == [1, 1, 1]


def test_one_pair_per_model_with_a_scalar_weight_per_row_equals_the_reference(setup):
    """FedSoft's shape: every pair its own model row, pulled by a_k (one scalar a row,
    ``[P, 1, …]``) to its own centre; pairs given smallest first, so ``pair_order``
    reorders them by size. Same floats as a full-size weight, and the reference's models."""
    engine, start, _ = setup
    devices = torch.arange(5, -1, -1)
    assert pair_order(torch.arange(6), engine.data.train.counts[devices]) is not None
    scalar = _own_centres(engine, start)
    full = QuadraticPenalty({k: w.expand_as(start[k]).clone() for k, w in scalar.weight.items()}, scalar.center)
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH)
    batched = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                        penalty=scalar, model_of_pair=torch.arange(6), **kwargs)
    copied = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                       penalty=full, **kwargs)
    ref = reference(engine.model, start, engine.data.train, devices, penalty=full,
                    generator=torch.Generator().manual_seed(7))
    for k in batched:
        assert torch.equal(batched[k], copied[k])
        torch.testing.assert_close(batched[k], ref[k], rtol=1e-4, atol=1e-5)


def _own_centres(engine, start) -> QuadraticPenalty:
    """FedSoft's shape: pair p pulled by its own scalar a_p to its own centre."""
    centre = take(engine.init_params(2, torch.Generator().manual_seed(5), distinct=True), [0, 1, 0, 1, 0, 1])
    a = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    return QuadraticPenalty({k: a.view(-1, *[1] * (v.dim() - 1)) for k, v in start.items()}, centre)


@pytest.mark.parametrize("pulled", [False, True])
def test_mlp_step_in_chunks_equals_one_chunk(setup, monkeypatch, pulled):
    """One model per chunk of the step: with a pull, each chunk's models go to their
    own rows of the centres (a wrong row offset would pull them elsewhere)."""
    engine, start, devices = setup
    penalty = _own_centres(engine, start) if pulled else None
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH, penalty=penalty,
                  model_of_pair=torch.arange(6) if pulled else None)
    whole = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                      **kwargs)
    monkeypatch.setattr(models_module, "ACTIVATION_BUDGET", 1)  # one model per chunk
    chunked = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                        **kwargs)
    for k in whole:
        torch.testing.assert_close(chunked[k], whole[k], rtol=1e-6, atol=1e-7)
    if pulled:
        ref = reference(engine.model, start, engine.data.train, devices, penalty=penalty,
                        generator=torch.Generator().manual_seed(7))
        for k in whole:
            torch.testing.assert_close(chunked[k], ref[k], rtol=1e-4, atol=1e-5)


def test_autograd_step_with_a_pull_equals_the_reference(digits):
    """The CNN (autograd step) pulled to per-pair centres: the reference's models."""
    fed = build_scenario(digits, "A2", group_sizes=[3, 3], seed=3)
    engine = Engine(fed, model="cnn", hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")
    start = take(engine.init_params(2, torch.Generator().manual_seed(0), distinct=True), [0, 1, 0, 1, 0, 1])
    penalty = _own_centres(engine, start)
    devices = torch.arange(6)
    batched = local_sgd(engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2,
                        batch_size=BATCH, generator=torch.Generator().manual_seed(7), penalty=penalty,
                        model_of_pair=torch.arange(6))
    ref = reference(engine.model, start, engine.data.train, devices, penalty=penalty,
                    generator=torch.Generator().manual_seed(7))
    plain = local_sgd(engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2,
                      batch_size=BATCH, generator=torch.Generator().manual_seed(7))
    for k in batched:
        torch.testing.assert_close(batched[k], ref[k], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(batched["output.weight"], plain["output.weight"])


def test_a_penalty_with_a_local_objective_is_refused(setup):
    engine, start, devices = setup
    with pytest.raises(ValueError, match="PerFedAvgStep"):
        local_sgd(engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH,
                  generator=torch.Generator().manual_seed(7), penalty=_own_centres(engine, start),
                  objective=PerFedAvgStep(alpha=0.02))


@pytest.mark.parametrize("kind", ["plain", "proximal", "pfedme"])
def test_chunks_on_worker_threads_equal_chunks_one_after_another_bitwise(setup, monkeypatch, kind):
    """Two pairs per chunk (3 chunks), trained by 1, 2 or 3 worker threads: every pair's
    result is the same floats (chunks share no rows and draw nothing), the reference
    within tolerance, and the caller's thread count is restored."""
    engine, start, devices = setup
    penalty = objective = None
    if kind == "proximal":
        centre = take(engine.init_params(2, torch.Generator().manual_seed(5), distinct=True), [0, 1, 0, 1, 0, 1])
        penalty = QuadraticPenalty(weight={k: torch.full_like(v, 0.3) for k, v in start.items()}, center=centre)
    elif kind == "pfedme":
        objective = PFedMeStep(lam=15.0, K=3, personal_lr=0.01)
    per_pair = sum(v[0].numel() for v in start.values())
    monkeypatch.setattr(local_sgd_module, "CHUNK_FLOATS", 2 * per_pair)
    threads = torch.get_num_threads()
    runs = {
        w: local_sgd(engine.model, start, engine.data.train, devices, epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH,
                     generator=torch.Generator().manual_seed(7), penalty=penalty, objective=objective, workers=w)
        for w in (1, 2, 3)
    }
    assert torch.get_num_threads() == threads
    ref = reference(engine.model, start, engine.data.train, devices, objective=objective, penalty=penalty,
                    generator=torch.Generator().manual_seed(7))
    for k in runs[1]:
        assert torch.equal(runs[2][k], runs[1][k]) and torch.equal(runs[3][k], runs[1][k])
        torch.testing.assert_close(runs[1][k], ref[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("chunk_pairs", [1, 2, 6])
def test_update_norms_taken_in_local_sgd_equal_the_screening_pass(setup, monkeypatch, workers, chunk_pairs):
    """``return_norms``: each chunk's update norms, taken while it is in cache, are the
    figures ``update_norms`` gives over the finished rows, bit for bit, with pairs
    started from model rows (``start_rows``), reordered by model (a penalty) and
    trained in chunks on worker threads; the models are the same as without norms."""
    engine, _, devices = setup
    models = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    start_rows = torch.tensor([0, 1, 2, 2, 0, 1])
    centre = take(engine.init_params(3, torch.Generator().manual_seed(5), distinct=True), [0, 1, 2])
    penalty = QuadraticPenalty(weight={k: torch.full_like(v, 0.3) for k, v in centre.items()}, center=centre)
    per_pair = sum(v[0].numel() for v in models.values())
    monkeypatch.setattr(local_sgd_module, "CHUNK_FLOATS", chunk_pairs * per_pair)
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH, penalty=penalty, model_of_pair=start_rows,
                  start_rows=start_rows, workers=workers)
    trained, norms = local_sgd(engine.model, models, engine.data.train, devices,
                               generator=torch.Generator().manual_seed(7), return_norms=True, **kwargs)
    plain = local_sgd(engine.model, models, engine.data.train, devices, generator=torch.Generator().manual_seed(7), **kwargs)
    assert torch.equal(norms, update_norms(trained, models, rows=start_rows))
    assert bool((norms > 0).all())
    for k in trained:
        assert torch.equal(trained[k], plain[k])


def test_train_reuses_one_upload_buffer_and_averages_what_fresh_uploads_give(setup):
    """``Engine.train`` writes each round's uploads into one buffer kept across rounds
    (grown when a round has more pairs): rounds of 4, 6 and 2 pairs average to exactly
    what ``local_models`` (fresh tensors) and ``aggregate`` give, and the averaged models
    do not alias the buffer (the next round cannot change them)."""
    engine, _, _ = setup
    params = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    kept = []
    for round_, (models, devices) in enumerate([([0, 1, 2, 0], [0, 1, 2, 3]), ([2, 1, 0, 0, 1, 2], [0, 1, 2, 3, 4, 5]),
                                                ([1, 1], [4, 5])]):
        models, devices = np.array(models), np.array(devices)
        trained = engine.train(params, models, devices, torch.Generator().manual_seed(round_))
        uploads = engine.local_models(params, models, devices, torch.Generator().manual_seed(round_))
        expected = engine.aggregate(uploads.params, models, devices, params)
        for k in expected:
            assert torch.equal(trained.params[k], expected[k])
        kept.append(({k: v.clone() for k, v in trained.params.items()}, trained.params))
        params = trained.params
    assert len(next(iter(engine._buffer.values()))) >= 6
    for copy_, live in kept:
        assert all(torch.equal(copy_[k], live[k]) for k in live)


def test_train_keeps_no_upload_buffer_above_its_budget(setup, monkeypatch):
    """Above ``UPLOAD_BUFFER_BYTES`` (e.g. thousands of 2048-unit MLPs) ``train`` writes
    fresh tensors and holds nothing between rounds; the averages are the same."""
    import clusterfed.engine.engine as engine_module

    engine, _, _ = setup
    params = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    models, devices = np.array([0, 1, 2, 0]), np.arange(4)
    kept = engine.train(params, models, devices, torch.Generator().manual_seed(1)).params
    assert engine._buffer
    monkeypatch.setattr(engine_module, "UPLOAD_BUFFER_BYTES", 1)
    fresh = engine.train(params, models, devices, torch.Generator().manual_seed(1)).params
    assert engine._buffer == {}
    assert all(torch.equal(kept[k], fresh[k]) for k in kept)


# ----------------------------------------------------------------- sparse-input kernel
def test_sparse_kernel_equals_device_by_device_reference(setup):
    """``sparse=True`` (engine/sparse_mlp.py) takes the same steps as the reference and
    as the dense kernel, up to float rounding: devices of two sizes, L2 decay on."""
    engine, start, devices = setup
    kwargs = dict(lr=LR, l2=L2, batch_size=BATCH)
    sparse = local_sgd(engine.model, start, engine.data.train, devices, epochs=EPOCHS,
                       generator=torch.Generator().manual_seed(7), sparse=True, **kwargs)
    ref = reference(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7))
    for k in sparse:
        torch.testing.assert_close(sparse[k], ref[k], rtol=1e-4, atol=1e-5)
    two = [local_sgd(engine.model, start, engine.data.train, devices, epochs=2, generator=torch.Generator().manual_seed(7),
                     sparse=s, return_norms=True, **kwargs) for s in (False, True)]
    (dense, dense_norms), (sparse, sparse_norms) = two
    for k in sparse:
        torch.testing.assert_close(sparse[k], dense[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sparse_norms, dense_norms, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("l2", [0.0, L2])
def test_sparse_kernel_touches_first_layer_weights_of_zero_inputs_only_by_decay(setup, l2):
    """A digits pixel that is 0 in every training sample of a device gets no gradient
    there: its column of W1 stays bit for bit without L2 and shrinks by exactly the
    decay of the device's steps with it (W1 = s·V, one factor a step)."""
    engine, start, devices = setup
    data = engine.data.train
    trained = local_sgd(engine.model, start, data, devices, epochs=1, lr=LR, l2=l2, batch_size=BATCH,
                        generator=torch.Generator().manual_seed(7), sparse=True)
    for p, d in enumerate(devices.tolist()):
        n = int(data.counts[d])
        zero = (data.x[d, :n].flatten(1) == 0).all(0)
        assert 0 < int(zero.sum()) < zero.numel()
        before, after = start["hidden.weight"][p][:, zero], trained["hidden.weight"][p][:, zero]
        if l2 == 0.0:
            assert torch.equal(after, before)
        else:
            steps = -(-n // BATCH)
            torch.testing.assert_close(after, before * (1 - 2 * LR * l2) ** steps, rtol=1e-6, atol=0.0)
        assert not torch.equal(trained["hidden.weight"][p][:, ~zero], start["hidden.weight"][p][:, ~zero])


def test_sparse_kernel_on_worker_threads_equals_one_thread_bitwise(setup):
    engine, start, devices = setup
    runs = [local_sgd(engine.model, start, engine.data.train, devices, epochs=1, lr=LR, l2=L2, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(7), sparse=True, workers=w) for w in (1, 2, 3)]
    for other in runs[1:]:
        for k in runs[0]:
            assert torch.equal(other[k], runs[0][k])


def test_sparse_kernel_with_a_uniform_pull_equals_device_by_device_reference(setup, monkeypatch):
    """A pull with one weight per (model, tensor) (FedProx μ, Ditto and StoCFL λ) goes
    through the kernel as W1 = s·(V + a·mᵀ) + t·C: the reference's models; a weight
    that varies within a tensor (EWC's λF) keeps the dense kernel, bit for bit."""
    engine, start, devices = setup
    calls, real = [], sparse_mlp.train_pairs
    monkeypatch.setattr(sparse_mlp, "train_pairs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    centre = take(engine.init_params(2, torch.Generator().manual_seed(5), distinct=True), [0, 1, 0, 1, 0, 1])
    kwargs = dict(epochs=EPOCHS, lr=LR, l2=L2, batch_size=BATCH)
    weights = {"hidden.weight": 0.3, "hidden.bias": 0.0, "output.weight": 0.2, "output.bias": 0.5}
    uniform = QuadraticPenalty(weight={k: torch.full_like(v, weights[k]) for k, v in start.items()}, center=centre)
    sparse = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                       penalty=uniform, sparse=True, **kwargs)
    ref = reference(engine.model, start, engine.data.train, devices, penalty=uniform,
                    generator=torch.Generator().manual_seed(7))
    dense = local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                      penalty=uniform, **kwargs)
    assert len(calls) == 1  # the six pairs are one chunk
    for k in sparse:
        torch.testing.assert_close(sparse[k], ref[k], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sparse[k], dense[k], rtol=1e-5, atol=1e-6)
    varying = QuadraticPenalty(weight={k: torch.rand(v.shape, generator=torch.Generator().manual_seed(3))
                                       for k, v in start.items()}, center=centre)
    runs = [local_sgd(engine.model, start, engine.data.train, devices, generator=torch.Generator().manual_seed(7),
                      penalty=varying, sparse=s, **kwargs) for s in (False, True)]
    assert len(calls) == 1
    for k in runs[0]:
        assert torch.equal(runs[1][k], runs[0][k])


def test_sparse_kernel_pulls_pairs_to_their_models_rows(setup):
    """StoCFL's shape (models 0, 1 pulled to ω by λ, model 2 = ω with weight 0), pairs in
    any order, one row of w and c per model: the dense kernel's models."""
    engine, _, devices = setup
    models = torch.tensor([2, 0, 1, 1, 0, 2])
    params = engine.init_params(3, torch.Generator().manual_seed(0), distinct=True)
    ω = engine.init_params(1, torch.Generator().manual_seed(5), distinct=True)
    weight = {k: torch.cat([torch.full_like(v, 0.3).expand(2, *v.shape[1:]), torch.zeros_like(v)]) for k, v in ω.items()}
    penalty = QuadraticPenalty(weight=weight, center={k: v.expand(3, *v.shape[1:]) for k, v in ω.items()})
    runs = [local_sgd(engine.model, params, engine.data.train, devices, epochs=2, lr=LR, l2=L2, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(7), penalty=penalty, model_of_pair=models,
                      start_rows=models, sparse=s) for s in (False, True)]
    for k in runs[0]:
        torch.testing.assert_close(runs[1][k], runs[0][k], rtol=1e-5, atol=1e-6)


def test_engine_sparse_inputs_is_the_mlps(digits):
    fed = build_scenario(digits, "S1", group_sizes=[2, 2], seed=3)
    with pytest.raises(ValueError, match="training.sparse_inputs"):
        Engine(fed, model="cnn", sparse_inputs=True, device="cpu")


@pytest.mark.mnist
def test_sparse_inputs_engine_round_on_mnist_equals_the_dense_one(mnist):
    """One FedAvg-style round of 4 MNIST devices (a fifth of the pixels non-zero)
    through ``Engine(sparse_inputs=True)``: the dense round's uploads within float
    rounding, and the same test accuracy to 0.1 point."""
    fed = build_scenario(mnist, "S2", group_sizes=[2, 2], seed=3, samples_per_device=300)
    rounds = []
    for sparse in (False, True):
        engine = Engine(fed, training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10, local_epochs=2),
                        device="cpu", sparse_inputs=sparse)
        θ = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
        up = engine.local_models(θ, np.zeros(4, np.int64), np.arange(4), torch.Generator().manual_seed(1)).params
        rounds.append((up, engine.accuracy(up, np.arange(4), "test")))
    (dense, acc_dense), (sparse, acc_sparse) = rounds
    for k in dense:
        torch.testing.assert_close(sparse[k], dense[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(acc_sparse, acc_dense, atol=1e-3)


def test_sparse_kernel_on_standardised_inputs_equals_the_dense_kernel(digits):
    """The authors' construction standardises every pixel, so a zero pixel becomes
    −μ/σ and no input is 0. The kernel writes x = z + m with m each feature's most
    common value (z sparse again) and takes the same steps as the dense kernel."""
    fed = build_authors_scenario(digits, "A2", seed=10)
    engine = Engine(fed, hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")
    data = engine.data.train
    rows = sparse_mlp.sparse_rows(data)
    # 3 of 64 pixels are 0 in every image (σ = 0: they stay 0), so 4.7 % of the inputs are
    # 0; the other 61 features' mode is −μ/σ, and 47 % of the inputs differ from it
    assert float((data.x[data.mask] == 0).float().mean()) == pytest.approx(3 / 64)
    assert int((rows.mode != 0).sum()) == 61 and rows.samples == 673
    assert rows.density == pytest.approx(0.4731, abs=1e-4)
    start = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    devices = torch.arange(engine.n_devices)
    runs = [local_sgd(engine.model, start, data, devices, epochs=2, lr=LR, l2=L2, batch_size=BATCH,
                      generator=torch.Generator().manual_seed(7), start_rows=torch.zeros_like(devices), sparse=s)
            for s in (False, True)]
    for k in runs[0]:
        torch.testing.assert_close(runs[1][k], runs[0][k], rtol=1e-4, atol=1e-5)
