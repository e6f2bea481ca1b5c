"""From validated params to library objects: federation, engine, methods, schedule.

Pure construction (reading the dataset files aside); the stages (``clusterfed.stages``)
call these and own every file they write.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np

from clusterfed import registry
from clusterfed.algorithms import ColdStart
from clusterfed.config import THESIS_SCENARIOS, Params, ParamsError, continual_devices
from clusterfed.continual.protocol import ContinualMethod
from clusterfed.continual.schedules import make_schedule, validate_schedule
from clusterfed.continual.state import timestep_seed
from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.robust import RobustRule
from clusterfed.scenarios import (
    Federation,
    build_authors_scenario,
    build_partition,
    build_scenario,
    federation_from_concepts,
    federation_from_folder,
)


def build_federation(params: Params, seed: int) -> Federation:
    """The seed's federation: a thesis scenario (S0-A2), a paper partition or a custom
    folder, with ``description["newcomers"]`` naming the devices held out of it."""
    s = params.scenario
    if s.name == "custom":
        try:
            fed = federation_from_folder(s.path, val_fraction=s.val_fraction, seed=seed)
        except ValueError as exc:
            raise ParamsError(f"scenario.path: {exc}") from None
        return _hold_out_newcomers(fed, s.newcomers, seed)
    dataset = load_dataset(params.data.dataset, params.data.root, seed=seed)
    if s.construction == "authors":
        try:
            fed = build_authors_scenario(
                dataset, s.name, seed=seed, users=s.users, data_seed=s.data_seed, noise=s.noise,
                first_devices=s.first_devices, s1_out_of_range=s.s1_out_of_range,
            )
        except ValueError as exc:
            raise ParamsError(f"scenario: {exc}") from None
    elif s.name in THESIS_SCENARIOS:
        fed = build_scenario(
            dataset,
            s.name,
            group_sizes=s.group_sizes,
            seed=seed,
            samples_per_device=s.samples_per_device,
            test_samples_per_device=s.test_samples_per_device,
            val_fraction=s.val_fraction,
            noise=s.noise,
            scarcity=s.scarcity,
            s1_out_of_range=s.s1_out_of_range,
        )
    else:
        second = None if s.second_dataset is None else load_dataset(s.second_dataset, params.data.root, seed=seed)
        samples = tuple(s.samples_per_device) if isinstance(s.samples_per_device, list) else s.samples_per_device
        try:
            fed = build_partition(
                dataset, s.name, seed=seed, group_sizes=s.group_sizes, n_devices=s.n_devices,
                samples_per_device=samples, test_samples_per_device=s.test_samples_per_device,
                val_fraction=s.val_fraction, angles=s.angles, shifts=s.shifts, label_groups=s.label_groups,
                skew=s.skew, alpha=s.alpha, second_dataset=second,
            )
        except ValueError as exc:
            raise ParamsError(f"scenario: {exc}") from None
    return _hold_out_newcomers(fed, s.newcomers, seed)


def _hold_out_newcomers(fed: Federation, share: float, seed: int) -> Federation:
    k = int(round(share * fed.n_devices))
    if k:
        if k >= fed.n_devices:
            raise ParamsError(f"scenario.newcomers: {share} leaves no device in the federation")
        rng = np.random.default_rng([seed, 1])
        fed.description["newcomers"] = sorted(rng.choice(fed.n_devices, size=k, replace=False).tolist())
    return fed


def federated_devices(fed: Federation) -> list[int]:
    """Devices that take part in the federation (all but the newcomers)."""
    held = set(fed.description.get("newcomers", []))
    return [d for d in range(fed.n_devices) if d not in held]


def screening_rule(params: Params) -> RobustRule:
    """params.yaml's ``training.outlier_factor`` / ``clip_norm``: the rule of every
    upload the pipeline screens (the engine's, FedCRef's community FedAvg)."""
    return RobustRule(k=params.training.outlier_factor, clip_norm=params.training.clip_norm)


def build_engine(params: Params, federation: Federation) -> Engine:
    t = params.training
    return Engine(
        federation,
        model=params.model.name,
        hidden=params.model.hidden,
        conv_channels=params.model.conv_channels,
        kernel_size=params.model.kernel_size,
        training=TrainingConfig(lr=t.lr, l2=t.l2, batch_size=t.batch_size, local_epochs=t.local_epochs),
        device=t.device,
        screening=screening_rule(params),
        sparse_inputs=t.sparse_inputs,
    )


def build_algorithm(name: str, params: Params) -> ColdStart:
    """The registered cold-start method ``name`` with its ``coldstart.<name>`` section."""
    section = getattr(params.coldstart, name, None)
    values = {} if section is None else section.model_dump()
    return registry.get("coldstart", name)(
        rounds=params.coldstart.rounds, participation=params.training.participation, **values
    )


def build_continual_algorithm(name: str, params: Params) -> ContinualMethod:
    """The registered continual method ``name`` with its ``continual.<name>`` section."""
    section = getattr(params.continual, name, None)
    values = {} if section is None else section.model_dump()
    return registry.get("continual", name)(rounds=params.continual.rounds, **values)


def build_schedule(params: Params) -> np.ndarray:
    """The device x timestep concept matrix: explicit in params, or generated."""
    c = params.continual
    n_devices = continual_devices(params)
    if c.schedule is not None:
        return validate_schedule(c.schedule, n_devices=n_devices, timesteps=c.timesteps, n_concepts=2)
    return make_schedule(c.setting, n_devices, c.timesteps, block=c.block)


@cache
def code_digest() -> str:
    """Content hash of the clusterfed package's source: what a result computed by this
    code depends on besides its parameters (checkpoints, the Prefect cache key)."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        h.update(str(file.relative_to(root)).encode())
        h.update(file.read_bytes())
    return h.hexdigest()


