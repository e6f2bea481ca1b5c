"""The cold-start protocol: a method fills hooks, one driver owns the round loop.

As in Flower's ``Strategy``, the server loop is written once (:func:`run_coldstart`):
it samples the round's devices, asks the method which (model, device) pairs train
(``configure_round``), makes the one engine call, hands the result back
(``aggregate``), records accuracy, cluster count and traffic, advances the progress
bar and lets the method re-cluster (``recluster``). A method keeps what it learns in
its own typed state dataclass (fedjax's ``init``/``apply``) and its paper steps stay
pure functions in its module. A variant overrides as little as it can.

**Rejected uploads** (``engine/robust.py``): a device whose upload is rejected is, in
that round, a device that did not take part. ``Engine.train`` leaves the upload out of
the average, and with ``upload="each"`` the driver hands ``aggregate`` the accepted
uploads only, so nothing of the round — average, similarity, update norm, split test,
k-means++ seeding and its random draws, assignment — is computed from it. The device
keeps the model and cluster it was served (FeSEM: its last centre, centre 0 before its
first accepted upload; CFL: its cluster, outside the split statistics). The methods
that group every device once, in one round, from its upload place a device without an
accepted upload without it: FL+HC in a cluster of its own starting from the global
model, FedGroup in the group whose centroid is nearest a zero update. IFCA and
FedSoft choose a device's model from the server's losses on its data, not from an
upload. Its later uploads are screened like any other.

Every method declares its hyperparameters once (``hyperparameters``, a tuple of
:class:`~clusterfed.hyperparams.Param`); the constructor checks them and the
``params.yaml`` schema and the README table are built from the same declarations.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
import torch

from clusterfed.algorithms.base import History, generators, result_from, sample_participants
from clusterfed.algorithms.clustering import Clustering, ColdStartResult
from clusterfed.engine import Engine, StackedParams, Tally, TrainingConfig, Visit
from clusterfed.engine.local_sgd import LocalObjective, QuadraticPenalty
from clusterfed.engine.stacked import take
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.hyperparams import Param, check
from clusterfed.snapshot import load_snapshot, read_meta, save_snapshot, warn_stale

State = TypeVar("State")

#: Communication rounds of a cold start (``coldstart.rounds``): T of every paper.
ROUNDS = Param(
    "rounds", 300, "communication rounds of training (after the clustering rounds of methods that have them)",
    symbol="T", kind=int, gt=0,
)
#: Share of devices sampled each round (``training.participation``).
PARTICIPATION = Param(
    "participation", 1.0, "share of devices taking part in each round (FedClust R, FLACC c)",
    symbol="R", kind=float, gt=0.0, le=1.0,
)

#: Rounds between snapshots of a resumable fit (``coldstart.checkpoint_every``).
CHECKPOINT_EVERY = Param(
    "checkpoint_every", 25, "rounds between the snapshots an interrupted cold start resumes from",
    kind=int, gt=0,
)


class Method:
    """What both kinds share: a registry ``name``, declared ``hyperparameters`` and a
    keyword-only constructor that checks them (``ValueError`` naming the bad one)."""

    name: ClassVar[str]
    hyperparameters: ClassVar[tuple[Param, ...]] = ()
    #: Parameters every method of the kind takes from a shared params section.
    common: ClassVar[tuple[Param, ...]] = ()

    def __init__(self, **values: Any) -> None:
        for key, value in check(type(self).__name__, self.declared(), values).items():
            setattr(self, key, value)

    @classmethod
    def declared(cls) -> tuple[Param, ...]:
        return cls.common + cls.hyperparameters

    def __repr__(self) -> str:
        args = ", ".join(f"{p.name}={getattr(self, p.name)!r}" for p in self.declared())
        return f"{type(self).__name__}({args})"


@dataclass
class Context:
    """The randomness of one fit, passed down explicitly, and the ground truth that
    only the oracle (``centralized``) may read: each device's group and the devices
    each group's oracle model trains on (``Federation.oracle_pools``; None: the
    group's own devices)."""

    rng: np.random.Generator
    generator: torch.Generator
    ground_truth: np.ndarray | None = None
    oracle_pools: tuple[np.ndarray, ...] | None = None


