"""Personalised FL baselines of the seed papers' tables: Ditto, Per-FedAvg (FO),
pFedMe and LG-FedAvg. Each device ends with its own model, so the result holds one
model per device (a singleton cluster each) and registers each device's model.

References
----------
T. Li, S. Hu, A. Beirami and V. Smith, "Ditto: Fair and Robust Federated Learning
Through Personalization", ICML 2021 (Alg. 1).
A. Fallah, A. Mokhtari and A. Ozdaglar, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (§5).
C. T Dinh, N. H. Tran and T. D. Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020 (Alg. 1).
P. P. Liang, T. Liu, L. Ziyin, N. B. Allen, R. P. Auerbach, D. Brent, R. Salakhutdinov
and L.-P. Morency, "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", 2020 (Alg. 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from clusterfed.algorithms.base import model_bytes, pair_traffic
from clusterfed.algorithms.clustering import Clustering
from clusterfed.algorithms.fedclust import final_layer_keys
from clusterfed.algorithms.fedprox import proximal_penalty
from clusterfed.algorithms.grouped import per_device, replace_rows
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.local_sgd import PerFedAvgStep, PFedMeStep
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine.stacked import is_finite, take
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def _finite(engine: Engine, params: StackedParams) -> np.ndarray:
    ok = is_finite(params).cpu().numpy()
    return ok


def _or_global(engine: Engine, theta: StackedParams, w: StackedParams) -> StackedParams:
    """``theta`` (one fresh row per device, owned by the caller) with each diverged row
    replaced by the global model, in place: no second set of N models."""
    bad = np.flatnonzero(~_finite(engine, theta))
    return replace_rows(theta, bad, take(w, [0] * len(bad)), np.ones(len(bad), dtype=bool), in_place=True)


@dataclass(frozen=True)
class PersonalState:
    w: StackedParams  # what the server holds (one row; LG-FedAvg: the shared layers)
    personal: StackedParams  # the model serving each device (one row per device)


class _Personalized(ColdStart[PersonalState]):
    """Shared bookkeeping: a global model w and one served model per device."""

    def init(self, engine: Engine, ctx: Context) -> PersonalState:
        w = engine.init_params(1, ctx.generator, distinct=False)
        return PersonalState(w, take(w, [0] * engine.n_devices))

    def configure_round(self, engine, state, participants, ctx):
        plan = RoundPlan(state.w, 0 * participants, participants, **pair_traffic(state.w, len(participants)))
        return state, plan

    def clustering(self, state: PersonalState) -> Clustering:
        return per_device(state.personal)


@register
class Ditto(_Personalized):
    """Ditto (Li et al., ICML 2021, Alg. 1): a global model w trained by FedAvg and,
    on each participant, a personal model v_k trained on F_k(v) + λ/2 ‖v − w^t‖²
    from its previous v_k (the engine's local epochs for both). Devices are served
    v_k; only w travels."""

    name = "ditto"
    hyperparameters = (
        Param("lam", 0.1, "pull of the personal models to the global one", symbol="λ", kind=float, ge=0.0),
    )
    lam: float

    def configure_round(self, engine, state, participants, ctx):
        n = engine.n_devices
        pull = proximal_penalty({k: v.expand(n, *v.shape[1:]) for k, v in state.w.items()}, self.lam)  # w^t, a view per device
        v = engine.local_models(state.personal, participants, participants, ctx.generator, penalty=pull).params
        # in place: the driver keeps no earlier state, and a copy would be a second set of N models
        personal = replace_rows(state.personal, participants, v, _finite(engine, v), in_place=True)
        return super().configure_round(engine, replace(state, personal=personal), participants, ctx)

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, w=trained)


@register
class PerFedAvg(_Personalized):
    """Per-FedAvg, first-order (Fallah et al., NeurIPS 2020, §5): FedAvg whose local
    step is the MAML step ``PerFedAvgStep`` (β = the engine's learning rate). Each
    device is served the global model after one gradient step of rate α on all its
    training data (the personalisation the method trains for)."""

    name = "perfedavg"
    hyperparameters = (
        Param("alpha", 0.01, "inner (personalisation) step size", symbol="α", kind=float, gt=0.0),
    )
    alpha: float

    def personalize(self, engine: Engine, w: StackedParams, gen: torch.Generator) -> StackedParams:
        """θ_k = w − α∇F_k(w): one full-batch step on each device's training data."""
        n = engine.n_devices
        full = int(engine.counts("train").max())
        one_step = replace(engine.training, lr=self.alpha, batch_size=max(full, 1), local_epochs=1)
        theta = engine.local_models(w, np.zeros(n, dtype=np.int64), np.arange(n), gen, training=one_step).params
        return _or_global(engine, theta, w)

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        return state, replace(plan, objective=PerFedAvgStep(alpha=self.alpha))

    def aggregate(self, engine, state, plan, trained, ctx):
        return PersonalState(trained, self.personalize(engine, trained, ctx.generator))


@register
class PFedMe(_Personalized):
    """pFedMe (T Dinh et al., NeurIPS 2020, Alg. 1): each participant trains the
    global w with ``PFedMeStep`` (personalised θ̃ from K steps on the Moreau envelope,
    then w_k ← w_k − ηλ(w_k − θ̃)); the server takes w ← (1 − β) w + β · avg_k w_k.
    Devices are served their personalised θ̃(w) (``personalize``)."""

    name = "pfedme"
    hyperparameters = (
        Param("lam", 15.0, "Moreau-envelope regularisation (the paper's MNIST value)", symbol="λ", kind=float,
              ge=0.0),
        Param("beta", 1.0, "server mixing (1: plain average; the paper also uses 2)", symbol="β", kind=float,
              gt=0.0),
        Param("K", 5, "steps on the inner problem per batch", symbol="K", kind=int, gt=0),
        Param("personal_lr", 0.01, "step size of the inner problem", kind=float, gt=0.0),
        Param("eta", None, "local learning rate η of w ← w − ηλ(w − θ̃) (null: the engine's lr; "
              "ηλ < 1 keeps w between its old value and θ̃; the paper's MNIST: 0.005)", symbol="η", kind=float,
              gt=0.0, optional=True),
    )
    lam: float
    beta: float
    K: int
    personal_lr: float
    eta: float | None

    def personalize(self, engine: Engine, w: StackedParams, gen: torch.Generator) -> StackedParams:
        """θ̃_k(w) as in the local step: K gradient steps of rate ``personal_lr`` on
        F_k(θ; D_k) + λ/2 ‖θ − w‖² from w, D_k the device's first B training samples."""
        n = engine.n_devices
        B = engine.training.batch_size
        batch = engine.head(B)
        inner = replace(engine.training, lr=self.personal_lr, local_epochs=self.K)
        theta = engine.local_models(
            w, np.zeros(n, dtype=np.int64), np.arange(n), gen, training=inner, data=batch,
            penalty=proximal_penalty(w, self.lam),
        ).params
        return _or_global(engine, theta, w)

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        training = None if self.eta is None else replace(engine.training, lr=self.eta)
        objective = PFedMeStep(lam=self.lam, K=self.K, personal_lr=self.personal_lr)
        return state, replace(plan, objective=objective, training=training)

    def aggregate(self, engine, state, plan, trained, ctx):
        w = {k: (1.0 - self.beta) * state.w[k] + self.beta * trained[k] for k in trained}
        return PersonalState(w, self.personalize(engine, w, ctx.generator))


@register
class LGFedAvg(_Personalized):
    """LG-FedAvg (Liang et al., 2020, Alg. 1): each device keeps its own local
    representation layers and all devices share the final layer (weight and bias).
    Each round a participant trains its model with the current shared layer, and the
    server averages only the shared layer (|D|-weighted); only it travels."""

    name = "lgfedavg"

    def init(self, engine: Engine, ctx: Context) -> PersonalState:
        theta = engine.init_params(1, ctx.generator, distinct=False)
        head = {k: theta[k] for k in final_layer_keys(theta)}
        return PersonalState(head, take(theta, [0] * engine.n_devices))

    def configure_round(self, engine, state, participants, ctx):
        size = model_bytes(state.w)
        plan = RoundPlan(state.personal, participants, participants, upload="each",
                         bytes_down=len(participants) * size, bytes_up=len(participants) * size)
        return state, plan

    def aggregate(self, engine, state, plan, trained, ctx):
        ok = _finite(engine, trained)
        personal = replace_rows(state.personal, plan.devices, trained, ok, in_place=True)  # as Ditto's
        head = state.w
        if ok.any():  # the shared head: the engine's |Z^train|-weighted average of the finite uploads
            head = engine.aggregate({k: trained[k] for k in head}, np.zeros(len(plan.devices), dtype=np.int64),
                                    plan.devices, head, rejected=np.flatnonzero(~ok))
        n = engine.n_devices
        shared = take(head, [0] * n)
        personal = {k: (shared[k] if k in head else v) for k, v in personal.items()}
        return PersonalState(head, personal)
