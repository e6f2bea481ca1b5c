"""FedWeIT, FedProx-APD and FedProx-SSGD (thesis Tables 4.1–4.4 baselines) on digits:
the batched composed-parameter path equals a per-device reference, FedWeIT's masks,
sparse uploads and knowledge base on constructed weights, APD's decomposition and
drift term, and bit-identical resumption."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from clusterfed.continual import FedProxAPD, FedProxSSGD, FedWeIT
from clusterfed.continual.decomposed import AdditiveComposition, Decomposed, compose
from clusterfed.continual.fedweit import aggregate_bases, sent_units
from clusterfed.continual.ssgd import Proximal
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.composed import composed_sgd, dropout_masks
from clusterfed.engine.local_sgd import epoch_orders
from clusterfed.models import is_regularized
from clusterfed.scenarios import build_scenario, federation_from_concepts

LR, L2, BATCH = 0.05, 0.001, 10
KW = dict(n_concepts=2, samples_per_device=120, test_samples_per_device=30)


def _engine(digits, concepts, seed):
    fed = federation_from_concepts(digits, "S2", np.asarray(concepts), seed=seed, **KW)
    return Engine(fed, hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")


def _rows(tree, p):
    return {k: v[p : p + 1] for k, v in tree.items()}


def reference_composed_sgd(variables, make_objective, data, devices, *, epochs, generator, dropout=0.0, hidden=32,
                           adam=False):
    """Each pair alone, with its own slice of the objective, an explicit MLP forward and
    the batched run's sample orders and dropout masks (drawn in the same sequence);
    ``adam``: the textbook Adam step (Keras' β, ε) from zero moments instead of SGD."""
    counts = data.counts[devices]
    n_steps = math.ceil(int(counts.max()) / BATCH)
    draws = []
    for _ in range(epochs):
        order = epoch_orders(counts, data.x.shape[1], generator)
        masks = [dropout_masks((len(devices), BATCH, hidden), dropout, generator) if dropout else None for _ in range(n_steps)]
        draws.append((order, masks))
    out = []
    for p, d in enumerate(devices.tolist()):
        phi = {k: v.detach().clone() for k, v in _rows(variables, p).items()}
        moments = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in phi.items()}
        t = 0  # the device's Adam steps so far
        objective = make_objective(p)
        n = int(data.counts[d])
        for order, masks in draws:
            for s, start in enumerate(range(0, n, BATCH)):
                b = order[p, :n][start : start + BATCH]
                leaves = {k: v.detach().requires_grad_(True) for k, v in phi.items()}
                theta = {k: v[0] for k, v in objective.compose(leaves).items()}
                h = torch.relu(data.x[d, b].flatten(1) @ theta["hidden.weight"].T + theta["hidden.bias"])
                if dropout:
                    h = h * masks[s][p, : len(b)]
                logits = h @ theta["output.weight"].T + theta["output.bias"]
                loss = F.cross_entropy(logits, data.y[d, b])
                loss = loss + L2 * sum(w.pow(2).sum() for k, w in theta.items() if is_regularized(k))
                penalty = objective.penalty(leaves)
                loss = loss + (0 if penalty is None else penalty.sum())
                grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
                t += 1
                with torch.no_grad():
                    for (k, v), g in zip(phi.items(), grads):
                        if adam:
                            g = torch.zeros_like(v) if g is None else g
                            m1, m2 = moments[k]
                            m1.mul_(0.9).add_(0.1 * g)
                            m2.mul_(0.999).add_(0.001 * g * g)
                            v -= LR * (m1 / (1 - 0.9**t)) / ((m2 / (1 - 0.999**t)).sqrt() + 1e-7)
                        elif g is not None:
                            v -= LR * g
        out.append(phi)
    return {k: torch.cat([o[k] for o in out]) for k in out[0]}


@pytest.fixture(scope="module")
def a2(digits):
    """A2: devices of very different sizes, so the masking of finished devices matters."""
    fed = build_scenario(digits, "A2", group_sizes=[2, 2], seed=3)
    return Engine(fed, hidden=32, training=TrainingConfig(lr=LR, l2=L2, batch_size=BATCH), device="cpu")


