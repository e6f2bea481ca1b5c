"""The one typed schema of ``params.yaml``, validated once where work starts.

An unknown key, a wrong type or an out-of-range value stops the run before any
work, with a message naming the key (``ParamsError``); nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clusterfed.data import DATASETS

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
Probability = Annotated[float, Field(gt=0.0, lt=1.0)]
ALGORITHMS: tuple[str, ...] = ("faacl", "fedavg", "ifca", "local", "centralized")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Section):
    dataset: Literal[DATASETS] = "digits"  # type: ignore[valid-type]
    root: str | None = Field(None, description="Dataset root for file datasets (torchvision raw layout).")


class NoiseParams(_Section):
    gaussian_mean: float = 0.0
    gaussian_variance: Annotated[float, Field(ge=0.0)] = 0.4
    salt_pepper_density: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7


class ScarcityParams(_Section):
    scarce_fraction: Probability = 0.1
    changed_class: Annotated[int, Field(ge=0)] = 0


class ScenarioParams(_Section):
    name: Literal["S0", "S1", "S2", "A1", "A2"] = "S2"
    group_sizes: Annotated[list[PositiveInt], Field(min_length=1)] = [5, 5]
    samples_per_device: PositiveInt | None = None
    test_samples_per_device: PositiveInt | None = None
    val_fraction: Probability = 0.25
    noise: NoiseParams = NoiseParams()
    scarcity: ScarcityParams = ScarcityParams()


class ModelParams(_Section):
    name: Literal["mlp", "cnn"] = "mlp"
    hidden: PositiveInt = 128


class TrainingParams(_Section):
    lr: Annotated[float, Field(gt=0.0)] = 0.01
    l2: Annotated[float, Field(ge=0.0)] = 0.001
    batch_size: PositiveInt = 10
    local_epochs: PositiveInt = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"


class FAACLParams(_Section):
    alpha: Probability = 0.1
    epsilon: Annotated[float, Field(ge=0.0)] = 0.7
    variant: Literal["flat", "hierarchical"] = "flat"
    init_epochs: PositiveInt = 5
    max_rounds: PositiveInt = 20
    rounds_per_level: PositiveInt = 3


class IFCAParams(_Section):
    n_clusters: PositiveInt = 5


class ColdstartParams(_Section):
    algorithms: Annotated[list[Literal[ALGORITHMS]], Field(min_length=1)] = list(ALGORITHMS)  # type: ignore[valid-type]
    epochs: PositiveInt = 300
    faacl: FAACLParams = FAACLParams()
    ifca: IFCAParams = IFCAParams()

    @field_validator("algorithms")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"algorithms listed twice: {sorted({a for a in v if v.count(a) > 1})}")
        return v


CONTINUAL_ALGORITHMS: tuple[str, ...] = ("cfaacl", "feddrift", "fedprox_ewc", "fedavg")


class CFAACLParams(_Section):
    alpha: Probability = 0.1
    epsilon: Annotated[float, Field(ge=0.0)] = 0.5
    init_epochs: PositiveInt = 5
    max_rounds: PositiveInt = 20
    memory_samples: PositiveInt = 100


class FedDriftParams(_Section):
    delta: Annotated[float, Field(gt=0.0)] = 3.0
    drift_threshold: Annotated[float, Field(gt=0.0)] = 0.5
    init_epochs: PositiveInt = 5


class FedProxEWCParams(_Section):
    mu: Annotated[float, Field(ge=0.0)] = 0.01
    ewc_lambda: Annotated[float, Field(ge=0.0)] = 10.0


class ContinualParams(_Section):
    """Thesis ch. 4: T timesteps of new data per device, concepts from a schedule."""

    enabled: bool = True
    setting: Literal["sequential", "multitask"] = "multitask"
    timesteps: PositiveInt = 10
    block: PositiveInt = 2
    schedule: list[list[int]] | None = Field(
        None, description="Explicit devices x (timesteps + 1) concept matrix; overrides setting."
    )
    samples_per_device: PositiveInt | None = None
    test_samples_per_device: PositiveInt | None = None
    algorithms: Annotated[list[Literal[CONTINUAL_ALGORITHMS]], Field(min_length=1)] = list(CONTINUAL_ALGORITHMS)  # type: ignore[valid-type]
    epochs: PositiveInt = 100
    cfaacl: CFAACLParams = CFAACLParams()
    feddrift: FedDriftParams = FedDriftParams()
    fedprox_ewc: FedProxEWCParams = FedProxEWCParams()


class Params(_Section):
    """Every experiment parameter; one section per stage as in ``dvc.yaml``."""

    seeds: Annotated[list[Annotated[int, Field(ge=0, strict=True)]], Field(min_length=1)] = [10, 55, 2077]
    data: DataParams = DataParams()
    scenario: ScenarioParams = ScenarioParams()
    model: ModelParams = ModelParams()
    training: TrainingParams = TrainingParams()
    coldstart: ColdstartParams = ColdstartParams()
    continual: ContinualParams = ContinualParams()

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v


class ParamsError(ValueError):
    """params.yaml is invalid; the message names every offending key."""


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate ``path``; raise ``ParamsError`` naming each bad key."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    return parse_params(raw, source=str(path))


def parse_params(raw: object, *, source: str = "params") -> Params:
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping at the top level")
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            detail = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            got = "" if err["type"] == "extra_forbidden" else f" (got {err.get('input')!r})"
            lines.append(f"  {key}: {detail}{got}")
        raise ParamsError(f"{source}: invalid parameters\n" + "\n".join(lines)) from None
    if params.data.dataset != "digits" and params.data.root is None:
        raise ParamsError(f"{source}: data.root: required for dataset {params.data.dataset!r}")
    if params.continual.schedule is not None:
        from clusterfed.continual.schedules import validate_schedule

        try:
            validate_schedule(
                params.continual.schedule,
                n_devices=sum(params.scenario.group_sizes),
                timesteps=params.continual.timesteps,
                n_concepts=2,
            )
        except ValueError as exc:
            raise ParamsError(f"{source}: continual.{exc}") from None
    return params
