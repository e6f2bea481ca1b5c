"""FedProx: FedAvg whose local objective adds a proximal pull to the global model
(Li et al., §3, Alg. 2): h_k(w; w^t) = F_k(w) + μ/2 ‖w − w^t‖².

References
----------
T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar and V. Smith, "Federated
Optimization in Heterogeneous Networks", MLSys 2020.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from clusterfed.algorithms.baselines import FedAvg
from clusterfed.engine import StackedParams
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.hyperparams import Param
from clusterfed.registry import register


def proximal_penalty(params: StackedParams, mu: float) -> QuadraticPenalty:
    """μ/2 ‖w − w^t‖² for every model row of ``params`` (its own w^t): μ is one value
    broadcast as a view, and the centre is ``params`` itself (the engine modifies
    neither), so no model-sized copy is made."""
    return QuadraticPenalty(
        weight={k: v.new_full((1,) * v.dim(), mu).expand_as(v) for k, v in params.items()},
        center=dict(params),
    )


@register
class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020, Alg. 2) with a fixed amount of local work:
    FedAvg whose participants train with ``proximal_penalty`` centred on the model
    they downloaded (μ = 0 is FedAvg)."""

    name = "fedprox"
    hyperparameters = (Param("mu", 0.01, "proximal weight", symbol="μ", kind=float, ge=0.0),)
    mu: float

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        return state, replace(plan, penalty=proximal_penalty(plan.params, self.mu))