def _decomposed(engine, n, seed=0, head="shared", retroactive=False):
    """A decomposition with a non-trivial knowledge base, drift weights and anchor: task 1,
    or with retroactive past tasks task 2, so two past A_i train and B has moved off
    task 0's targets."""
    g = torch.Generator().manual_seed(seed)
    parts = Decomposed.start(engine.init_params(n, g, distinct=True), knowledge=n, head=head)
    for _ in range(2 if retroactive else 1):
        parts = parts.with_variables({k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in parts.variables().items()})
        parts = parts.new_task(parts.pruned_adaptive(1e-3), retroactive=retroactive)
    if retroactive:  # B and the past A_i away from their targets
        parts = parts.with_variables({k: v + 0.1 * torch.randn(v.shape, generator=g) if k.split("/")[0] in ("base", "past")
                                      else v for k, v in parts.variables().items()})
    return parts


def _variant(method):
    """``fedweit_per_task_head`` → ("fedweit", head, retroactive)."""
    head = "per_task" if "_per_task_head" in method else "shared"
    return method.split("_")[0], head, method.endswith("_retroactive")


@pytest.mark.parametrize("method", ["fedweit", "apd", "ssgd", "fedweit_per_task_head", "fedweit_retroactive",
                                    "apd_retroactive"])
def test_batched_composed_round_equals_per_device_reference(a2, method, monkeypatch):
    devices = torch.arange(4)
    data = a2.data.train
    if method == "ssgd":
        theta = a2.init_params(1, torch.Generator().manual_seed(1), distinct=False)
        variables = {k: v.expand(4, *v.shape[1:]).clone() for k, v in theta.items()}
        center = {k: v + 0.1 for k, v in variables.items()}
        objective, make = Proximal(0.3, center), lambda p: Proximal(0.3, _rows(center, p))
        dropout = 0.5
    else:
        method, head, retroactive = _variant(method)
        parts = _decomposed(a2, 4, head=head, retroactive=retroactive)
        knowledge = parts.knowledge if method == "fedweit" else {}
        variables = parts.variables() if method == "fedweit" else {
            k: v for k, v in parts.variables().items() if not k.startswith("attention/")
        }
        center = {k: v + 0.05 for k, v in parts.base.items()} if method == "apd" else None
        mu = 0.2 if method == "apd" else 0.0

        def make(p):
            return AdditiveComposition(
                knowledge, _rows(parts.anchor, p), _rows(parts.retro, p), 0.01, 5.0, mu,
                None if center is None else _rows(center, p), _rows(parts.past_mask, p), _rows(parts.past_target, p),
            )

        objective = AdditiveComposition(knowledge, parts.anchor, parts.retro, 0.01, 5.0, mu, center,
                                        parts.past_mask, parts.past_target)
        dropout = 0.0
    kw = dict(epochs=1, generator=torch.Generator().manual_seed(7), dropout=dropout)
    batched = composed_sgd(a2.model, variables, objective, data, devices, lr=LR, l2=L2, batch_size=BATCH, **kw)
    kw["generator"] = torch.Generator().manual_seed(7)
    reference = reference_composed_sgd(variables, make, data, devices, **kw)
    for k in variables:
        torch.testing.assert_close(batched[k], reference[k], rtol=1e-4, atol=1e-5)
        assert not torch.equal(batched[k], variables[k]) or k.startswith("attention/")  # it trained
    monkeypatch.setattr("clusterfed.engine.composed.CHUNK_FLOATS", 1)  # one pair per chunk, largest first
    kw["generator"] = torch.Generator().manual_seed(7)
    chunked = composed_sgd(a2.model, variables, objective, data, devices, lr=LR, l2=L2, batch_size=BATCH, **kw)
    for k in variables:
        torch.testing.assert_close(chunked[k], batched[k], rtol=1e-5, atol=1e-6)
    via_engine = a2.local_composed(variables, objective, np.arange(4), torch.Generator().manual_seed(7), dropout=dropout)
    assert via_engine.n_rejected == 0
    for k in variables:  # the engine's public entry point runs the same loop (1 epoch: its config)
        assert via_engine.params[k].shape == variables[k].shape and bool(torch.isfinite(via_engine.params[k]).all())


@pytest.mark.parametrize("method", ["fedweit", "apd", "ssgd", "apd_per_task_head", "fedweit_retroactive",
                                    "apd_retroactive"])