@dataclass(frozen=True)
class RoundPlan:
    """One round's training: pair p trains row ``models[p]`` of ``params`` on device
    ``devices[p]``; ``upload="average"`` hands ``aggregate`` the |Z^train|-weighted
    averages (``Engine.train``), ``"each"`` every accepted pair's upload
    (``Engine.local_models``; the plan it receives then lists the accepted pairs only).

    ``bytes_down``/``bytes_up`` are the round's traffic and ``phase`` its label in the
    history (``"clustering"`` or ``"training"``). ``local_epochs``, ``penalty``, ``training``,
    ``data`` and ``objective`` (Per-FedAvg's or pFedMe's local step) pass through to
    the engine; ``pair_weight`` scales pair p's |Z^train| in the average (FAACL's
    ``supporter_weight``); ``visit="sequential"`` trains each model's pairs one after
    another, each from the previous pair's upload (``Engine.chained_models``).
    """

    params: StackedParams
    models: np.ndarray
    devices: np.ndarray
    bytes_down: int
    bytes_up: int
    phase: Literal["clustering", "training"] = "training"
    upload: Literal["average", "each"] = "average"
    local_epochs: int | None = None
    penalty: QuadraticPenalty | None = None
    training: TrainingConfig | None = None
    data: PaddedSplit | None = None
    pair_weight: np.ndarray | None = None
    objective: LocalObjective | None = None
    visit: Visit = "parallel"


class ColdStart(Method, Generic[State]):
    """A cold-start method: hooks over a typed ``State`` that :func:`run_coldstart` calls.

    Required: ``init``, ``configure_round``, ``aggregate``, ``clustering``. Optional:
    ``initial_round`` (a clustering round before the loop), ``recluster`` (after each
    round is recorded), ``finished`` (default: after ``rounds`` rounds), ``final``
    (the clustering returned), ``fitted`` (set learned ``*_`` attributes),
    ``expected_rounds`` (progress bar length).

    ``full_participation`` methods need every device in every round (config refuses
    ``training.participation`` < 1 for them); the others are given a sample.
    """

    kind: ClassVar[str] = "coldstart"
    common = (ROUNDS, PARTICIPATION)
    full_participation: ClassVar[bool] = False
    rounds: int
    participation: float

    # -- hooks -------------------------------------------------------------------
    def init(self, engine: Engine, ctx: Context) -> State:
        raise NotImplementedError

    def initial_round(self, engine: Engine, state: State) -> tuple[int, int] | None:
        """(bytes_down, bytes_up) of a clustering round made by ``init``, recorded
        before the first training round; None when ``init`` communicates nothing."""
        return None

    def finished(self, state: State, rounds_done: int) -> bool:
        return rounds_done >= self.rounds

    def configure_round(
        self, engine: Engine, state: State, participants: np.ndarray, ctx: Context
    ) -> tuple[State, RoundPlan]:
        raise NotImplementedError

    def aggregate(
        self, engine: Engine, state: State, plan: RoundPlan, trained: StackedParams, ctx: Context
    ) -> State:
        raise NotImplementedError

    def clustering(self, state: State) -> Clustering:
        """The clustering serving every device now (recorded each round)."""
        raise NotImplementedError

    def recluster(self, engine: Engine, state: State, ctx: Context) -> State:
        return state

    def final(self, engine: Engine, state: State, ctx: Context) -> Clustering:
        return self.clustering(state)

    def fitted(self, engine: Engine, state: State) -> None:
        """Keep learned attributes (``labels_``, …) for use after ``fit``."""

    def expected_rounds(self, n_devices: int) -> int:
        return self.rounds

    # -- the one entry point -----------------------------------------------------
    def fit(
        self, engine: Engine, *, seed: int, progress: bool = False, ground_truth: np.ndarray | None = None,
        oracle_pools: tuple[np.ndarray, ...] | None = None, checkpoint: Path | None = None,
        checkpoint_every: int = CHECKPOINT_EVERY.default, fingerprint: str = "",
    ) -> ColdStartResult:
        """Cluster the engine's federation and train a model per cluster (resumable
        through ``checkpoint``: see :func:`run_coldstart`)."""
        self.result_ = run_coldstart(
            self, engine, seed=seed, progress=progress, ground_truth=ground_truth, oracle_pools=oracle_pools,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, fingerprint=fingerprint,
        )
        return self.result_


