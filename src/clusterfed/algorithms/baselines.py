"""Baselines of thesis §3.3.1: Local, Centralized, FedAvg and IFCA.

Every method trains through the same engine (one ``Engine.train`` call per round)
and differs only in how devices are grouped and which devices take part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from clusterfed.algorithms.base import pair_traffic, sample_participants
from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import take
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.hyperparams import Param
from clusterfed.registry import register


class _FixedClusters(ColdStart[Clustering]):
    """Train one model per fixed device group for ``rounds`` rounds; each round a
    ``participation`` share of the devices takes part. State: the clustering."""

    def groups(self, n_devices: int) -> list[list[int]]:
        raise NotImplementedError

    def init(self, engine: Engine, ctx: Context) -> Clustering:
        groups = self.groups(engine.n_devices)
        clusters = tuple(Cluster(id=i, devices=frozenset(g)) for i, g in enumerate(groups))
        return Clustering(clusters, engine.init_params(len(groups), ctx.generator, distinct=False))

    def configure_round(self, engine, state, participants, ctx):
        models = state.model_of_device(engine.n_devices)[participants]
        return state, RoundPlan(state.params, models, participants, **pair_traffic(state.params, len(participants)))

    def aggregate(self, engine, state, plan, trained, ctx):
        return state.with_params(trained)

    def clustering(self, state: Clustering) -> Clustering:
        return state


@register
class Local(_FixedClusters):
    """No federation: every device trains its own model on its own data, so nothing
    is sent (0 bytes per round)."""

    name = "local"

    def groups(self, n_devices: int) -> list[list[int]]:
        return [[d] for d in range(n_devices)]

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        return state, replace(plan, bytes_down=0, bytes_up=0)


@register
class FedAvg(_FixedClusters):
    """FedAvg (McMahan et al., 2017): one model averaged over all devices.

    ``visit="sequential"`` is the global model of the StoCFL authors' code, which
    their Table 1 FedAvg row reads (Zeng et al., StoCFL, §3.2): the round's devices
    train one after another, each from the model the previous one returned, and the
    server averages the models of that sequence (``Engine.chained_models``).
    """

    name = "fedavg"
    hyperparameters = (
        Param("visit", "parallel", "how a round's devices train: all from the server's model (McMahan et al.), "
              "or one after another, each from the previous one's model, averaging that sequence "
              "(the StoCFL authors' global model)", kind=str, choices=("parallel", "sequential")),
    )
    visit: str = "parallel"  # subclasses that declare their own parameters keep it

    def groups(self, n_devices: int) -> list[list[int]]:
        return [list(range(n_devices))]

    def configure_round(self, engine, state, participants, ctx):
        state, plan = super().configure_round(engine, state, participants, ctx)
        return state, replace(plan, visit=self.visit)


@dataclass(frozen=True)
class PooledState:
    clustering: Clustering
    data: PaddedSplit


@register
class Centralized(ColdStart[PooledState]):
    """Oracle: one model per ground-truth group, trained on pooled data and serving
    the group's devices (the thesis tables' "Centralize" row, [1] cluster in S0 and
    [2] in S1–A2).

    It is the only method given the ground truth (``fit(..., ground_truth=groups,
    oracle_pools=fed.oracle_pools)``), as an upper reference. A group's model pools
    the training data of the group's devices, or of the devices the construction
    lists for it (the authors' A1: the noisy model trains on every device's data).
    """

    name = "centralized"
    full_participation = True

    def init(self, engine: Engine, ctx: Context) -> PooledState:
        if ctx.ground_truth is None:
            raise ValueError("centralized is the oracle: fit it with ground_truth=<group of each device>")
        groups = np.asarray(ctx.ground_truth)
        labels = np.unique(groups)
        clusters = tuple(
            Cluster(id=i, devices=frozenset(np.flatnonzero(groups == g).tolist())) for i, g in enumerate(labels)
        )
        pools = tuple(c.devices for c in clusters) if ctx.oracle_pools is None else ctx.oracle_pools
        if len(pools) != len(labels):
            raise ValueError(f"oracle_pools: {len(pools)} pools for {len(labels)} ground-truth groups")
        clustering = Clustering(clusters, engine.init_params(len(labels), ctx.generator, distinct=False))
        return PooledState(clustering, engine.pooled([np.sort(list(p)) for p in pools]))

    def configure_round(self, engine, state, participants, ctx):
        rows = np.arange(len(state.clustering.clusters))
        # The oracle pools raw data; its traffic is reported as FedAvg's within groups.
        traffic = pair_traffic(state.clustering.params, engine.n_devices)
        return state, RoundPlan(state.clustering.params, rows, rows, data=state.data, **traffic)

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, clustering=state.clustering.with_params(trained))

    def clustering(self, state: PooledState) -> Clustering:
        return state.clustering


@dataclass(frozen=True)
class IFCAState:
    params: StackedParams
    identity: np.ndarray  # the model each device took this round
    restart_bytes: tuple[int, int] | None = None  # (down, up) of the restart rounds


@register
class IFCA(ColdStart[IFCAState]):
    """IFCA (Ghosh et al., NeurIPS 2020, Alg. 1): k models; each round every sampled
    device takes the model with the lowest loss on its training data, and each model
    is averaged over the devices that took it (an empty cluster keeps its model).
    Devices not sampled keep the identity they last estimated (only sampled machines
    compute losses: with 4800 devices at 10 % the round costs a tenth).

    ``restarts`` R > 1 is the paper's "random initialization and multiple restarts"
    (§5): R random sets of k models each run ``restart_rounds`` rounds of Alg. 1, and
    the fit goes on from the set of lowest IFCA objective (1/m) Σ_i min_j F_i(θ_j)
    on every device's training data. (The authors' synthetic runs keep the best of
    10 training seeds by the distance to the true models, which a user cannot know.)
    The restart rounds' traffic is recorded as one clustering round before round 1."""

    name = "ifca"
    hyperparameters = (
        Param("n_clusters", 5, "number of cluster models k (the thesis' upper bound for fixed-k baselines, §3.3.4)",
              symbol="k", kind=int, gt=0),
        Param("restarts", 1, "random initialisations tried, the best kept (1: the paper's Alg. 1 alone)",
              kind=int, gt=0),
        Param("restart_rounds", 10, "rounds each restart runs before the best is chosen", kind=int, gt=0),
    )
    n_clusters: int
    restarts: int
    restart_rounds: int

    def init(self, engine: Engine, ctx: Context) -> IFCAState:
        if self.restarts == 1:
            return self._fresh(engine, ctx)
        down = up = 0
        best, best_objective = None, np.inf
        for _ in range(self.restarts):
            state = self._fresh(engine, ctx)
            for _ in range(self.restart_rounds):
                participants = sample_participants(ctx.rng, engine.n_devices, self.participation)
                state, plan = self.configure_round(engine, state, participants, ctx)
                trained = engine.train(plan.params, plan.models, plan.devices, ctx.generator).params
                state = self.aggregate(engine, state, plan, trained, ctx)
                down, up = down + plan.bytes_down, up + plan.bytes_up
            objective = float(engine.mean_losses(state.params, "train").min(0).values.mean())
            if objective < best_objective:
                best, best_objective = state, objective
        return IFCAState(best.params, best.identity, (down, up))

    def _fresh(self, engine: Engine, ctx: Context) -> IFCAState:
        params = engine.init_params(self.n_clusters, ctx.generator, distinct=True)
        return IFCAState(params, np.zeros(engine.n_devices, dtype=np.int64))

    def initial_round(self, engine: Engine, state: IFCAState) -> tuple[int, int] | None:
        return state.restart_bytes

    def configure_round(self, engine, state, participants, ctx):
        identity = state.identity.copy()
        identity[participants] = estimate_identity(engine, state.params, participants)
        traffic = pair_traffic(state.params, len(participants))
        traffic["bytes_down"] *= self.n_clusters  # each participant downloads all k models
        plan = RoundPlan(state.params, identity[participants], participants, **traffic)
        return replace(state, identity=identity), plan

    def aggregate(self, engine, state, plan, trained, ctx):
        return replace(state, params=trained)

    def clustering(self, state: IFCAState) -> Clustering:
        return used_clusters(state.identity, state.params)

    def final(self, engine, state, ctx):
        return used_clusters(estimate_identity(engine, state.params), state.params)


def estimate_identity(engine: Engine, params: StackedParams, devices: np.ndarray | None = None) -> np.ndarray:
    """IFCA's cluster identity: the model of lowest mean training loss on each of
    ``devices`` (default: every device)."""
    return engine.mean_losses(params, "train", devices=devices).argmin(0).cpu().numpy()


def used_clusters(identity: np.ndarray, params: StackedParams) -> Clustering:
    """The non-empty clusters only, so the cluster count is what devices use."""
    used = np.unique(identity)
    clusters = tuple(
        Cluster(id=int(k), devices=frozenset(np.flatnonzero(identity == k).tolist())) for k in used
    )
    return Clustering(clusters, take(params, used.tolist()))