def test_closed_form_gradients_are_the_chain_rule_through_compose_and_penalty(a2, method):
    """What the engine steps along (``gradients``) is autograd of ⟨compose(φ), G⟩ + penalty(φ)."""
    g = torch.Generator().manual_seed(5)
    if method == "ssgd":
        variables = a2.init_params(3, g, distinct=True)
        objective = Proximal(0.3, {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in variables.items()})
    else:
        method, head, retroactive = _variant(method)
        parts = _decomposed(a2, 3, seed=1, head=head, retroactive=retroactive)
        variables = parts.variables()
        center = {k: v + 0.05 for k, v in parts.base.items()}
        objective = AdditiveComposition(parts.knowledge if method == "fedweit" else {}, parts.anchor, parts.retro,
                                        0.01, 5.0, 0.2 if method == "apd" else 0.0, center,
                                        parts.past_mask, parts.past_target)
    shapes = {k: v.shape for k, v in objective.compose(variables).items()}
    theta_grad = {k: torch.randn(shape, generator=g) for k, shape in shapes.items()}
    leaves = {k: v.clone().requires_grad_(True) for k, v in variables.items()}
    loss = sum((t * theta_grad[k]).sum() for k, t in objective.compose(leaves).items()) + objective.penalty(leaves).sum()
    want = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)))
    got = objective.gradients(variables, {k: v.clone() for k, v in theta_grad.items()})
    for k, w in want.items():
        if w is None:
            assert k not in got
        else:
            torch.testing.assert_close(got[k], w, rtol=1e-5, atol=1e-6)
    rows = torch.tensor([2, 0])  # a composition of some pairs: their rows of every per-pair constant
    some = objective.take(rows).gradients({k: v[rows] for k, v in variables.items()},
                                          {k: v[rows].clone() for k, v in theta_grad.items()})
    for k, v in some.items():
        torch.testing.assert_close(v, got[k][rows], rtol=1e-6, atol=1e-7)


def test_identity_composition_trains_like_the_engine(a2):
    """θ = φ without dropout is the engine's own local SGD (analytic MLP step)."""
    from clusterfed.engine.composed import Identity

    params = a2.init_params(4, torch.Generator().manual_seed(2), distinct=True)
    plain = a2.local_models(params, np.arange(4), np.arange(4), torch.Generator().manual_seed(3)).params
    composed = a2.local_composed(params, Identity(), np.arange(4), torch.Generator().manual_seed(3)).params
    for k in params:
        torch.testing.assert_close(composed[k], plain[k], rtol=1e-4, atol=1e-5)


def test_fedweit_sends_the_units_with_the_largest_masks():
    logits = torch.tensor([[0.1, -2.0, 0.3, 0.05, 1.0, -0.2, 0.4, 3.0, -0.6, 0.7]])
    # ρ = 0.3: the threshold is |m| ranked ⌊0.3·10⌋ = 3 (0-based: 0.3); units strictly above it are sent
    assert sent_units(logits, 0.3)[0].nonzero().flatten().tolist() == [1, 4, 6, 7, 8, 9]
    assert int(sent_units(logits, 0.0).sum()) == 9  # the smallest unit is never sent, as in the authors' code


def test_fedweit_server_averages_each_unit_over_its_senders():
    base = {"w.weight": torch.tensor([[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]],
                                      [[5.0, 5.0], [6.0, 6.0], [7.0, 7.0]],
                                      [[9.0, 9.0], [0.0, 0.0], [4.0, 4.0]]])}  # 3 clients, 3 units, 2 inputs
    mask = {"w.weight": torch.tensor([[0.0, 5.0, 9.0], [4.0, 0.0, 9.0], [0.0, 0.0, 9.0]])}  # |m| > 0 is sent
    accepted = torch.tensor([True, True, False])  # client 2's upload was rejected
    out = aggregate_bases(base, mask, accepted, sparsity=0.0)["w.weight"]
    # unit 0: only client 1 sent (5); unit 1: only client 0 (2); unit 2: clients 0, 1 (mean of 3 and 7)
    expected_units = torch.tensor([5.0, 2.0, 5.0])
    for c in range(3):
        assert torch.equal(out[c], expected_units[:, None].expand(3, 2))
    nobody = aggregate_bases(base, {"w.weight": torch.zeros(3, 3)}, accepted, sparsity=0.0)["w.weight"]
    assert torch.equal(nobody, base["w.weight"])  # units nobody sent stay local


