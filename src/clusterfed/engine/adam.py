"""Adam over stacked models, each with its own moments and step count (FedCRef's
autoencoders, ``engine/autoencoder.py``; APD's and FedWeIT's composed variables with
the authors' optimiser, ``engine/composed.py``)."""

from __future__ import annotations

import torch

from clusterfed.engine.stacked import StackedParams


class StackedAdam:
    """Adam moments and per-model step counts over per-model views of stacked tensors,
    so one fused update (``torch._fused_adam_``, torch's own Adam arithmetic) moves
    exactly the models that had a batch; β and ε are Keras' (the FedCRef and FedWeIT
    authors' framework). ``grads`` are buffers the caller fills before each ``step``;
    the state starts at zero."""

    β1, β2, ε = 0.9, 0.999, 1e-7

    def __init__(self, params: StackedParams, grads: StackedParams) -> None:
        self.n_models = next(iter(params.values())).shape[0]
        self.views = [
            [t.unbind(0) for t in group.values()]
            for group in (params, grads, {k: torch.zeros_like(v) for k, v in params.items()},
                          {k: torch.zeros_like(v) for k, v in params.items()})
        ]
        self.steps = [torch.zeros(()) for _ in range(self.n_models)]
        self._every = self._lists(list(range(self.n_models)))

    def _lists(self, models: list[int]) -> list[list[torch.Tensor]]:
        """Parameters, gradients, moments and step counts of ``models``, tensor by tensor."""
        return [[v[m] for v in group for m in models] for group in self.views] + [
            [self.steps[m] for _ in self.views[0] for m in models]]

    def step(self, models: list[int], *, lr: float) -> None:
        if not models:
            return
        torch._foreach_add_([self.steps[m] for m in models], 1.0)
        p, g, m1, m2, steps = self._every if len(models) == self.n_models else self._lists(models)
        torch._fused_adam_(p, g, m1, m2, [], steps, amsgrad=False, lr=lr, beta1=self.β1, beta2=self.β2,
                           weight_decay=0.0, eps=self.ε, maximize=False)
