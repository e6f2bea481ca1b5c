"""Federated Cluster-Wise Refinement, FedCRef (Nardi, Valerio, Passarella; fedcref Alg. 1).

Each client C_i trains one autoencoder AE_iq per local cluster Q_iq; models are
exchanged all-to-all and two clusters of different clients associate when each
model reconstructs the other's cluster about as well as its own (eq. 2, both
directions). Connected components of the association graph with at least two
clusters are the communities G; each trains a community model AE_Gp by FedAvg over
its clusters; every active client then refines its clusters with its local and the
community models (Alg. 2) and leaves the active set A once its clustering is stable
(ACC ≥ τ between iterations). The run ends when A is empty or when |G| and |I|
settle (§4.5's text, "either … or"; Alg. 1's while-condition would need both).
Inactive clients keep their models and clusters but still take part in the
association and in their communities' FedAvg (§4.5). Each iteration retrains the
active clients' AE_iq from a fresh initialisation and each community model from a
fresh one (the paper does not say; the authors' Keras code builds new models).

The algorithm only ever sees :class:`UnlabelledClients`; which clusters associate is
a pluggable step (``associate``) so the oracle baselines can supply the true graph
from outside.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from clusterfed.algorithms.fedcref.steps import (
    NORMALIZE,
    association_graph,
    cluster_refine,
    communities_and_isolated,
    global_stop,
    is_stable,
    keep_indices,
)
from clusterfed.engine.aggregation import weighted_average
from clusterfed.engine.robust import RobustRule, screen
from clusterfed.engine.autoencoder import (
    init_autoencoders,
    model_bytes,
    reconstruction_errors,
    train_autoencoders,
)
from clusterfed.engine.stacked import StackedParams, take
from clusterfed.hyperparams import Param, check
from clusterfed.progress import progress as progress_bar
from clusterfed.scenarios.unsupervised import UnlabelledClients


# Declared once (clusterfed.hyperparams): the params.yaml section unsupervised.fedcref,
# its validation and the README table come from here. Defaults are the paper's (§5.2)
# and the authors' code (20 local epochs); FedAvg's local epochs per round (the paper
# gives none; the authors' code trains 2 in round 1, then 7) and the iteration cap are
# this implementation's choices.
HYPERPARAMETERS: tuple[Param, ...] = (
    Param("alpha", 75.0, "percentile of the normalised error differences in eq. (2), in percent", symbol="α",
          ge=0.0, le=100.0),
    Param("theta", 0.2, "association threshold on that percentile", symbol="θ", ge=0.0, le=1.0),
    Param("normalize", "pair", "what eq. (2)'s Normalize[0,1] scales together: one pair's differences, "
          "both error vectors before differencing, or all a client's differences for one cluster",
          kind=str, choices=NORMALIZE),
    Param("tau", 0.8, "client stability: ACC between consecutive clusterings", symbol="τ", ge=0.0, le=1.0),
    Param("local_epochs", 20, "epochs of each AE_iq on its cluster", kind=int, gt=0),
    Param("fl_rounds", 15, "FedAvg rounds of each community model AE_Gp", kind=int, ge=0),
    Param("fl_epochs", 2, "local epochs per FedAvg round of a community model (the paper gives none; the authors' "
          "code: 2 in round 1, then 7; 2 meets Tables 1, 3 and 4 on MNIST, 1 misses Table 1, "
          "benchmarks/RESULTS.md §6.3)", kind=int, gt=0),
    Param("lr", 1e-3, "Adam learning rate (Keras default)", gt=0.0),
    Param("batch_size", 32, "mini-batch size (Keras default)", kind=int, gt=0),
    Param("max_iterations", 20, "cap on Alg. 1's iterations", kind=int, gt=0),
    Param("stable_after", 1, "the refinement from which the stability test (ACC ≥ τ) can take a client out of A: "
          "1 compares the first refinement with the initial clustering, 2 reads §4.5's \"previous and current "
          "iterations\" as two refinements", kind=int, ge=1),
    Param("retrain_on_leave", False, "a client that leaves A trains its models once more, on the clusters of its "
          "last refinement, before it stops (the authors' code; §4.5's \"consistent set of samples and models\"); "
          "false: Alg. 1's order, where it keeps the models of the clusters before that refinement", kind=bool),
)
_DEFAULT = {p.name: p.default for p in HYPERPARAMETERS}


@dataclass(frozen=True)
class FedCRefParams:
    """Hyperparameters by the paper's names; :data:`HYPERPARAMETERS` declares them.
    The stop rule's window (3 iterations) and tolerance (10%) are fixed by §4.5.

    ``stable_after`` holds §4.5's two readings: 1 (the default) compares the first
    refinement with the initial clustering; 2 reads "cluster labels from previous and
    current iterations" as two refinements, so every client refines at least twice (an
    initial clustering that the local models reproduce, as DEC's, does not end a
    client's refinement at once; RESULTS.md §6.3).

    ``retrain_on_leave`` holds the two orders of training and the stability test: Alg. 1
    tests a client right after its refinement (line 28), so a client leaving A keeps
    models trained on the clusters before that refinement; the authors' code tests it at
    the next iteration, after retraining its models on its current clusters, so every
    stable client's models describe its clusters (§4.5: stable clients provide "a
    consistent set of samples (i.e., clusters) and models")."""

    α: float = _DEFAULT["alpha"]
    θ: float = _DEFAULT["theta"]
    normalize: str = _DEFAULT["normalize"]
    τ: float = _DEFAULT["tau"]
    local_epochs: int = _DEFAULT["local_epochs"]
    fl_rounds: int = _DEFAULT["fl_rounds"]
    fl_epochs: int = _DEFAULT["fl_epochs"]
    lr: float = _DEFAULT["lr"]
    batch_size: int = _DEFAULT["batch_size"]
    max_iterations: int = _DEFAULT["max_iterations"]
    stop_window: int = 3
    stop_tolerance: float = 0.1
    stable_after: int = _DEFAULT["stable_after"]
    retrain_on_leave: bool = _DEFAULT["retrain_on_leave"]

    def __post_init__(self) -> None:
        values = {"alpha": self.α, "theta": self.θ, "tau": self.τ, **{
            k: getattr(self, k) for k in _DEFAULT if k not in ("alpha", "theta", "tau")}}
        check("fedcref", HYPERPARAMETERS, values)

    @classmethod
    def from_section(cls, values: dict) -> "FedCRefParams":
        """From params.yaml's ASCII keys (alpha, theta, tau, …)."""
        v = dict(values)
        return cls(α=v.pop("alpha"), θ=v.pop("theta"), τ=v.pop("tau"), **v)