def test_served_model_prunes_small_adaptive_weights_and_adds_the_knowledge_base():
    g = torch.Generator().manual_seed(0)
    b, a = (torch.randn(2, 3, 4, generator=g) for _ in range(2))
    k = torch.randn(1, 3, 4, generator=g)  # a knowledge base of one entry
    a[0, 0, 0], a[1, 2, 3] = 5e-4, -5e-4  # below λ1 = 1e-3: pruned when served
    m, alpha = torch.randn(2, 3, generator=g), torch.tensor([[0.5], [-1.0]])
    variables = {"base/l.weight": b, "mask/l.weight": m, "adaptive/l.weight": a, "attention/l.weight": alpha,
                 "own/l.bias": torch.zeros(2, 3)}
    served = compose(variables, {"l.weight": k}, prune=1e-3)["l.weight"]
    pruned = a.clone()
    pruned[0, 0, 0] = pruned[1, 2, 3] = 0.0
    expected = b * torch.sigmoid(m)[:, :, None] + pruned + alpha[:, :, None] * k
    torch.testing.assert_close(served, expected, rtol=1e-6, atol=1e-6)  # addmm: other summation order


def test_apd_drift_term_is_the_reconstruction_error_of_past_task_weights():
    """The drift term pulls B as λ2/2 Σ_i ‖B ⊙ σ(m_i) + A_i − θ_i*‖² over past tasks does
    (same gradient), from only Σσ(m_i)² and the anchor."""
    g = torch.Generator().manual_seed(1)
    theta0 = {"l.weight": torch.randn(1, 3, 4, generator=g), "l.bias": torch.zeros(1, 3)}
    parts = Decomposed.start(theta0, knowledge=0)
    tasks = []
    for _ in range(2):  # two finished tasks, each with its own mask and adaptive part
        parts = parts.with_variables({**parts.variables(), "mask/l.weight": torch.randn(1, 3, generator=g),
                                      "adaptive/l.weight": torch.randn(1, 3, 4, generator=g)})
        tasks.append((parts.mask["l.weight"].clone(), parts.adaptive["l.weight"].clone()))
        parts = parts.new_task()
    anchor = parts.anchor["l.weight"]
    targets = [anchor * torch.sigmoid(m)[:, :, None] + a for m, a in tasks]  # θ_i* when task 2 began
    moved = {**parts.variables(), "base/l.weight": (anchor + torch.randn(1, 3, 4, generator=g)).requires_grad_(True)}
    b = moved["base/l.weight"]
    explicit = sum(((b * torch.sigmoid(m)[:, :, None] + a - target) ** 2).sum() for (m, a), target in zip(tasks, targets))
    term = AdditiveComposition({}, parts.anchor, parts.retro, lambda1=0.0, lambda2=2.0).penalty(moved)
    (want,) = torch.autograd.grad(explicit, [b])  # λ2/2 = 1
    (got,) = torch.autograd.grad(term.sum(), [b])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and the new task starts from the current base: A = B / 3, σ(m) = ½
    torch.testing.assert_close(parts.adaptive["l.weight"], anchor / 3)
    torch.testing.assert_close(parts.compose()["l.weight"], anchor * (0.5 + 1 / 3))


