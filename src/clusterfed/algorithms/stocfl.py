"""StoCFL: Stochastic Clustered Federated Learning (Zeng et al., 2023, Alg. 1).

A fixed, randomly initialised anchor model ψ turns each client's data into a
representation Ψ(D_i) = ∂ℓ(ψ; D_i)/∂ψ (§2.1). Each round the server samples clients,
collects Ψ from those it has not seen, and merges every two sampled clusters whose
representations have cosine similarity above τ (§2.2, Alg. 1 lines 4–17). Training is
bi-level (§2.3): a global model ω trained by FedAvg, and cluster models θ_k trained
with the regulariser λ/2‖θ_k − ω‖² (Alg. 1 lines 18–30). A client that never took
part is placed by the same similarity (§3.3).

The steps are pure functions: ``data_representations`` (Ψ), ``cosine_similarity`` (the
matrix M), ``admit_clients`` (newly seen clients start as singleton clusters),
``stochastic_merge`` (Alg. 1 lines 12–17) and ``merge_sums`` (a merged cluster's
Σ_{i∈k} Ψ(D_i), Alg. 1 line 10). The server keeps one such sum per cluster, not one Ψ per
client: O(K·d) memory instead of O(N·d) (31 GB for the paper's 784-2048-10 MLP at
N = 4800).

References
----------
D. Zeng, X. Hu, S. Liu, Y. Yu, Q. Wang and Z. Xu, "Stochastic Clustered Federated
Learning", KDD FL4Data-Mining workshop, 2023. Authors' code: github.com/dunzeng/StoCFL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from clusterfed.algorithms.base import generators, model_bytes
from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams, TrainingConfig
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.engine.stacked import take
from clusterfed.hyperparams import Param
from clusterfed.registry import register

#: Cluster id of the devices not sampled yet, which ω serves.
UNSEEN_ID = -1


def data_representations(
    engine: Engine, ψ: StackedParams, devices: np.ndarray | None = None, *, chunk: int = 64
) -> np.ndarray:
    """Ψ(D_i) = ∂ℓ(ψ; D_i)/∂ψ of §2.1 for each device: the full-batch gradient of the
    mean cross-entropy of the anchor ψ on the device's training data, all parameters
    flattened (in ``ψ``'s key order) into a row of ``[len(devices), d]``."""
    return engine.gradients(ψ, devices, chunk=chunk)


def anchor_movements(
    engine: Engine, ψ: StackedParams, devices: np.ndarray, generator: torch.Generator, *,
    local_epochs: int, training: TrainingConfig,
) -> np.ndarray:
    """The authors' code's client representation: the anchor's movement ψ − ψ_i after
    ``local_epochs`` epochs of local SGD from ψ on device i (``training``: η, batch),
    flattened in ``ψ``'s key order into a row of ``[len(devices), d]``. With one
    full-batch epoch and no weight decay it is η·Ψ(D_i) of §2.1; a rejected upload
    is a NaN row."""
    devices = np.asarray(devices, dtype=np.int64)
    moved = engine.local_models(
        ψ, np.zeros(len(devices), dtype=np.int64), devices, generator,
        local_epochs=local_epochs, training=training,
    ).params
    return torch.cat([(ψ[k] - moved[k]).flatten(1) for k in ψ], dim=1).cpu().numpy()


def merge_sums(Σ: np.ndarray, before: Sequence[Cluster], after: Sequence[Cluster]) -> np.ndarray:
    """Σ_k = Σ_{i∈k} Ψ(D_i) (Alg. 1 line 10) of each cluster of ``after``, a coarsening of
    ``before`` whose sums are the rows of ``Σ``: a cluster's sum is the sum of its parts'.
    Eq. (2)'s Ψ(D̃^(k)) is Σ_k / |k|, with the same cosines."""
    if len(after) == len(before):  # nothing merged
        return Σ
    part_of = {d: i for i, c in enumerate(before) for d in c.devices}
    out = np.empty((len(after), Σ.shape[1]), dtype=Σ.dtype)
    for j, c in enumerate(after):
        first, *rest = sorted({part_of[d] for d in c.devices})
        out[j] = Σ[first]
        for i in rest:  # row by row: no (parts × d) temporary
            out[j] += Σ[i]
    return out


def cosine_similarity(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """cos(a_i, b_j) for every row pair (M of Alg. 1 line 12 when ``b`` is omitted)."""
    b = a if b is None else b
    # dot products over norms: no normalised copy of the (K × d) rows
    na, nb = (np.sqrt(np.maximum(np.einsum("ij,ij->i", x, x, dtype=np.float64), 1e-24)) for x in (a, b))
    return (a @ b.T) / np.outer(na, nb)


def admit_clients(clusters: Sequence[Cluster], sampled: np.ndarray) -> tuple[tuple[Cluster, ...], np.ndarray]:
    """Sampled clients in no cluster yet start as singleton clusters (§2.2's initial
    C = {{1}, ..., {N}}, created when a client is first seen), appended in device order
    with the client's id as cluster id.

    Returns the clusters and, for each, the row of the previous clusters' models it
    keeps; ``-1`` marks a new cluster, whose θ starts as the current ω.
    """
    known = set().union(*(c.devices for c in clusters)) if clusters else set()
    new = [int(d) for d in np.unique(sampled) if int(d) not in known]
    out = tuple(clusters) + tuple(Cluster(id=d, devices=frozenset({d})) for d in new)
    rows = np.concatenate([np.arange(len(clusters)), np.full(len(new), -1)]).astype(np.int64)
    return out, rows


def stochastic_merge(
    similarity: np.ndarray, clusters: Sequence[Cluster], sampled: np.ndarray, tau: float
) -> tuple[tuple[Cluster, ...], np.ndarray]:
    """Alg. 1 lines 12–17: unite every two *sampled* clusters (those holding a client
    sampled this round) whose similarity ``M[i, j] > τ``; clusters without a sampled
    client are left alone.

    M is computed once per round, so merges chain (c_i ∪ c_j, then that ∪ c_l): the
    result is the connected components of the graph "M > τ" on the sampled clusters.
    A merged cluster takes the smallest id of its parts and keeps the θ of its largest
    part (most clients, then smallest id), as the authors' code does; the paper only
    says the cluster models are merged. It sits where its first part was.

    Returns the clusters and, for each, the row of ``clusters`` whose model it keeps.
    """
    k = len(clusters)
    sampled_set = {int(d) for d in np.asarray(sampled).ravel()}
    active = [i for i, c in enumerate(clusters) if c.devices & sampled_set]
    parent = list(range(k))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, i in enumerate(active):
        for j in active[a + 1 :]:
            if similarity[i, j] > tau:
                ri, rj = find(i), find(j)
                if ri != rj:
                    parent[max(ri, rj)] = min(ri, rj)
    parts: dict[int, list[int]] = {}
    for i in range(k):
        parts.setdefault(find(i), []).append(i)
    out, rows = [], []
    for members in sorted(parts.values(), key=min):
        keep = min(members, key=lambda i: (-len(clusters[i].devices), clusters[i].id))
        devices = frozenset().union(*(clusters[i].devices for i in members))
        out.append(Cluster(id=min(clusters[i].id for i in members), devices=devices))
        rows.append(keep)
    return tuple(out), np.asarray(rows, dtype=np.int64)


def _concat(a: StackedParams, b: StackedParams) -> StackedParams:
    return {k: torch.cat([a[k], b[k]]) for k in a}


def _rows_or_ω(θ: StackedParams, ω: StackedParams, rows: np.ndarray) -> StackedParams:
    """Rows ``rows`` of θ, with ω wherever the row is ``-1``."""
    stacked = _concat(θ, ω)
    ω_row = next(iter(θ.values())).shape[0]
    return take(stacked, np.where(rows < 0, ω_row, rows).tolist())


@dataclass(frozen=True)
class StoCFLState:
    """The anchor ψ, which clients were seen, the clusters of seen clients with their
    sums Σ_k of Ψ (rows aligned with ``clusters``) and models θ, and the global model ω."""

    ψ: StackedParams
    Σ: np.ndarray
    seen: np.ndarray
    clusters: tuple[Cluster, ...]
    θ: StackedParams
    ω: StackedParams
    local: TrainingConfig


@register
class StoCFL(ColdStart[StoCFLState]):
    """Stochastic Clustered Federated Learning (Zeng et al., KDD FL4Data-Mining 2023,
    §2 and Alg. 1; newcomers §3.3).

    Each round the server samples a ``participation`` share of the clients. Those sampled for the
    first time download the anchor ψ (ψ = ω_0, §3.1, never trained) and upload
    Ψ(D_i) = ∂ℓ(ψ; D_i)/∂ψ, then start as their own cluster with θ = ω. Sampled clusters
    whose mean representations have cosine similarity above τ are merged. Every sampled
    client then trains, from the round's ω, both θ_k ← θ_k − η(∇f_i(θ_k) + λ(θ_k − ω))
    and ω ← ω − η∇f_i(ω) for ``local_epochs`` epochs; ω becomes the average of all the
    sampled clients' ω, θ_k the average over its sampled clients (|Z^train|-weighted,
    FedAvg). Clusters with no sampled client keep their θ.

    Clients never sampled have no cluster yet: they are served by ω, as one entry with
    id ``-1`` (``UNSEEN_ID``) holding all of them, so every recorded clustering covers
    the federation. A round is recorded as phase ``"clustering"`` when its partition
    changed (clients admitted or clusters merged), else ``"training"``.

    Where the paper is silent, the authors' code decides: a merged cluster keeps the θ
    of its largest part (the paper only says the models are merged), and a cluster
    created for a first-seen client starts from the current ω (the paper sets every
    θ_i = ω_0 at initialisation, which is the same in round 1). Where the two differ,
    the paper decides: Ψ is the exact gradient of its definition (``representation =
    "gradient"``; ``"movement"`` is the code's ψ − ψ_i after ``representation_epochs``
    of local SGD at batch ``representation_batch_size``, equal to η·Ψ for one
    full-batch epoch without weight decay; with few samples per client it is the
    safer choice: at N = 4800, |D| = 50 the gradient merged all four rotations of
    rotated MNIST on one seed of three where the movement found them on all three,
    ``benchmarks/RESULTS.md`` §10), and a
    cluster's representation is the mean Ψ of all its clients (Eq. 2; the code
    averages the clients sampled that round). Local SGD keeps the engine's L2 weight
    decay (``TrainingConfig.l2``; set it to 0 for the paper's plain SGD).

    The paper's T is 100 rounds for MNIST (§3.2); the learning rate η is the
    engine's ``TrainingConfig.lr`` (0.1 in the paper). The authors' README runs their
    rotated script (shown on CIFAR-10: 200 clients, 20 a round, 200 rounds) with
    τ = 0.65, λ = 0.05, 5 local epochs at batch 50 and the anchor moved for 20 epochs
    at batch 50: ``tau=0.65, lam=0.05, local_epochs=5,
    batch_size=50, representation="movement"`` (the last two representation
    defaults). Models start Glorot-uniform with zero biases (the engine's
    ``glorot_init_``; the paper's Xavier, stated for its FEMNIST network; the
    authors' CNNs draw Xavier weights, their rotated-MNIST MLP keeps PyTorch's
    default initialisation).

    Attributes
    ----------
    result_ : ColdStartResult
    anchor_ : StackedParams
        The anchor ψ (one row, on the CPU).
    cluster_representations_ : ndarray of shape (len(result_.params), d)
        Ψ(D̃^(k)) of each row of ``result_.params``; NaN for the ω row of unseen clients.
    global_params_ : StackedParams
        The global model ω (one row).
    """

    name = "stocfl"
    hyperparameters = (
        Param("tau", 0.5, "cosine similarity above which sampled clusters merge (§3.2)", symbol="τ",
              ge=-1.0, le=1.0),
        Param("lam", 0.05, "weight of the pull λ/2‖θ − ω‖² of cluster models to the global model (§3.2)",
              symbol="λ", ge=0.0),
        Param("local_epochs", 5, "local epochs of each client on each of ω and θ_k (§3.2)", kind=int, gt=0),
        Param("batch_size", None, "local batch size; null = full batch (§3.2)", kind=int, gt=0, optional=True),
        Param("representation", "gradient",
              "client representation Ψ(D_i): gradient = ∂ℓ(ψ; D_i)/∂ψ (§2.1); movement = ψ minus ψ after "
              "local SGD on D_i (the authors' code)", kind=str, choices=("gradient", "movement"), symbol="Ψ"),
        Param("representation_epochs", 20, "local epochs of the anchor's SGD when representation = movement "
              "(the authors' obep; 20 in their rotated README command)", kind=int, gt=0),
        Param("representation_batch_size", 50, "batch of the anchor's SGD when representation = movement "
              "(the authors' obbs, 50 in their README); null = full batch", kind=int, gt=0, optional=True),
    )
    tau: float
    lam: float
    local_epochs: int
    batch_size: int | None
    representation: str
    representation_epochs: int
    representation_batch_size: int | None

    def represent(
        self, engine: Engine, ψ: StackedParams, devices: np.ndarray | None, generator: torch.Generator
    ) -> np.ndarray:
        """Ψ of ``devices`` (default: all) on the anchor ψ as ``representation`` says:
        the gradient of §2.1 or the authors' anchor movement (``anchor_movements``),
        trained with ``engine``'s η and weight decay."""
        if self.representation == "gradient":
            return data_representations(engine, ψ, devices)
        devices = np.arange(engine.n_devices) if devices is None else devices
        batch = self.representation_batch_size or int(engine.counts("train").max())
        return anchor_movements(engine, ψ, devices, generator, local_epochs=self.representation_epochs,
                                training=replace(engine.training, batch_size=batch))

    def init(self, engine: Engine, ctx: Context) -> StoCFLState:
        ω = engine.init_params(1, ctx.generator, distinct=False)
        ψ = {k: v.clone() for k, v in ω.items()}  # anchor ψ = ω_0 (§3.1), never optimised
        d = sum(v[0].numel() for v in ψ.values())
        n = engine.n_devices
        # full batch by default: a batch as large as the largest client's data
        local = replace(engine.training, batch_size=self.batch_size or int(engine.counts("train").max()))
        return StoCFLState(ψ, np.zeros((0, d), dtype=np.float32), np.zeros(n, dtype=bool), (),
                           take(ω, []), ω, local)

    def configure_round(self, engine, state, participants, ctx):
        """Federated client clustering (Alg. 1 lines 5–17), then the bi-level training
        pairs (lines 18–30): rows 0..K-1 are θ_k (pulled to ω by λ), row K is ω."""
        S, n = participants, engine.n_devices
        seen, Σ = state.seen, state.Σ
        new = S[~seen[S]]
        before = frozenset(c.devices for c in state.clusters)
        admitted, rows = admit_clients(state.clusters, S)
        θ = _rows_or_ω(state.θ, state.ω, rows)
        if len(new):
            # first-seen clients upload Ψ (drawn in sampling order) and start as singletons,
            # appended in device order (``admit_clients``)
            seen = seen.copy()
            seen[new] = True
            Ψ = self.represent(engine, state.ψ, new, ctx.generator)
            Σ = np.empty((len(state.Σ) + len(new), Ψ.shape[1]), dtype=np.float32)
            Σ[: len(state.Σ)] = state.Σ
            np.take(Ψ, np.argsort(new), axis=0, out=Σ[len(state.Σ) :])
            del Ψ
        M = cosine_similarity(Σ)
        clusters, rows = stochastic_merge(M, admitted, S, self.tau)
        Σ = merge_sums(Σ, admitted, clusters)
        θ = take(θ, rows.tolist())
        changed = frozenset(c.devices for c in clusters) != before
        K, ω = len(clusters), state.ω
        cluster_of = np.full(n, -1, dtype=np.int64)
        for i, c in enumerate(clusters):
            cluster_of[sorted(c.devices)] = i
        penalty = QuadraticPenalty(
            weight={
                k: torch.cat([torch.full_like(v, self.lam).expand(K, *v.shape[1:]), torch.zeros_like(v)])
                for k, v in ω.items()
            },
            center={k: v.expand(K + 1, *v.shape[1:]) for k, v in ω.items()},
        )
        size = model_bytes(ω)
        plan = RoundPlan(
            _concat(θ, ω),
            np.concatenate([cluster_of[S], np.full(len(S), K)]),
            np.concatenate([S, S]),
            # first-seen clients: ψ down, Ψ up; every sampled client: ω and θ_k down and up
            bytes_down=len(new) * size + 2 * len(S) * size,
            bytes_up=len(new) * Σ.shape[1] * Σ.itemsize + 2 * len(S) * size,
            phase="clustering" if changed else "training",
            local_epochs=self.local_epochs,
            penalty=penalty,
            training=state.local,
        )
        return replace(state, Σ=Σ, seen=seen, clusters=clusters, θ=θ), plan

    def aggregate(self, engine, state, plan, trained, ctx):
        K = len(state.clusters)
        return replace(state, θ=take(trained, list(range(K))), ω=take(trained, [K]))

    def clustering(self, state: StoCFLState) -> Clustering:
        return _served(state.clusters, state.θ, state.ω, len(state.seen))

    def fitted(self, engine: Engine, state: StoCFLState) -> None:
        served = self.clustering(state)
        self.anchor_ = {k: v.detach().cpu() for k, v in state.ψ.items()}
        sizes = np.array([len(c.devices) for c in state.clusters], dtype=np.float32)
        means = state.Σ / sizes[:, None]  # Eq. (2)
        if len(served.clusters) > len(state.clusters):  # the ω entry of unseen clients
            means = np.concatenate([means, np.full((1, state.Σ.shape[1]), np.nan, np.float32)])
        self.cluster_representations_ = means
        self.global_params_ = state.ω

    def assign_newcomers(self, engine: Engine, *, seed: int) -> np.ndarray:
        """Row of ``result_.params`` serving each client of ``engine``, a federation of
        clients that never took part (§3.3).

        Each newcomer uploads Ψ(D̂) computed on the anchor ψ; the candidate is the
        cluster ĉ = argmax_j cos(Ψ(D̂), Ψ(D̃^(j))). If that similarity is ≥ τ the
        client joins ĉ; otherwise the paper opens a new cluster K̃ + 1 with
        θ_{K̃+1} = θ_ĉ ("the closest model", §3.3). Since training is over, that new
        cluster's model is θ_ĉ itself, so both cases are served by row ĉ; which
        newcomers would open a new cluster is ``newcomer_similarity(...) < tau``.
        If no cluster has formed (no round ran), ω serves everyone.

        ``seed`` drives the anchor's local SGD when ``representation`` is
        ``"movement"``; the gradient has no randomness.
        """
        similarity = self.newcomer_similarity(engine, seed=seed)
        if similarity.shape[1] == 0 or np.isnan(similarity).all():
            return np.full(engine.n_devices, len(self.result_.clusters) - 1, dtype=np.int64)
        return np.nanargmax(similarity, axis=1).astype(np.int64)

    def newcomer_similarity(self, engine: Engine, *, seed: int = 0) -> np.ndarray:
        """cos(Ψ(D̂), Ψ(D̃^(j))) of each newcomer (rows) with each row j of
        ``result_.params`` (columns; NaN for the ω row of unseen clients); ``seed``
        as in ``assign_newcomers``."""
        if not hasattr(self, "result_"):
            raise RuntimeError("call fit before assign_newcomers")
        if set(self.anchor_) != set(engine.param_shapes()):
            raise ValueError("the newcomers' engine has another architecture than the fitted one")
        anchor = {k: v.to(engine.device) for k, v in self.anchor_.items()}
        Ψ_new = self.represent(engine, anchor, None, generators(seed)[1])
        R = self.cluster_representations_
        unseen = np.isnan(R).any(axis=1)
        similarity = cosine_similarity(Ψ_new, np.where(unseen[:, None], 0.0, R))
        similarity[:, unseen] = np.nan
        return similarity


def _served(clusters: tuple[Cluster, ...], θ: StackedParams, ω: StackedParams, n: int) -> Clustering:
    """The clustering that serves every device: the clusters with their θ, and the
    devices not sampled yet in one entry served by ω."""
    unseen = frozenset(range(n)) - frozenset().union(*(c.devices for c in clusters))
    if not unseen:
        return Clustering(clusters, θ)
    return Clustering(clusters + (Cluster(id=UNSEEN_ID, devices=unseen),), _concat(θ, ω))