@dataclass(frozen=True)
class ClusterLayout:
    """Local clusters of one iteration as global slots c = offset[i] + q."""

    client_of: np.ndarray  # [C] client of slot c
    local_of: np.ndarray  # [C] q of slot c
    members: list[np.ndarray]  # members[c]: global sample indices of Q_iq

    @property
    def nonempty(self) -> np.ndarray:
        return np.array([len(m) > 0 for m in self.members])


# associate(errors [C, S], layout) -> adjacency [C, C] bool
Associate = Callable[[np.ndarray, ClusterLayout], np.ndarray]


def reconstruction_association(params: FedCRefParams) -> Associate:
    """The paper's rule (Alg. 1 lines 10–16)."""

    def associate(errors: np.ndarray, layout: ClusterLayout) -> np.ndarray:
        return association_graph(
            errors, layout.members, layout.client_of, α=params.α, θ=params.θ, normalize=params.normalize
        )

    return associate


def no_association(errors: np.ndarray, layout: ClusterLayout) -> np.ndarray:
    """The local-only baseline: no cluster ever associates, so no community forms."""
    return np.zeros((len(layout.members),) * 2, dtype=bool)


@dataclass
class FedCRefResult:
    """Final clustering, community models and a label-free per-iteration history."""

    assignment: list[np.ndarray]  # final local clusters of each client
    communities: list[list[tuple[int, int]]]  # last iteration's G as (client, q) lists
    community_params: StackedParams  # AE_Gp of the last iteration, one row per community
    history: list[dict] = field(default_factory=list)
    d: int = 0

    @property
    def iterations(self) -> int:
        return len(self.history)

    def community_of(self, client: int, cluster: int) -> int | None:
        """Which community model serves local cluster q of client i (None: isolated)."""
        for g, members in enumerate(self.communities):
            if (client, cluster) in members:
                return g
        return None