def test_retroactive_past_tasks_absorb_the_base_s_drift_and_keep_their_kernels():
    """``past_tasks="retroactive"`` (FedWeIT Eq. 2, APD Eq. 3 as printed): each finished
    task's A_i and σ(m_i) are kept per device, its target is its kernel when the new task
    begins, and the drift term ½ λ2 Σ_i ‖B ⊙ σ(m_i) + A_i − θ_i*‖² trains A_i: one step of
    rate 1 / λ2 on A_i alone puts every past kernel back exactly where B's move took it from."""
    g = torch.Generator().manual_seed(2)
    theta0 = {"l.weight": torch.randn(2, 3, 4, generator=g), "l.bias": torch.zeros(2, 3)}
    parts = Decomposed.start(theta0, knowledge=0)
    tasks = []
    for _ in range(2):
        parts = parts.with_variables({**parts.variables(), "mask/l.weight": torch.randn(2, 3, generator=g),
                                      "adaptive/l.weight": torch.randn(2, 3, 4, generator=g),
                                      "base/l.weight": torch.randn(2, 3, 4, generator=g)})
        tasks.append((torch.sigmoid(parts.mask["l.weight"]), parts.adaptive["l.weight"].clone()))
        parts = parts.new_task(retroactive=True)
    base = parts.base["l.weight"]
    assert parts.past["l.weight"].shape == (2, 2, 3, 4) and not bool(parts.retro["l.weight"].any())  # nothing frozen
    for i, (s, a) in enumerate(tasks):
        torch.testing.assert_close(parts.past_mask["l.weight"][:, i], s)
        torch.testing.assert_close(parts.past["l.weight"][:, i], a)
        torch.testing.assert_close(parts.past_target["l.weight"][:, i], base * s[:, :, None] + a)  # θ_i* now
    lam2 = 4.0
    objective = AdditiveComposition({}, parts.anchor, parts.retro, 0.0, lam2,
                                    past_mask=parts.past_mask, past_target=parts.past_target)
    moved = {**parts.variables(), "base/l.weight": base + torch.randn(2, 3, 4, generator=g)}
    grads = objective.gradients(moved, {"l.weight": torch.zeros(2, 3, 4), "l.bias": torch.zeros(2, 3)})
    stepped = moved["past/l.weight"] - grads["past/l.weight"] / lam2
    kernels = moved["base/l.weight"][:, None] * parts.past_mask["l.weight"][..., None] + stepped
    torch.testing.assert_close(kernels, parts.past_target["l.weight"])
    # the next task's targets are the past kernels as they are then, updated A_i included
    parts = parts.with_variables({**moved, "past/l.weight": stepped}).new_task(retroactive=True)
    assert parts.past["l.weight"].shape == (2, 3, 3, 4)
    torch.testing.assert_close(parts.past_target["l.weight"][:, :2], kernels)


def test_a_per_task_head_is_the_devices_own_and_restarts_at_each_task():
    """head = "per_task" (the authors' code): the output layer is left out of the
    decomposition (no B, m, A, drift or knowledge entry), trained as the device's own
    parameter, and every task starts from the initial head while the biases of the body
    carry on."""
    g = torch.Generator().manual_seed(4)
    theta0 = {"hidden.weight": torch.randn(2, 5, 3, generator=g), "hidden.bias": torch.randn(2, 5, generator=g),
              "output.weight": torch.randn(2, 4, 5, generator=g), "output.bias": torch.randn(2, 4, generator=g)}
    parts = Decomposed.start(theta0, knowledge=2, head="per_task")
    assert set(parts.base) == set(parts.mask) == set(parts.adaptive) == set(parts.knowledge) == {"hidden.weight"}
    assert set(parts.own) == {"hidden.bias", "output.weight", "output.bias"}
    trained = parts.with_variables({k: v + 1.0 for k, v in parts.variables().items()})
    torch.testing.assert_close(trained.compose()["output.weight"], theta0["output.weight"] + 1.0)  # as it is
    nxt = trained.new_task(trained.pruned_adaptive(1e-3))
    for k in ("output.weight", "output.bias"):
        assert torch.equal(nxt.own[k], theta0[k])  # the new task's head starts afresh
    assert torch.equal(nxt.own["hidden.bias"], theta0["hidden.bias"] + 1.0)  # the body's biases carry on
    assert torch.equal(Decomposed.from_extras(nxt.extras()).head_start["output.weight"], theta0["output.weight"])
    shared = Decomposed.start(theta0, knowledge=2)
    assert set(shared.base) == {"hidden.weight", "output.weight"} and shared.head_start == {}
    with pytest.raises(ValueError, match="head must be one of"):
        Decomposed.start(theta0, knowledge=2, head="multi")
    with pytest.raises(ValueError, match="output layer named output"):
        Decomposed.start({"l.weight": theta0["hidden.weight"]}, knowledge=0, head="per_task")


def test_fedweit_per_task_heads_are_never_averaged(digits):
    """The server averages only the decomposed bases: after training, devices of different
    concepts hold different heads, and a new task resets every head to the initial one."""
    engine = _engine(digits, [0, 0, 1, 1], seed=2)
    method = FedWeIT(rounds=3, head="per_task")
    state = method.cold_start(engine, seed=3)
    head = state.extras["own"]["output.weight"]
    assert not torch.equal(head[0], head[2]) and not torch.equal(head[0], head[1])
    start = state.extras["head_start"]["output.weight"]
    assert not torch.equal(head, start)  # trained
    nxt = method.arrive(state, engine, 1, None)
    assert torch.equal(nxt.extras["own"]["output.weight"], start)
    served = nxt.clustering.params["output.weight"]
    torch.testing.assert_close(served, start)


