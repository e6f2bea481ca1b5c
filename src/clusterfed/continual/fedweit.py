"""FedWeIT: Federated Weighted Inter-client Transfer (Yoon, Jeong, Lee, Yang, Hwang,
"Federated Continual Learning with Weighted Inter-client Transfer", ICML 2021, §3,
Algorithm 1), the thesis' [21] in Tables 4.1–4.4.

Each device c decomposes its kernels (``decomposed.py``) into a base B_c, a task mask
m_c and a sparse task-adaptive A_c, plus the attention-weighted knowledge base of
every client's previous task-adaptive parameters:

    θ_c^(t) = B_c ⊙ σ(m_c^(t)) + A_c^(t) + Σ_j α_{c,j}^(t) A_j^(t−1)

and minimises, each round (Eq. 2),
    L(θ_c^(t)) + λ1 Σ_{i≤t} ‖A_c^(i)‖₁ + λ2 Σ_{i<t} ‖ΔB_c ⊙ σ(m_c^(i)) + ΔA_c^(i)‖²
with past A_c^(i) frozen (``past_tasks="frozen"``, the authors' code: ΔA^(i) = 0) or
trained (``"retroactive"``, the equation as printed; ``decomposed.py``) on its data (all devices at once on the engine: ``Engine.local_composed``). The server
averages, unit by unit, the bases the clients send sparsely — B_c ⊙ 1[|m_c| above
the client's ρ-quantile] — over the clients that sent each unit, and every client
takes the average on those units (§3.3; the authors' ``sparse_comm``). When a task
ends, every client's pruned A_c (|A| > λ1) joins the knowledge base broadcast for the
next task. A timestep of the thesis' continual setting is a task. Each device is
served by its own composed model, registered per timestep (one singleton cluster
per device).

Hyperparameters: the thesis gives only the shared ones (Table B.4: lr 0.01, 100
rounds per timestep, T = 10). λ1 = 10⁻³ and ρ = 0.3 are the authors' (their
``config.py``). Their λ2 = 100 is tuned for Adam; with the thesis' plain SGD at lr
0.01 the drift term's curvature λ2 Σ_i σ(m_i)² must stay below 2 / lr = 200 over T = 10
tasks, so our default is λ2 = 10.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from clusterfed.algorithms.protocol import Context
from clusterfed.continual.decomposed import (
    HEAD, OPTIMISER, PAST_TASKS, AdditiveComposition, Decomposed, _units, kept_rows, optimiser, per_device,
)
from clusterfed.continual.memory import Memory
from clusterfed.continual.protocol import ContinualMethod
from clusterfed.continual.state import ContinualState
from clusterfed.engine import Engine, StackedParams
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def sent_units(mask: torch.Tensor, sparsity: float) -> torch.Tensor:
    """``[n, out]`` bool: the base units client c sends, those whose |mask logit|
    exceeds its ⌊ρ·out⌋-th smallest (the authors' ``client_sparsity``)."""
    ranked = mask.abs().sort(dim=1).values
    threshold = ranked[:, math.floor(mask.shape[1] * sparsity)]
    return mask.abs() > threshold[:, None]


def aggregate_bases(base: StackedParams, mask: StackedParams, accepted: torch.Tensor, sparsity: float) -> StackedParams:
    """The server's step and the clients' update: each unit's base becomes the mean of
    the bases sent for it (accepted uploads only); units nobody sent stay local."""
    out = {}
    for k, b in base.items():
        sent = sent_units(mask[k], sparsity) & accepted[:, None]  # [n, out]
        weight = _units(sent.to(b.dtype), b)
        count = weight.sum(0, keepdim=True)
        mean = (b * weight).sum(0, keepdim=True) / count.clamp(min=1)
        out[k] = torch.where(count > 0, mean.expand_as(b), b)
    return out


@register
class FedWeIT(ContinualMethod):
    """FedWeIT (Yoon et al., ICML 2021): decomposed, sparsely shared bases and an
    attention-weighted knowledge base of the clients' task-adaptive parameters."""

    name = "fedweit"
    hyperparameters = (
        Param("lambda1", 1e-3, "L1 weight on the task-adaptive A, also its pruning threshold (authors: 1e-3)",
              symbol="λ1", ge=0.0),
        Param("lambda2", 10.0, "weight of the retroactive term keeping past tasks' weights (authors: 100 with Adam)",
              symbol="λ2", ge=0.0),
        Param("sparsity", 0.3, "share of base units, smallest |mask| first, a client withholds from each upload",
              symbol="ρ", ge=0.0, lt=1.0),
    ) + OPTIMISER + HEAD + PAST_TASKS
    lambda1: float
    lambda2: float
    sparsity: float
    optimizer: str
    adam_lr: float
    head: str
    past_tasks: str

    def initial_state(self, engine: Engine, ctx: Context) -> ContinualState:
        n = engine.n_devices
        theta = engine.init_params(n, ctx.generator, distinct=False)
        return self._state(Decomposed.start(theta, knowledge=n, head=self.head), Memory.empty(n))

    def arrive(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        """A timestep is a new task: every client's pruned A of the finished task forms
        the knowledge base it receives."""
        if t == 0:
            return state
        parts = Decomposed.from_extras(state.extras)
        retroactive = self.past_tasks == "retroactive"
        return self._state(parts.new_task(parts.pruned_adaptive(self.lambda1), retroactive=retroactive), state.memory)

    def train(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        parts = Decomposed.from_extras(state.extras)
        devices = np.arange(engine.n_devices)
        objective = AdditiveComposition(parts.knowledge, parts.anchor, parts.retro, self.lambda1, self.lambda2,
                                        past_mask=parts.past_mask, past_target=parts.past_target)
        for _ in range(self.rounds):
            before = parts.variables()
            uploads, accepted = kept_rows(
                engine.local_composed(before, objective, devices, ctx.generator, **optimiser(self, engine)), before)
            parts = parts.with_variables(uploads)
            parts = replace(parts, base=aggregate_bases(parts.base, parts.mask, accepted, self.sparsity))
        return self._state(parts, state.memory)

    def _state(self, parts: Decomposed, memory: Memory) -> ContinualState:
        return ContinualState(per_device(parts.compose(prune=self.lambda1)), memory, parts.extras())