def run_coldstart(
    method: ColdStart,
    engine: Engine,
    *,
    seed: int,
    progress: bool = False,
    ground_truth: np.ndarray | None = None,
    oracle_pools: tuple[np.ndarray, ...] | None = None,
    checkpoint: Path | None = None,
    checkpoint_every: int = CHECKPOINT_EVERY.default,
    fingerprint: str = "",
) -> ColdStartResult:
    """The shared round loop: sampling, the engine call, history, traffic, progress.

    With a ``checkpoint`` directory the fit snapshots everything it carries between
    rounds (the method's state, both random generators, the history, the tally of
    uploads; :mod:`clusterfed.snapshot`) after ``init``, after its first round and
    every ``checkpoint_every`` rounds; a rerun whose method, seed, federation size and
    ``fingerprint`` (what the caller's data and settings depend on) are the same
    resumes from it and ends with the same result as a run never interrupted. Any
    other snapshot there is ignored and overwritten. The last snapshot stays, so a
    finished fit reruns from it at once; the caller deletes it when done with it.
    """
    if checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1, got {checkpoint_every}")
    n = engine.n_devices
    key = _fingerprint(method, seed, n, fingerprint)
    saved = _resume(checkpoint, key, engine.device)
    rng, gen = generators(seed) if saved is None else (saved["rng"], saved["generator"])
    ctx = Context(rng=rng, generator=gen, ground_truth=ground_truth, oracle_pools=oracle_pools)
    with engine.tally() as fit:  # every engine call of the fit, hooks' included
        history = History(engine, method.name, method.expected_rounds(n), progress)
        if saved is None:
            with engine.tally() as screened:
                state = method.init(engine, ctx)
            first = method.initial_round(engine, state)
            if first is not None:
                history.record(
                    "clustering", method.clustering(state), bytes_down=first[0], bytes_up=first[1],
                    rejected_devices=screened.rejected_devices(),
                )
            done = 0
            if checkpoint is not None:  # an init can be long (FAACL's Alg. 1, FedClust's)
                _snapshot(checkpoint, key, state, ctx, done, history, fit)
        else:
            state, done = saved["state"], saved["done"]
            history.resume(saved["rows"])
            fit.resume(saved["uploads"], saved["rejected_by_device"])
        while not method.finished(state, done):
            with engine.tally() as screened:
                participants = (
                    np.arange(n) if method.full_participation else sample_participants(rng, n, method.participation)
                )
                state, plan = method.configure_round(engine, state, participants, ctx)
                if plan.upload == "average":
                    call = engine.train
                    extra = {"visit": plan.visit} if plan.visit != "parallel" else {}
                else:
                    call = engine.local_models if plan.visit == "parallel" else engine.chained_models
                    extra = {}
                if plan.pair_weight is not None:
                    extra["pair_weight"] = plan.pair_weight
                result = call(
                    plan.params, plan.models, plan.devices, gen,
                    local_epochs=plan.local_epochs, data=plan.data, penalty=plan.penalty, training=plan.training,
                    objective=plan.objective, **extra,
                )
                trained = result.params
                if plan.upload == "each" and result.n_rejected:  # hand on the accepted uploads only
                    keep = np.setdiff1d(np.arange(len(plan.devices)), result.rejected)
                    trained = take(trained, keep.tolist())
                    plan = replace(plan, models=plan.models[keep], devices=plan.devices[keep])
                state = method.aggregate(engine, state, plan, trained, ctx)
            history.record(
                plan.phase, method.clustering(state), bytes_down=plan.bytes_down, bytes_up=plan.bytes_up,
                rejected_devices=screened.rejected_devices(),
            )
            state = method.recluster(engine, state, ctx)  # its calls count in the fit, not in a round
            done += 1
            if checkpoint is not None and (done == 1 or done % checkpoint_every == 0 or method.finished(state, done)):
                _snapshot(checkpoint, key, state, ctx, done, history, fit)
        clustering = method.final(engine, state, ctx)
    method.fitted(engine, state)
    result = result_from(method.name, engine, clustering, history, fit)
    result.resumed_from_round = None if saved is None else saved["done"]
    return result


def _snapshot(checkpoint: Path, key: str, state: Any, ctx: Context, done: int, history: History, fit: Tally) -> None:
    save_snapshot(checkpoint, {
        "state": state, "rng": ctx.rng, "generator": ctx.generator, "done": done, "rows": history.rows,
        "uploads": fit.uploads, "rejected_by_device": fit.rejected_by_device,
    }, {"fingerprint": key, "round": done})


def _fingerprint(method: ColdStart, seed: int, n_devices: int, caller: str) -> str:
    """What a snapshot depends on besides the caller's data and settings: the method
    with its hyperparameters, the seed and the number of devices."""
    blob = json.dumps({"method": repr(method), "seed": seed, "n_devices": n_devices, "caller": caller})
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resume(checkpoint: Path | None, key: str, device: torch.device) -> dict | None:
    """The snapshot in ``checkpoint`` written under ``key``, if any, its GPU tensors on
    ``device`` (a snapshot taken on a GPU resumes on a CPU)."""
    if checkpoint is None:
        return None
    meta = read_meta(checkpoint)
    if meta is None:
        return None
    if meta.get("fingerprint") != key:
        warn_stale(checkpoint, "snapshot", "the next snapshot overwrites it")
        return None
    tree, _ = load_snapshot(checkpoint, device)
    return tree
