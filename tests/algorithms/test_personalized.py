"""Ditto, Per-FedAvg, pFedMe and LG-FedAvg on real digits data: each device ends
with its own model, only the shared part travels, and on S2 (labels permuted per
group, which no single model fits) personalisation beats FedAvg."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from clusterfed.algorithms import FedAvg
from clusterfed.algorithms.base import model_bytes
from clusterfed.algorithms.fedprox import proximal_penalty
from clusterfed.algorithms.personalized import Ditto, LGFedAvg, PerFedAvg, PFedMe
from clusterfed.algorithms.protocol import Context
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.models import is_regularized
from clusterfed.scenarios import build_scenario


@pytest.fixture(scope="module")
def s2(digits):
    fed = build_scenario(digits, "S2", group_sizes=[4, 4, 4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    return engine, FedAvg(rounds=20).fit(engine, seed=1)


def test_ditto_personal_models_fit_the_permuted_labels(s2):
    engine, fedavg = s2
    result = Ditto(lam=0.1, rounds=20).fit(engine, seed=1)
    assert result.n_clusters == 12 and result.params["output.bias"].shape[0] == 12
    assert result.device_accuracy.mean() > fedavg.device_accuracy.mean() + 0.4
    assert [h["bytes_up"] for h in result.history] == [h["bytes_up"] for h in fedavg.history]


def test_ditto_writes_the_participants_personal_models_into_the_one_copy(s2):
    """One set of N personal models, updated in place and served as it is (a copy is
    7.8 GB at StoCFL's N = 1200 with its 784-2048-10 MLP): the participants' rows are
    Alg. 1's v_k, every other row is unchanged."""
    engine, _ = s2
    algo = Ditto(lam=0.1, rounds=1)
    ctx = Context(rng=np.random.default_rng(0), generator=torch.Generator().manual_seed(3))
    state = algo.init(engine, ctx)
    before = {k: v.clone() for k, v in state.personal.items()}
    storage = {k: v.data_ptr() for k, v in state.personal.items()}
    participants = np.array([0, 5, 7])
    replay = torch.Generator()
    replay.set_state(ctx.generator.get_state())
    w = {k: v.expand(engine.n_devices, *v.shape[1:]) for k, v in state.w.items()}
    expected = engine.local_models(before, participants, participants, replay, penalty=proximal_penalty(w, 0.1)).params
    state, _ = algo.configure_round(engine, state, participants, ctx)
    others = np.setdiff1d(np.arange(engine.n_devices), participants)
    for k, v in state.personal.items():
        assert v.data_ptr() == storage[k]
        assert torch.equal(v[participants], expected[k]) and torch.equal(v[others], before[k][others])
    assert all(v.data_ptr() == storage[k] for k, v in algo.clustering(state).params.items())


def test_lgfedavg_shares_only_the_final_layer(s2):
    engine, fedavg = s2
    result = LGFedAvg(rounds=20).fit(engine, seed=1)
    p = result.params
    assert (p["output.weight"] == p["output.weight"][:1]).all() and (p["output.bias"] == p["output.bias"][:1]).all()
    assert not (p["hidden.weight"] == p["hidden.weight"][:1]).all()
    head = model_bytes({k: p[k] for k in ("output.weight", "output.bias")})
    assert all(h["bytes_up"] == h["bytes_down"] == 12 * head for h in result.history)
    assert result.device_accuracy.mean() > fedavg.device_accuracy.mean() + 0.4


def test_perfedavg_personalises_by_one_full_batch_gradient_step(s2):
    engine, _ = s2
    algo = PerFedAvg(alpha=0.05, rounds=2)
    result = algo.fit(engine, seed=1)
    assert result.n_clusters == 12
    w = engine.init_params(1, torch.Generator().manual_seed(4), distinct=False)
    theta = algo.personalize(engine, w, torch.Generator())
    d = 5  # reference: θ = w − α ∇(CE + l2‖W‖²) on all of device d's training data
    n = int(engine.data.train.counts[d])
    net = engine.model
    leaves = {k: v[0].clone().requires_grad_(True) for k, v in w.items()}
    logits = torch.func.functional_call(net, leaves, (engine.data.train.x[d, :n],))
    loss = F.cross_entropy(logits, engine.data.train.y[d, :n])
    loss = loss + engine.training.l2 * sum(v.pow(2).sum() for k, v in leaves.items() if is_regularized(k))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for (k, v), g in zip(leaves.items(), grads):
        torch.testing.assert_close(theta[k][d], (v - 0.05 * g).detach(), rtol=1e-4, atol=1e-6)


def test_pfedme_mixes_with_beta_and_serves_personalised_models(s2):
    engine, fedavg = s2
    result = PFedMe(lam=15.0, K=3, personal_lr=0.05, rounds=3).fit(engine, seed=1)
    assert result.n_clusters == 12
    assert not torch.equal(result.params["output.bias"][0], result.params["output.bias"][4])
    assert [h["bytes_up"] for h in result.history] == [h["bytes_up"] for h in fedavg.history[:3]]
    with pytest.raises(ValueError, match="PFedMe.beta"):
        PFedMe(beta=0.0)


def test_pfedme_personalises_by_k_proximal_steps_on_a_batch(s2):
    engine, _ = s2
    algo = PFedMe(lam=15.0, K=3, personal_lr=0.02, rounds=1)
    w = engine.init_params(1, torch.Generator().manual_seed(4), distinct=False)
    theta = algo.personalize(engine, w, torch.Generator())
    d, B = 7, engine.training.batch_size
    x, y = engine.data.train.x[d, :B], engine.data.train.y[d, :B]
    ref = {k: v[0].clone() for k, v in w.items()}
    for _ in range(3):  # θ ← θ − η(∇(CE + l2‖W‖²) + λ(θ − w)) on the same batch
        leaves = {k: v.clone().requires_grad_(True) for k, v in ref.items()}
        loss = F.cross_entropy(torch.func.functional_call(engine.model, leaves, (x,)), y)
        loss = loss + engine.training.l2 * sum(v.pow(2).sum() for k, v in leaves.items() if is_regularized(k))
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        ref = {k: (v - 0.02 * (grads[k] + 15.0 * (v - w[k][0]))).detach() for k, v in ref.items()}
    for k in ref:
        torch.testing.assert_close(theta[k][d], ref[k], rtol=1e-4, atol=1e-6)


def test_pfedme_eta_replaces_the_engine_rate_of_the_local_step(s2):
    engine, _ = s2
    own = PFedMe(lam=15.0, K=2, personal_lr=0.05, eta=0.01, rounds=2).fit(engine, seed=1)
    default = PFedMe(lam=15.0, K=2, personal_lr=0.05, rounds=2).fit(engine, seed=1)
    assert [h["accuracy"] for h in own.history] != [h["accuracy"] for h in default.history]
    assert PFedMe().eta is None
