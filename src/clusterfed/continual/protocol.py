"""The continual protocol: a method fills per-timestep hooks, the driver owns time.

:func:`clusterfed.continual.driver.run_continual` runs timesteps 0..T, builds each
timestep's engine, checkpoints after every timestep, resumes, records the metric rows
and the progress bar. A method's timestep (``step``) is a template of three hooks
around the training rounds, which are written once (:func:`train_rounds`):

    arrive    devices got new data: detect drift, search concepts, re-cluster
    train     the rounds: every cluster model trains on its pairs, ``penalty`` pulling it
    remember  keep what the next timestep needs (memory, Fisher, losses)

The uploads the engine rejects in a timestep (``arrive``'s calls and the rounds')
reach the timestep's metric row through the driver's ``Engine.tally``. The cold
start (t = 0) starts from ``initial_state`` and runs the same timestep;
a method whose cold start is another algorithm (C-FAACL: FAACL) overrides
``cold_start``. ``FedProxEWC(ContinualFedAvg)`` overrides ``penalty`` and
``remember`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import ClassVar

from clusterfed.algorithms import Cluster, Clustering
from clusterfed.algorithms.base import generators
from clusterfed.algorithms.protocol import Context, Method
from clusterfed.continual.memory import Memory
from clusterfed.continual.state import ContinualState, timestep_seed
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.local_sgd import QuadraticPenalty
from clusterfed.hyperparams import Param

#: Training rounds per timestep (``continual.rounds``).
CONTINUAL_ROUNDS = Param(
    "rounds", 100, "communication rounds of training per timestep (Table B.4: 100 on MNIST)", kind=int, gt=0
)


def train_rounds(
    engine: Engine,
    clustering: Clustering,
    generator,
    rounds: int,
    penalty: Callable[[StackedParams], QuadraticPenalty | None] | None = None,
) -> Clustering:
    """``rounds`` rounds of thesis Alg. 4 on fixed pairs (each cluster with its
    supporters' devices); ``penalty(θ)`` gives each round's quadratic pull."""
    models, devices = clustering.training_pairs()
    for _ in range(rounds):
        pull = None if penalty is None else penalty(clustering.params)
        clustering = clustering.with_params(engine.train(clustering.params, models, devices, generator, penalty=pull).params)
    return clustering


class ContinualMethod(Method):
    """A continual method: ``cold_start`` at t = 0, ``step`` at each later timestep."""

    kind: ClassVar[str] = "continual"
    common = (CONTINUAL_ROUNDS,)
    rounds: int

    # -- hooks -------------------------------------------------------------------
    def initial_state(self, engine: Engine, ctx: Context) -> ContinualState:
        """Before t = 0: one model, initialised once, serving every device."""
        everyone = Cluster(0, frozenset(range(engine.n_devices)))
        params = engine.init_params(1, ctx.generator, distinct=False)
        return ContinualState(Clustering((everyone,), params), Memory.empty(engine.n_devices))

    def arrive(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        return state

    def penalty(self, state: ContinualState, params: StackedParams) -> QuadraticPenalty | None:
        return None

    def train(self, state: ContinualState, engine: Engine, t: int, ctx: Context) -> ContinualState:
        """The timestep's ``rounds`` training rounds: by default every cluster model
        trains on its pairs with ``penalty`` (:func:`train_rounds`). A method whose
        devices train other variables than the cluster models (APD, FedWeIT: decomposed
        parameters; Stable SGD: dropout and a per-timestep rate) overrides this."""
        clustering = train_rounds(engine, state.clustering, ctx.generator, self.rounds, lambda θ: self.penalty(state, θ))
        return replace(state, clustering=clustering)

    def remember(self, state: ContinualState, engine: Engine, t: int, seed: int) -> ContinualState:
        return state

    # -- what the driver calls -----------------------------------------------------
    def cold_start(self, engine: Engine, *, seed: int) -> ContinualState:
        rng, gen = generators(timestep_seed(seed, 0))
        return self.step(self.initial_state(engine, Context(rng, gen)), engine, t=0, seed=seed)

    def step(self, state: ContinualState, engine: Engine, *, t: int, seed: int) -> ContinualState:
        ctx = Context(*generators(timestep_seed(seed, t)))
        state = self.arrive(state, engine, t, ctx)
        return self.remember(self.train(state, engine, t, ctx), engine, t, seed)
