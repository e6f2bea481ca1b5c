"""Additive decomposition of each device's kernels, shared by FedProx-APD and FedWeIT.

APD (Yoon, Kim, Yang, Hwang, "Scalable and Order-robust Continual Learning with
Additive Parameter Decomposition", ICLR 2020, §3.1–3.2) writes task t's kernel as
θ_t = σ ⊗ M_t + τ_t: shared σ masked by a task mask, plus a sparse task-adaptive
τ_t. FedWeIT (Yoon, Jeong, Lee, Yang, Hwang, "Federated Continual Learning with
Weighted Inter-client Transfer", ICML 2021, §3.2, Eq. 1–2) adds the other clients'
task-adaptive parameters: θ_c^(t) = B_c ⊙ m_c^(t) + A_c^(t) + Σ_j α_j A_j. Here, per
device (one row each) and per kernel (parameters named ``*weight``):

    base B [n, *shape]     mask m [n, out]     adaptive A [n, *shape]
    attention α [n, J]     knowledge K [J, *shape] (the same for every device)

θ = B ⊙ σ(m) + A + Σ_j α_j K_j; biases are the device's own (not decomposed). With
``head = "per_task"`` the output layer is the device's own too, restarted from the
initial model's head at each task, as the authors' code gives each task its own
softmax head, outside the decomposition and never sent (``modules/nets.py``
``add_head``; RESULTS §12, session 27). As in
the authors' code (github wyjeong/FedWeIT, jaehong31/APD): the mask is one logit per
output unit, squashed by σ; A starts at B / 3 when a task begins; the served model
prunes A to |A| > λ1. The retroactive term is λ2/2 Σ_{i<t} ‖B ⊙ σ(m_i) + A_i − θ_i*‖²
(θ_i* the task-i kernel when task t began), read two ways (``PAST_TASKS``):

- ``frozen`` (the default, the authors' code: ``retroactive=False``, only the current
  task's variables train): past masks and A_i are constants, so the term is
  ½ λ2 Σ_i σ(m_i)² (B − B*)² with B* the base when task t began, and only Σ_i σ(m_i)²
  (``retro``) and B* (``anchor``) need keeping: a quadratic pull of B.
- ``retroactive`` (FedWeIT's Eq. 2 and APD's Eq. 3 as written: they minimise over
  ΔA^(i) / τ_i, i < t, too): every past A_i trains beside B on the same term plus its
  λ1 ‖A_i‖₁, so A_i absorbs B's change and B meets at most a slope λ1 σ(m_i) per past
  task (benchmarks/RESULTS.md §12, session 26). Past masks stay fixed (APD's Eq. 3
  lists only the current mask). Keeps per device and past task A_i (``past``), σ(m_i)
  (``past_mask``) and θ_i* without its knowledge-base part (``past_target``).

Differences from the authors' code:
mask logits and α start at 0 (they draw them at random), and θ's optimiser is the
engine's SGD (they use Adam).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

import torch

from clusterfed.algorithms import Cluster, Clustering
from clusterfed.engine import Round, StackedParams
from clusterfed.engine.composed import quadratic
from clusterfed.engine.local_sgd import rows_of
from clusterfed.hyperparams import Param
from clusterfed.models import is_regularized

#: The local optimiser of APD and FedWeIT: the engine's SGD (the thesis' Table B.4: every
#: method at lr 0.01) or Adam at ``adam_lr``, the authors' (FedWeIT ``config.py``: Adam,
#: 1e-3 / 3 for its LeNet). Under SGD the base B moves by lr·σ(m)² = lr/4 in θ while the
#: device's own A moves by lr (benchmarks/RESULTS.md §12); Adam scales every variable's step.
OPTIMISER = (
    Param("optimizer", "sgd", "local optimiser: the engine's SGD (thesis) or Adam (the authors')", kind=str,
          choices=("sgd", "adam")),
    Param("adam_lr", 1e-3 / 3, "Adam's learning rate when optimizer is adam (FedWeIT authors: 1e-3/3)", gt=0.0),
)

#: The output layer: decomposed and shared like every kernel (one head for every task), or
#: each task's own head, local to the device and restarted at each task (the authors' code).
HEADS = ("shared", "per_task")
HEAD = (
    Param("head", "shared", "output layer: decomposed like the body (shared) or a local head per task (the authors')",
          kind=str, choices=HEADS),
)

#: Parameter-name prefix of every model's output layer (``clusterfed.models``).
HEAD_PREFIX = "output."


def optimiser(method, engine) -> dict:
    """``Engine.local_composed``'s arguments for ``method.optimizer``."""
    if method.optimizer == "sgd":
        return {}
    return {"adam": True, "training": replace(engine.training, lr=method.adam_lr)}


