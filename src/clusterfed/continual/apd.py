"""FedProx-APD: Additive Parameter Decomposition (Yoon, Kim, Yang, Hwang, "Scalable and
Order-robust Continual Learning with Additive Parameter Decomposition", ICLR 2020,
§3.1–3.2; the thesis' [22]) as each device's learner inside FedProx's local objective
(Li et al., MLSys 2020, §3; the thesis' [11]), paired as FedWeIT's paper (§4) and the
thesis (Tables 4.1–4.4) pair it.

Every device decomposes its kernels (``decomposed.py``): θ_c^(t) = σ ⊙ M_c^(t) + τ_c^(t),
with σ the federation's shared parameters, M_c^(t) the device's task mask (σ-squashed
logits per output unit) and τ_c^(t) its sparse task-adaptive parameters. Each round
every device minimises, on its data (all devices at once: ``Engine.local_composed``),

    L(θ_c^(t)) + λ1 ‖τ_c^(t)‖₁ + λ2 Σ_{i<t} ‖σ ⊙ M_c^(i) + τ_c^(i) − θ_c^(i)*‖² + μ/2 ‖σ − σ_global‖²

(APD Eq. 3, plus FedProx's proximal term; past tasks' masks are fixed, and their τ
frozen as in the authors' code, or trained as Eq. 3 writes it, with λ1 ‖τ_i‖₁:
``past_tasks``, ``decomposed.py``); the server averages the uploaded σ weighted by |Z_c^train| (FedAvg),
and every device starts the next round from it. Masks, τ and biases stay on the
device, so each device is served by its own composed model (one singleton cluster
per device). APD's hierarchical knowledge consolidation (k-means over τ every few
tasks) only saves capacity and is not implemented.

Hyperparameters: the thesis gives only the shared ones (Table B.4). λ1 = 10⁻³ as
FedWeIT's code (whose APD baseline shares it), λ2 = 10 for the plain SGD of the thesis
(see ``fedweit.py``), μ = 0.01 as our FedProx-EWC.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from clusterfed.algorithms.protocol import Context
from clusterfed.continual.decomposed import (
    HEAD, OPTIMISER, PAST_TASKS, AdditiveComposition, Decomposed, kept_rows, optimiser, per_device,
)
from clusterfed.continual.memory import Memory
from clusterfed.continual.protocol import ContinualMethod
from clusterfed.continual.state import ContinualState
from clusterfed.engine import Engine
from clusterfed.hyperparams import Param
from clusterfed.registry import register


@register
class FedProxAPD(ContinualMethod):
    """APD inside FedProx: the shared σ is federated, masks and τ stay on each device."""

    name = "fedprox_apd"
    hyperparameters = (
        Param("mu", 0.01, "weight of FedProx's proximal term on the shared σ", symbol="μ", ge=0.0),
        Param("lambda1", 1e-3, "L1 weight on the task-adaptive τ, also its pruning threshold", symbol="λ1", ge=0.0),
        Param("lambda2", 10.0, "weight of the retroactive term keeping past tasks' weights", symbol="λ2", ge=0.0),
    ) + OPTIMISER + HEAD + PAST_TASKS
    mu: float
    lambda1: float
    lambda2: float
    optimizer: str
    adam_lr: float
    head: str
    past_tasks: str

    def initial_state(self, engine: Engine, ctx: Context) -> ContinualState:
        n = engine.n_devices
        theta = engine.init_params(n, ctx.generator, distinct=False)
        return self._state(Decomposed.start(theta, knowledge=0, head=self.head), Memory.empty(n))

    def arrive(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        """A timestep is a new task for every device."""
        parts = Decomposed.from_extras(state.extras)
        return state if t == 0 else self._state(parts.new_task(retroactive=self.past_tasks == "retroactive"), state.memory)

    def train(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        parts = Decomposed.from_extras(state.extras)
        devices = np.arange(engine.n_devices)
        to_global = np.zeros(engine.n_devices, dtype=np.int64)
        for _ in range(self.rounds):
            shared = parts.base  # σ_global, the same row for every device
            objective = AdditiveComposition({}, parts.anchor, parts.retro, self.lambda1, self.lambda2, self.mu, shared,
                                            past_mask=parts.past_mask, past_target=parts.past_target)
            before = parts.variables()
            uploads = engine.local_composed(before, objective, devices, ctx.generator, **optimiser(self, engine))
            parts = parts.with_variables(kept_rows(uploads, before)[0])
            average = engine.aggregate(  # FedAvg of the accepted σ, handed back to every device
                parts.base, to_global, devices, {k: v[:1] for k, v in shared.items()}, rejected=uploads.rejected
            )
            parts = replace(parts, base={k: v.expand_as(shared[k]).clone() for k, v in average.items()})
        return self._state(parts, state.memory)

    def _state(self, parts: Decomposed, memory: Memory) -> ContinualState:
        return ContinualState(per_device(parts.compose(prune=self.lambda1)), memory, parts.extras())