def test_fedweit_l1_makes_task_adaptive_weights_sparse(digits):
    """λ1 prunes: a larger λ1 leaves fewer served adaptive weights (|A| > λ1)."""
    engine = _engine(digits, [0, 0, 1, 1], seed=2)
    share = {}
    for lam in (1e-4, 1e-2):
        state = FedWeIT(rounds=5, lambda1=lam).cold_start(engine, seed=3)
        a = state.extras["adaptive"]["hidden.weight"]
        share[lam] = float((a.abs() > lam).float().mean())
    assert share[1e-2] < share[1e-4] - 0.2


def test_each_device_is_served_by_its_composed_model(digits):
    engine = _engine(digits, [0, 0, 1, 1], seed=4)
    for method in (FedWeIT(rounds=2), FedProxAPD(rounds=2)):
        state = method.cold_start(engine, seed=5)
        assert [sorted(c.devices) for c in state.clustering.clusters] == [[0], [1], [2], [3]]
        served = Decomposed.from_extras(state.extras).compose(prune=method.lambda1)
        for k, v in served.items():
            assert torch.equal(state.clustering.params[k], v)
    apd = FedProxAPD(rounds=2).cold_start(engine, seed=5)
    bases = apd.extras["base"]["hidden.weight"]
    assert all(torch.equal(bases[0], bases[d]) for d in range(4))  # σ is the federation's


def test_ssgd_decays_the_rate_per_timestep_and_learns(digits):
    engine = _engine(digits, [0, 0, 0, 0], seed=6)
    state = FedProxSSGD(rounds=20, gamma=0.5).cold_start(engine, seed=1)
    assert len(state.clustering.clusters) == 1
    assert engine.accuracy(state.clustering.params, np.zeros(4, dtype=int)).mean() > 0.6  # 0.1 untrained
    # γ = 1 and γ = 0.5 train t = 0 alike (η·γ⁰) but differ from t = 1 on
    later = [FedProxSSGD(rounds=2, gamma=g).step(state, engine, t=1, seed=1).clustering.params for g in (1.0, 0.5)]
    assert not torch.equal(later[0]["hidden.weight"], later[1]["hidden.weight"])


@pytest.mark.parametrize("method", ["fedweit", "apd"])
def test_batched_adam_steps_equal_the_per_device_adam_reference(a2, method):
    """``adam=True`` (the APD and FedWeIT authors' optimiser): each pair takes Adam
    steps from zero moments, its step count advancing only on its own batches (A2's
    devices finish at different steps), equal to each device alone; two epochs."""
    parts = _decomposed(a2, 4)
    knowledge = parts.knowledge if method == "fedweit" else {}
    variables = parts.variables() if method == "fedweit" else {
        k: v for k, v in parts.variables().items() if not k.startswith("attention/")}
    center = {k: v + 0.05 for k, v in parts.base.items()} if method == "apd" else None
    mu = 0.2 if method == "apd" else 0.0

    def make(p):
        return AdditiveComposition(knowledge, _rows(parts.anchor, p), _rows(parts.retro, p), 0.01, 5.0, mu,
                                   None if center is None else _rows(center, p))

    objective = AdditiveComposition(knowledge, parts.anchor, parts.retro, 0.01, 5.0, mu, center)
    devices = torch.arange(4)
    kw = dict(epochs=2, generator=torch.Generator().manual_seed(7))
    batched = composed_sgd(a2.model, variables, objective, a2.data.train, devices, lr=LR, l2=L2, batch_size=BATCH,
                           adam=True, **kw)
    kw["generator"] = torch.Generator().manual_seed(7)
    reference = reference_composed_sgd(variables, make, a2.data.train, devices, adam=True, **kw)
    kw["generator"] = torch.Generator().manual_seed(7)
    sgd = composed_sgd(a2.model, variables, objective, a2.data.train, devices, lr=LR, l2=L2, batch_size=BATCH, **kw)
    for k in variables:  # Adam divides by √v: a gradient near 0 (λ1 sign A) turns float noise into
        # a visible step, so the bound is 1 % of one step (lr 0.05), not float precision
        torch.testing.assert_close(batched[k], reference[k], rtol=1e-3, atol=5e-4)
        assert not torch.equal(batched[k], sgd[k]) or k.startswith("attention/")
