"""FedNova: normalised averaging of local updates (Wang et al., §4, eq. 9 with
vanilla SGD), which removes the bias of FedAvg towards clients taking more local
steps.

References
----------
J. Wang, Q. Liu, H. Liang, G. Joshi and H. V. Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from clusterfed.algorithms.baselines import FedAvg
from clusterfed.engine import StackedParams
from clusterfed.engine.stacked import is_finite
from clusterfed.registry import register


def local_steps(counts: np.ndarray, batch_size: int, local_epochs: int) -> np.ndarray:
    """τ_i: SGD steps client i takes, E·⌈n_i / B⌉ (its last batch may be partial)."""
    return local_epochs * np.ceil(np.asarray(counts) / batch_size).astype(np.int64)


def normalized_average(
    w: StackedParams, trained: StackedParams, p: np.ndarray, tau: np.ndarray
) -> StackedParams:
    """Eq. 9 with vanilla SGD: w ← w − τ_eff Σ_i p_i d_i, d_i = (w − w_i)/τ_i and
    τ_eff = Σ_i p_i τ_i, for one global model ``w`` (one row) and the clients' trained
    models ``trained`` (one row each) with weights p_i summing to 1."""
    p = torch.as_tensor(np.asarray(p, dtype=np.float64) / np.sum(p))
    tau = torch.as_tensor(np.asarray(tau, dtype=np.float64))
    tau_eff = float((p * tau).sum())
    out = {}
    for k, v in trained.items():
        coef = (p / tau).to(v.dtype).view(-1, *[1] * (v.dim() - 1))
        d = ((w[k] - v) * coef).sum(0, keepdim=True)
        out[k] = w[k] - tau_eff * d
    return out


@register
class FedNova(FedAvg):
    """FedNova (Wang et al., NeurIPS 2020) with local SGD: every participant trains
    the global model for the engine's local epochs, taking τ_i = E⌈n_i/B⌉ steps, and
    uploads it; the server averages the normalised updates with p_i = n_i / Σ n
    (eq. 9) instead of the models."""

    name = "fednova"
    hyperparameters = ()  # its normalised average needs every update from the global model

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        return state, replace(plan, upload="each")

    def aggregate(self, engine, state, plan, trained, ctx):
        counts = engine.counts("train")[plan.devices]
        cfg = engine.training
        tau = local_steps(counts, cfg.batch_size, cfg.local_epochs)
        ok = is_finite(trained).cpu().numpy()
        keep = ok & (counts > 0)
        if not keep.any():
            return state
        rows = torch.as_tensor(np.flatnonzero(keep), device=engine.device)
        w = normalized_average(
            state.params, {k: v.index_select(0, rows) for k, v in trained.items()}, counts[keep], tau[keep]
        )
        return state.with_params(w)