#: How the retroactive term treats past tasks' task-adaptive parameters (module docstring).
PAST_TASKS = (
    Param("past_tasks", "frozen",
          "past tasks' A in the retroactive term: frozen (the authors' code) or retroactive (trained: the paper's Eq.)",
          kind=str, choices=("frozen", "retroactive")),
)

#: The trained parts (``variables``) and the bookkeeping kept beside them.
TRAINED = ("base", "mask", "adaptive", "attention", "own", "past")


def _units(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[n, out]`` per-output-unit values broadcast over a kernel ``[n, out, ...]``."""
    return mask.view(*mask.shape, *[1] * (like.dim() - mask.dim()))


@dataclass(frozen=True)
class Decomposed:
    """Every device's decomposed model (rows = devices); dicts keyed by parameter name."""

    base: StackedParams
    mask: StackedParams
    adaptive: StackedParams
    own: StackedParams  # the device's own, not decomposed: biases (and a per-task head)
    anchor: StackedParams
    retro: StackedParams
    attention: StackedParams  # empty without a knowledge base (APD)
    knowledge: StackedParams  # empty without a knowledge base (APD)
    head_start: StackedParams = field(default_factory=dict)  # each task's initial head; empty if shared
    past: StackedParams = field(default_factory=dict)  # [n, P, *shape] past tasks' A (retroactive only)
    past_mask: StackedParams = field(default_factory=dict)  # [n, P, out] their σ(m_i)
    past_target: StackedParams = field(default_factory=dict)  # [n, P, *shape] θ_i* − Σα K, when this task began

    @classmethod
    def start(cls, theta: StackedParams, *, knowledge: int, head: str = "shared") -> "Decomposed":
        """Task 0 from one model per device: B = θ, σ(m) = ½, A = B / 3; a knowledge base
        of ``knowledge`` entries (0: none) starts empty (zeros) with α = 0. ``head =
        "per_task"`` keeps the output layer out of the decomposition, and each task's
        head starts from θ's."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        local_head = {k for k in theta if head == "per_task" and k.startswith(HEAD_PREFIX)}
        if head == "per_task" and not local_head:
            raise ValueError(f"head = 'per_task' needs an output layer named {HEAD_PREFIX}*, got {sorted(theta)}")
        kernels = {k: v for k, v in theta.items() if is_regularized(k) and k not in local_head}
        n = next(iter(theta.values())).shape[0]
        return cls(
            base={k: v.clone() for k, v in kernels.items()},
            mask={k: v.new_zeros(v.shape[:2]) for k, v in kernels.items()},
            adaptive={k: v / 3.0 for k, v in kernels.items()},
            own={k: v.clone() for k, v in theta.items() if k not in kernels},
            anchor={k: v.clone() for k, v in kernels.items()},
            retro={k: v.new_zeros(v.shape[:2]) for k, v in kernels.items()},
            attention={k: v.new_zeros(n, knowledge) for k, v in kernels.items()} if knowledge else {},
            knowledge={k: v.new_zeros(knowledge, *v.shape[1:]) for k, v in kernels.items()} if knowledge else {},
            head_start={k: theta[k].clone() for k in local_head},
        )

    # -- the trained variables, flat (``part/name``) for the engine -------------------------
    def variables(self) -> StackedParams:
        return {f"{part}/{k}": v for part in TRAINED for k, v in getattr(self, part).items()}

    def with_variables(self, variables: StackedParams) -> "Decomposed":
        parts = {part: {k.split("/", 1)[1]: v for k, v in variables.items() if k.startswith(part + "/")} for part in TRAINED}
        return replace(self, **parts)

    # -- θ -------------------------------------------------------------------------------
    def compose(self, *, prune: float | None = None) -> StackedParams:
        """Every device's model; ``prune`` zeroes |A| ≤ prune (the served model)."""
        return compose(self.variables(), self.knowledge, prune=prune)

    def new_task(self, knowledge: StackedParams | None = None, *, retroactive: bool = False) -> "Decomposed":
        """A new task begins: the finished task joins the past tasks (``frozen``: its
        σ(m)² joins the drift weights; ``retroactive``: its A and σ(m) join ``past``, and
        every past task's target becomes its kernel now), the anchor is the current
        base, A restarts at B / 3, m and α at 0, a per-task head at its initial value;
        ``knowledge`` replaces the knowledge base."""
        past = {}
        if retroactive:
            def append(kept: StackedParams, k: str, x: torch.Tensor) -> torch.Tensor:  # [n, P + 1, ...]
                return torch.cat([kept[k], x[:, None]], 1) if kept else x[:, None].clone()

            masks = {k: append(self.past_mask, k, torch.sigmoid(m)) for k, m in self.mask.items()}
            adaptive = {k: append(self.past, k, a) for k, a in self.adaptive.items()}
            past = dict(past=adaptive, past_mask=masks,
                        past_target={k: torch.addcmul(a, self.base[k][:, None], _units(masks[k], a))
                                     for k, a in adaptive.items()})
        return replace(
            self,
            **past,
            own={k: self.head_start.get(k, v).clone() for k, v in self.own.items()},
            retro=self.retro if retroactive else {k: v + torch.sigmoid(self.mask[k]).square() for k, v in self.retro.items()},
            anchor={k: v.clone() for k, v in self.base.items()},
            mask={k: torch.zeros_like(v) for k, v in self.mask.items()},
            adaptive={k: v / 3.0 for k, v in self.base.items()},
            attention={k: torch.zeros_like(v) for k, v in self.attention.items()},
            knowledge=self.knowledge if knowledge is None else knowledge,
        )

    def pruned_adaptive(self, threshold: float) -> StackedParams:
        """A with |A| ≤ ``threshold`` zeroed: what FedWeIT's clients send to the knowledge base."""
        return {k: v * (v.abs() > threshold) for k, v in self.adaptive.items()}

    # -- checkpoints: ContinualState.extras ------------------------------------------------
    def extras(self) -> dict[str, StackedParams]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_extras(cls, extras: dict[str, StackedParams]) -> "Decomposed":
        return cls(**{f.name: extras.get(f.name, {}) for f in fields(cls)})


def compose(variables: StackedParams, knowledge: StackedParams, *, prune: float | None = None) -> StackedParams:
    """θ = B ⊙ σ(m) + A + Σ_j α_j K_j per kernel, the device's own parameters as they
    are (differentiable)."""
    theta = {}
    for name, v in variables.items():
        part, k = name.split("/", 1)
        if part == "own":
            theta[k] = v
        elif part == "base":
            a = variables[f"adaptive/{k}"]
            if prune is not None:
                a = a * (a.abs() > prune)
            theta[k] = torch.addcmul(a, v, _units(torch.sigmoid(variables[f"mask/{k}"]), v))
            if k in knowledge:
                theta[k] = torch.addmm(theta[k].flatten(1), variables[f"attention/{k}"], knowledge[k].flatten(1)).view_as(v)
    return theta


@dataclass(frozen=True)
class AdditiveComposition:
    """The local objective's extra terms on the decomposed variables (engine Composition):
    λ1 Σ|A| (sparsity), the drift of past tasks' weights — ½ λ2 Σ retro ⊙ (B − B*)² for
    frozen past tasks, ½ λ2 Σ_i ‖B ⊙ s_i + A_i − r_i‖² + λ1 Σ_i ‖A_i‖₁ over the trained
    past A_i (``past/*`` variables, s_i = ``past_mask``, r_i = ``past_target``) for
    retroactive ones — and, for FedProx-APD, FedProx's ½ μ ‖B − B_global‖²."""

    knowledge: StackedParams
    anchor: StackedParams
    retro: StackedParams
    lambda1: float
    lambda2: float
    mu: float = 0.0
    center: StackedParams | None = None
    past_mask: StackedParams = field(default_factory=dict)
    past_target: StackedParams = field(default_factory=dict)

    def compose(self, variables: StackedParams) -> StackedParams:
        return compose(variables, self.knowledge)

    def penalty(self, variables: StackedParams) -> torch.Tensor:
        """λ1‖A‖₁ plus the quadratic terms as gradient surrogates (``engine/composed.py``)."""
        total = 0.0
        for k, b in ((n.split("/", 1)[1], v) for n, v in variables.items() if n.startswith("base/")):
            a = variables[f"adaptive/{k}"]
            total = total + self.lambda1 * a.abs().flatten(1).sum(1)
            pull = self.lambda2 * _units(self.retro[k], b) * (b - self.anchor[k])
            if self.mu and self.center is not None:
                pull = pull + self.mu * (b - self.center[k])
            total = total + quadratic(b, pull)
            if k in self.past_target:
                past = variables[f"past/{k}"]
                error = self._past_error(b, past, k)
                total = total + 0.5 * self.lambda2 * error.square().flatten(1).sum(1)
                total = total + self.lambda1 * past.abs().flatten(1).sum(1)
        return total

    def _past_error(self, b: torch.Tensor, past: torch.Tensor, k: str) -> torch.Tensor:
        """``[n, P, *shape]`` B ⊙ s_i + A_i − r_i: how far each past task's kernel has moved."""
        return torch.addcmul(past - self.past_target[k], b[:, None], _units(self.past_mask[k], past))

    def gradients(self, variables: StackedParams, theta_grad: StackedParams) -> StackedParams:
        """With G = ∇_θ and s = σ(m): ∇_B = G ⊙ s + (λ2 retro + μ) ⊙ B − (λ2 retro ⊙ B* + μ c)
        (+ λ2 Σ_i s_i ⊙ e_i with e_i = B ⊙ s_i + A_i − r_i, retroactive past tasks),
        ∇_m = Σ_in G ⊙ B · s(1 − s), ∇_A = G + λ1 sign(A), ∇_α = ⟨G, K_j⟩, ∇_own = G,
        ∇_{A_i} = λ2 e_i + λ1 sign(A_i)."""
        out = {}
        for name, v in variables.items():
            part, k = name.split("/", 1)
            if part == "own":
                out[name] = theta_grad[k]
            elif part == "base":
                g, a = theta_grad[k], variables[f"adaptive/{k}"]
                s = torch.sigmoid(variables[f"mask/{k}"])
                out[f"mask/{k}"] = torch.linalg.vecdot(g.flatten(2), v.flatten(2)) * s * (1.0 - s)
                if k in self._pull:
                    factor, negative_target = self._pull[k]
                    out[name] = torch.addcmul(negative_target, v, factor).addcmul_(g, _units(s, v))
                else:
                    out[name] = g * _units(s, v)
                out[f"adaptive/{k}"] = torch.add(g, torch.sign(a), alpha=self.lambda1) if self.lambda1 else g
                if k in self.past_target:
                    past = variables[f"past/{k}"]
                    error = self._past_error(v, past, k).mul_(self.lambda2)
                    out[name] += (error * _units(self.past_mask[k], past)).sum(1)
                    out[f"past/{k}"] = error.add_(torch.sign(past), alpha=self.lambda1) if self.lambda1 else error
                if k in self.knowledge:
                    out[f"attention/{k}"] = g.flatten(1) @ self.knowledge[k].flatten(1).T
        return out

    def take(self, rows: slice | torch.Tensor) -> "AdditiveComposition":
        return replace(self, anchor=rows_of(self.anchor, rows), retro=rows_of(self.retro, rows),
                       center=None if self.center is None else rows_of(self.center, rows),
                       past_mask=rows_of(self.past_mask, rows), past_target=rows_of(self.past_target, rows))

    @property
    def shared_floats(self) -> int:
        """The knowledge base, which every pair's compose and ∇_α read whole."""
        return sum(k.numel() for k in self.knowledge.values())

    @cached_property
    def _pull(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per kernel the quadratic pulls' gradient on B as factor ⊙ B − target, given as
        (factor, −target); kernels without a pull are left out. Made once per call of the
        engine's loop (the composition of a chunk of pairs), not per step."""
        out = {}
        for k, anchor in self.anchor.items():
            factor = self.lambda2 * _units(self.retro[k], anchor)
            target = factor * anchor
            if self.mu and self.center is not None:
                factor, target = factor + self.mu, target + self.mu * self.center[k]
            if bool(factor.any()):
                out[k] = (factor, target.neg_())
        return out


def per_device(theta: StackedParams) -> Clustering:
    """One singleton cluster per device, device d served by row d: how personalised
    models are registered (MLflow answers "which model serves device d at t")."""
    n = next(iter(theta.values())).shape[0]
    return Clustering(tuple(Cluster(d, frozenset({d})) for d in range(n)), {k: v.clone() for k, v in theta.items()})


def kept_rows(uploads: Round, previous: StackedParams) -> tuple[StackedParams, torch.Tensor]:
    """Rows the engine's screening rejected keep ``previous``; also returns the ``[P]``
    bool of accepted rows, for the server to average those only."""
    first = next(iter(previous.values()))
    ok = torch.ones(first.shape[0], dtype=torch.bool, device=first.device)
    ok[torch.as_tensor(uploads.rejected, dtype=torch.long, device=first.device)] = False
    return {k: torch.where(_units(ok, v), v, previous[k]) for k, v in uploads.params.items()}, ok