def fedcref(
    clients: UnlabelledClients,
    params: FedCRefParams,
    *,
    seed: int,
    associate: Associate | None = None,
    screening: RobustRule = RobustRule(),
    progress: bool = False,
    name: str = "fedcref",
) -> FedCRefResult:
    """Run Alg. 1 on ``clients`` from their initial clustering. The community FedAvg's
    uploads go through the screening rule of every aggregate (``engine/robust.py``;
    the pipeline passes params.yaml's, ``build.screening_rule``); each iteration's
    history counts the uploads screened and lists the clients whose uploads it rejected.
    ``progress``: a bar over the iterations on a terminal, lines in a log (``name`` labels them)."""
    associate = reconstruction_association(params) if associate is None else associate
    generator = torch.Generator().manual_seed(seed)
    x_all = torch.as_tensor(np.concatenate(clients.x), dtype=torch.float32)
    d = clients.dim
    sizes = [len(xi) for xi in clients.x]
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    offset = np.concatenate([[0], np.cumsum(clients.k)[:-1]]).astype(np.int64)
    n_slots = int(sum(clients.k))
    client_of = np.repeat(np.arange(clients.n_clients), clients.k)
    local_of = np.concatenate([np.arange(k) for k in clients.k])
    wire = model_bytes(d)

    assignment = [np.asarray(q, dtype=np.int64).copy() for q in clients.initial]
    active = np.ones(clients.n_clients, dtype=bool)  # A = C
    leaving = np.zeros(clients.n_clients, dtype=bool)  # left A at the last refinement: trains once more
    local_params = init_autoencoders(n_slots, d, generator)
    errors = np.zeros((n_slots, len(x_all)), dtype=np.float32)  # E[m, s]: AE_m's error on sample s
    history: list[dict] = []
    communities: list[list[int]] = []
    community_params: StackedParams = take(local_params, [])
    layout = None
    bar = progress_bar(params.max_iterations, f"{name} iterations", enabled=progress)

    for t in range(1, params.max_iterations + 1):
        layout = _layout(assignment, start, client_of, local_of)
        trained_slots = np.flatnonzero((active | leaving)[client_of])
        # Lines 6–8: active clients (and, with retrain_on_leave, those that just left A)
        # train AE_iq on each of their clusters.
        if len(trained_slots):
            fresh = init_autoencoders(len(trained_slots), d, generator)
            index, counts = _index_rows([layout.members[c] for c in trained_slots])
            trained = train_autoencoders(
                fresh, x_all, index, counts, epochs=params.local_epochs, lr=params.lr,
                batch_size=params.batch_size, generator=generator,
            )
            slots_t = torch.as_tensor(trained_slots)
            for k in local_params:
                local_params[k][slots_t] = trained[k]
        # Line 9: all-to-all exchange; every model's error on every sample. Only the
        # models just retrained changed: the other rows are the last iteration's.
        if len(trained_slots):
            errors[trained_slots] = reconstruction_errors(take(local_params, trained_slots), x_all).numpy()
        # Lines 10–20: association graph, communities G and isolated clusters I.
        adjacency = associate(errors, layout)
        communities, isolated = communities_and_isolated(adjacency, np.flatnonzero(layout.nonempty))
        # Lines 21–24: FedAvg inside each community.
        community_params, rejected_clients, uploads = _train_communities(
            communities, layout, x_all, d, params, generator, screening
        )
        # Lines 25–31: refinement on active clients and the stability check.
        refined = np.flatnonzero(active)
        leaving[:] = False
        g_errors = (
            reconstruction_errors(community_params, x_all).numpy() if communities else np.zeros((0, len(x_all)))
        )
        before = [q.copy() for q in assignment]
        from_community = np.zeros((clients.n_clients, 2), dtype=np.int64)  # clusters, samples H_p of an AE_Gg
        for i in refined:
            rows = slice(start[i], start[i] + sizes[i])
            local_slots = offset[i] + np.arange(clients.k[i])
            e = np.concatenate([errors[local_slots, rows], g_errors[:, rows]]).T
            refined_i, selected = cluster_refine(e, clients.k[i])
            by_community = np.flatnonzero(np.asarray(selected) >= clients.k[i])
            from_community[i] = len(by_community), np.isin(refined_i, by_community).sum()
            assignment[i] = keep_indices(refined_i, before[i], clients.k[i])
            if t >= params.stable_after and is_stable(before[i], assignment[i], τ=params.τ):
                active[i] = False  # a client in A since iteration 1 makes its t-th refinement
                leaving[i] = params.retrain_on_leave
        n_active_models = len(trained_slots)
        bytes_exchanged = (
            n_active_models * (clients.n_clients - 1) * wire  # line 9
            + params.fl_rounds * 2 * sum(len(g) for g in communities) * wire  # lines 21–23
            + len(communities) * clients.n_clients * wire  # line 25
        )
        history.append({
            "iteration": t,
            "communities": len(communities),
            "isolated": len(isolated),
            "edges": int(adjacency.sum() // 2),
            "links": [
                [(int(client_of[a]), int(local_of[a])), (int(client_of[b]), int(local_of[b]))]
                for a, b in zip(*np.nonzero(np.triu(adjacency, 1)))
            ],
            "refined_clients": int(len(refined)),
            # per client: clusters H_p of this refinement formed by a community model, and their samples
            "from_community": from_community.tolist(),
            "uploads": uploads,
            "rejected_clients": rejected_clients,
            "active_clients": int(active.sum()),
            "bytes": int(bytes_exchanged),
            "groups": [[(int(client_of[c]), int(local_of[c])) for c in g] for g in communities],
            "isolated_clusters": [(int(client_of[c]), int(local_of[c])) for c in isolated],
            "assignment_at_association": before,
            "assignment": [q.copy() for q in assignment],
        })
        bar.set_postfix(communities=len(communities), isolated=len(isolated), active=int(active.sum()))
        bar.update()
        if not (active | leaving).any() or global_stop(
            [h["communities"] for h in history], [h["isolated"] for h in history],
            window=params.stop_window, tolerance=params.stop_tolerance,
        ):
            break
    bar.close()

    groups = [[(int(client_of[c]), int(local_of[c])) for c in g] for g in communities]
    return FedCRefResult(
        assignment=assignment, communities=groups, community_params=community_params, history=history, d=d
    )


def _layout(assignment: list[np.ndarray], start: np.ndarray, client_of: np.ndarray, local_of: np.ndarray) -> ClusterLayout:
    members = [start[i] + np.flatnonzero(assignment[i] == q) for i, q in zip(client_of, local_of)]
    return ClusterLayout(client_of=client_of, local_of=local_of, members=members)


def _index_rows(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad sample-index rows to ``[P, max_n]`` (padding 0 is never read) and their counts."""
    counts = torch.as_tensor([len(r) for r in rows], dtype=torch.long)
    index = torch.zeros(len(rows), max(1, int(counts.max()) if len(rows) else 1), dtype=torch.long)
    for p, r in enumerate(rows):
        index[p, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return index, counts


def _train_communities(
    communities: list[list[int]],
    layout: ClusterLayout,
    x_all: torch.Tensor,
    d: int,
    params: FedCRefParams,
    generator: torch.Generator,
    screening: RobustRule,
) -> tuple[StackedParams, list[int], int]:
    """FedAvg (15 rounds) of one fresh model per community over its clusters' samples,
    weighted by cluster size; all communities' rounds run as one batch. Uploads the
    screening rejects are left out of the average; returned: the models and the
    client of every rejected upload (ascending) and the number of uploads screened."""
    theta = init_autoencoders(len(communities), d, generator)
    if not communities:
        return theta, [], 0
    member_slots = [c for g in communities for c in g]
    target = torch.as_tensor([p for p, g in enumerate(communities) for _ in g], dtype=torch.long)
    index, counts = _index_rows([layout.members[c] for c in member_slots])
    weights = counts.to(torch.float32)
    rejected_clients: list[int] = []
    for _ in range(params.fl_rounds):
        start = take(theta, target)
        trained = train_autoencoders(
            start, x_all, index, counts, epochs=params.fl_epochs, lr=params.lr,
            batch_size=params.batch_size, generator=generator,
        )
        rejected, trained = screen(trained, start, screening)
        keep = ~rejected
        rows = {k: torch.where(keep.view(-1, *([1] * (v.dim() - 1))), v, 0.0) for k, v in trained.items()}
        theta = weighted_average(rows, target, torch.where(keep, weights, 0.0), theta)
        rejected_clients += [int(layout.client_of[member_slots[p]]) for p in torch.nonzero(rejected).flatten().tolist()]
    return theta, sorted(rejected_clients), params.fl_rounds * len(member_slots)