def checkpoint_fingerprint(params: Params, algorithm: str | None = None, seed: int | None = None) -> str:
    """What a checkpoint depends on: resuming is refused if any of it changed (the
    parameters that matter, the method, the seed and the code: timesteps computed by
    other code are never mixed into a run, nor rows of another format). With no
    ``algorithm``: the cold-start stage's (the fit adds the method and the seed)."""
    stage = "continual" if algorithm is not None else "coldstart"
    relevant = params.model_dump(include={"data", "scenario", "model", "training", stage})
    relevant[stage].pop("algorithms")
    relevant[stage].pop("checkpoint_every", None)  # when snapshots are taken changes no result
    relevant["data"].pop("root")  # where the dataset's files lie, not which dataset: a moved copy resumes
    if params.model.name == "mlp":  # the MLP ignores the CNN's shape
        for key in ("conv_channels", "kernel_size"):
            relevant["model"].pop(key)
    blob = json.dumps({"params": relevant, "algorithm": algorithm, "seed": seed, "code": code_digest()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def timestep_engines(params: Params, schedule: np.ndarray, seed: int) -> Callable[[int], Engine]:
    """``engine_at(t)``: the engine over timestep t's new data, drawn for the concept
    the schedule gives each device (thesis §4.3); depends only on (seed, t), and under
    the authors' construction only on t and ``scenario.data_seed``."""
    c, s = params.continual, params.scenario
    dataset = load_dataset(params.data.dataset, params.data.root, seed=seed)

    def engine_at(t: int) -> Engine:
        if s.construction == "authors":
            fed = build_authors_scenario(
                dataset, s.name, seed=seed, users=s.users, data_seed=s.data_seed, concepts=schedule[:, t], timestep=t,
                noise=s.noise, first_devices=s.first_devices,
                s1_out_of_range=s.s1_out_of_range,
            )
        else:
            fed = federation_from_concepts(
                dataset, s.name, schedule[:, t], n_concepts=2, seed=timestep_seed(seed, t),
                samples_per_device=c.samples_per_device, test_samples_per_device=c.test_samples_per_device,
                val_fraction=s.val_fraction, noise=s.noise, scarcity=s.scarcity, s1_out_of_range=s.s1_out_of_range,
            )
        return build_engine(params, fed)

    return engine_at
