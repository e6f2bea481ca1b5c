"""FedProx-SSGD: Stable SGD (Mirzadeh, Farajtabar, Pascanu, Ghasemzadeh, "Understanding
the Role of Training Regimes in Continual Learning", NeurIPS 2020, §4) as each
device's learner inside FedProx's local objective (Li et al., MLSys 2020, §3; the
thesis' [11]), as the thesis pairs it in Tables 4.1–4.4.

Stable SGD is plain SGD under a training regime that widens the minima each task ends
in: dropout on the hidden activations, a learning rate decayed per task
(η_t = η · γ^t) and a small batch. One global model trains each round with FedProx's
proximal term μ/2 ‖θ − θ_global‖² on every device (all at once:
``Engine.local_composed`` with dropout) and the server averages the uploads weighted
by |Z_c^train|. A timestep of the thesis' setting is a task.

Hyperparameters: η is the thesis' rate (Table B.4: 0.01 on MNIST) and the batch the
thesis' 10 (also Stable SGD's), both from ``training``; dropout p = 0.5 and γ = 0.8
are Stable SGD's for permuted MNIST (the authors' ``replicate_experiment_2.sh``);
μ = 0.01 as our FedProx-EWC. Stable SGD's momentum (0.8) is left out: the engine's
SGD has none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from clusterfed.algorithms.protocol import Context
from clusterfed.continual.baselines import ContinualFedAvg
from clusterfed.continual.state import ContinualState
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.composed import quadratic
from clusterfed.engine.local_sgd import rows_of
from clusterfed.hyperparams import Param
from clusterfed.registry import register


@dataclass(frozen=True)
class Proximal:
    """θ = φ with FedProx's μ/2 ‖θ − θ_global‖² (an engine Composition)."""

    mu: float
    center: StackedParams

    def compose(self, variables: StackedParams) -> StackedParams:
        return variables

    def penalty(self, variables: StackedParams) -> torch.Tensor:
        return sum(quadratic(v, self.mu * (v - self.center[k])) for k, v in variables.items())

    def gradients(self, variables: StackedParams, theta_grad: StackedParams) -> StackedParams:
        return {k: g.add_(variables[k] - self.center[k], alpha=self.mu) for k, g in theta_grad.items()}

    def take(self, rows: slice | torch.Tensor) -> "Proximal":
        return replace(self, center=rows_of(self.center, rows))

    shared_floats = 0


@register
class FedProxSSGD(ContinualFedAvg):
    """Stable SGD (dropout, per-task rate decay, small batch) inside FedProx."""

    name = "fedprox_ssgd"
    hyperparameters = (
        Param("mu", 0.01, "weight of FedProx's proximal term", symbol="μ", ge=0.0),
        Param("dropout", 0.5, "dropout rate on the hidden activations during training", symbol="p", ge=0.0, lt=1.0),
        Param("gamma", 0.8, "per-timestep decay of the learning rate: η_t = η·γ^t", symbol="γ", gt=0.0, le=1.0),
    )
    mu: float
    dropout: float
    gamma: float

    def train(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        n = engine.n_devices
        devices = np.arange(n)
        training = replace(engine.training, lr=engine.training.lr * self.gamma**t)
        theta = state.clustering.params  # the one global model
        for _ in range(self.rounds):
            start = {k: v.expand(n, *v.shape[1:]) for k, v in theta.items()}
            uploads = engine.local_composed(
                start, Proximal(self.mu, start), devices, ctx.generator, training=training, dropout=self.dropout
            )
            theta = engine.aggregate(uploads.params, np.zeros(n, dtype=np.int64), devices, theta, rejected=uploads.rejected)
        return replace(state, clustering=state.clustering.with_params(theta))
