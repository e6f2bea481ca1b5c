"""The one typed schema of ``params.yaml``, validated once where work starts.

An unknown key, a wrong type or an out-of-range value stops the run before any
work, with a message naming the key (``ParamsError``); nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, create_model, field_validator

from clusterfed import declared, registry
from clusterfed.data import DATASETS
from clusterfed.hyperparams import Param, Section, markdown_table, section_model
from clusterfed.scenarios import NoiseParams, ScarcityParams
from clusterfed.scenarios.static import S1_OUT_OF_RANGE
from clusterfed.scenarios.authors import DATA_SEED, authors_devices, default_users

# The declarations are read from the methods' source, not imported (no torch here).
ROUNDS: Param = declared.value("clusterfed.algorithms.protocol", "ROUNDS")
PARTICIPATION: Param = declared.value("clusterfed.algorithms.protocol", "PARTICIPATION")
CHECKPOINT_EVERY: Param = declared.value("clusterfed.algorithms.protocol", "CHECKPOINT_EVERY")
CONTINUAL_ROUNDS: Param = declared.value("clusterfed.continual.protocol", "CONTINUAL_ROUNDS")
# the screening defaults' one home is engine/robust.py (read from its source: no torch here)
OUTLIER_FACTOR: float | None = declared.value("clusterfed.engine.robust", "OUTLIER_FACTOR")
CLIP_NORM: float | None = declared.value("clusterfed.engine.robust", "CLIP_NORM")
MAX_REJECTED_SHARE: float = declared.value("clusterfed.engine.robust", "MAX_REJECTED_SHARE")
FEDCREF_HYPERPARAMETERS: tuple[Param, ...] = declared.value("clusterfed.algorithms.fedcref.fedcref", "HYPERPARAMETERS")

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
Probability = Annotated[float, Field(gt=0.0, lt=1.0)]
THESIS_SCENARIOS: tuple[str, ...] = ("S0", "S1", "S2", "A1", "A2")
PARTITIONS: tuple[str, ...] = (
    "rotated", "shifted", "label_groups", "label_pairs", "label_swapped", "grouped_rotated", "hybrid",
    "label_skew", "dirichlet",
)


_Section = Section


class DataParams(_Section):
    dataset: Literal[DATASETS] = "digits"  # type: ignore[valid-type]
    root: str | None = Field(None, description="Dataset root for file datasets (torchvision raw layout).")


class ScenarioParams(_Section):
    """Thesis scenarios S0-A2 (``group_sizes`` devices per group) or the partitions of
    FedClust / StoCFL / FLACC (``scenarios/partitions.py``)."""

    name: Literal[THESIS_SCENARIOS + PARTITIONS + ("custom",)] = "S2"  # type: ignore[valid-type]
    construction: Literal["thesis", "authors"] = Field(
        "thesis",
        description="S1-A2 as the thesis text reads (group_sizes devices, [0, 1] pixels) or as the "
        "authors' code builds them (FedProx users, standardised pixels; scenarios/authors.py), "
        "cold start and continual (each device keeps its users, new images per timestep).",
    )
    users: PositiveInt | None = Field(
        None, description="Authors' construction: FedProx users (10 per device, A2 20); default 1000 on MNIST, 100 on digits."
    )
    data_seed: NonNegativeInt = Field(
        DATA_SEED,
        description="Authors' construction: seed of the FedProx users' power-law draw and splits (theirs: 0 on "
        "every device; FedProx's generator itself is unseeded). The run seed never changes these data.",
    )
    first_devices: PositiveInt | None = Field(
        None,
        description="Authors' construction: keep only the first N devices of the federation (their FAACL "
        "--samplesize; thesis Table 3.7's MNIST runs: 20). null: every device.",
    )
    path: str | None = Field(
        None, description="custom only: folder of one .npz per device (clusterfed.scenarios.custom)."
    )
    group_sizes: Annotated[list[PositiveInt], Field(min_length=1)] = [5, 5]
    n_devices: PositiveInt | None = Field(None, description="Devices of label_skew / dirichlet.")
    samples_per_device: PositiveInt | Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] | None = None
    test_samples_per_device: PositiveInt | None = None
    val_fraction: Probability = 0.25
    newcomers: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(
        0.0, description="Share of devices held out of the federation and assigned to a cluster after it."
    )
    noise: NoiseParams = NoiseParams()
    scarcity: ScarcityParams = ScarcityParams()
    s1_out_of_range: Literal[S1_OUT_OF_RANGE] = Field(  # type: ignore[valid-type]
        "relabel", description="S1: a device's samples outside its label range get a random label (relabel: "
        "the authors' cold-start code; in-range under the thesis construction, any class under the authors') or "
        "it holds only in-range samples (exclusive: the thesis text, §3.3.2)."
    )
    angles: list[int] = [0, 90, 180, 270]
    shifts: list[int] = [0, 3, 6, 9]
    label_groups: list[list[Annotated[int, Field(ge=0)]]] = [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9]]
    skew: Probability = 0.2
    alpha: Annotated[float, Field(gt=0.0)] = 0.1
    second_dataset: Literal[DATASETS] | None = None  # type: ignore[valid-type]

    @field_validator("samples_per_device")
    @classmethod
    def _range(cls, v):
        if isinstance(v, list) and v[0] > v[1]:
            raise ValueError(f"range [low, high] needs low <= high, got {v}")
        return v


class ModelParams(_Section):
    name: Literal["mlp", "cnn"] = "mlp"
    hidden: PositiveInt = 128
    # Same defaults as clusterfed.models.CONV_CHANNELS / KERNEL_SIZE, written out so
    # that loading params does not import torch (a test keeps them equal).
    conv_channels: tuple[PositiveInt, PositiveInt] = Field(
        (16, 32), description="CNN only: channels of its two convolutions (FLACC's MNIST CNN: [32, 64])."
    )
    kernel_size: PositiveInt = Field(3, description="CNN only: odd convolution kernel size (FLACC: 5).")

    @field_validator("kernel_size")
    @classmethod
    def _odd(cls, v):
        if v % 2 == 0:
            raise ValueError(f"kernel_size must be odd (convolutions keep the image size), got {v}")
        return v


class TrainingParams(_Section):
    lr: Annotated[float, Field(gt=0.0)] = 0.01
    l2: Annotated[float, Field(ge=0.0)] = 0.001
    batch_size: PositiveInt = 10
    local_epochs: PositiveInt = 1
    participation: PARTICIPATION.annotation() = PARTICIPATION.field()[1]  # type: ignore[valid-type]
    device: Literal["auto", "cpu", "cuda"] = "auto"
    sparse_inputs: bool = Field(
        False, description="MLP on CPU: local SGD (plain or with a uniform proximal pull) reads and updates only the first "
        "layer's weights at the inputs "
        "that differ from their feature's most common value (engine/sparse_mlp.py); the same steps up to float "
        "rounding, faster on MNIST (raw or standardised)."
    )
    outlier_factor: Annotated[float, Field(gt=1.0)] | None = Field(
        OUTLIER_FACTOR, description="k: an upload is rejected when its update norm exceeds k x the median of the "
        "round's other updates (engine/robust.py); null: only non-finite uploads are rejected."
    )
    clip_norm: Annotated[float, Field(gt=0.0)] | None = Field(
        CLIP_NORM, description="Clip every accepted update to this norm; null: no clipping."
    )
    max_rejected_share: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        MAX_REJECTED_SHARE, description="A cold-start, continual or FedCRef run fails, naming the devices, when more of its uploads are rejected."
    )


class EvaluateParams(_Section):
    target_accuracy: Probability = Field(
        0.9, description="Rounds and bytes to reach this mean device test accuracy (FedClust Tables 4-5)."
    )


def _unique(v: list[str]) -> list[str]:
    if len(set(v)) != len(v):
        raise ValueError(f"algorithms listed twice: {sorted({a for a in v if v.count(a) > 1})}")
    return v


def _algorithm_section(kind: str, doc: str, common: tuple[Param, ...], fields: dict) -> type[_Section]:
    """The section of one kind of method, derived from the registry: ``algorithms``
    (the registered names), the kind's common parameters, and one subsection per
    method that declares hyperparameters, named after the method."""
    found = registry.declarations(kind)
    names = tuple(found)
    default = list(registry.declarations(kind, builtin_only=True))
    algorithms = Annotated[list[Literal[names]], Field(min_length=1), AfterValidator(_unique)]  # type: ignore[valid-type]
    sections = {
        name: (section_model(f"{d.qualname}Params", d.hyperparameters), section_model(f"{d.qualname}Params", d.hyperparameters)())
        for name, d in found.items() if d.hyperparameters
    }
    return create_model(
        f"{kind.capitalize()}Params", __base__=_Section, __doc__=doc,
        algorithms=(algorithms, default), **{p.name: p.field() for p in common}, **fields, **sections,
    )


ColdstartParams = _algorithm_section(
    "coldstart", "Cold-start methods (registry kind ``coldstart``) and their hyperparameters.",
    (ROUNDS, CHECKPOINT_EVERY), {},
)

CONTINUAL_ALGORITHMS: tuple[str, ...] = tuple(registry.declarations("continual"))

ContinualParams = _algorithm_section(
    "continual",
    "Thesis ch. 4: T timesteps of new data per device, concepts from a schedule.",
    (CONTINUAL_ROUNDS,),
    {
        "enabled": (bool, True),
        "setting": (Literal["sequential", "multitask"], "multitask"),
        "timesteps": (PositiveInt, 10),
        "block": (PositiveInt, 2),
        "schedule": (list[list[int]] | None, Field(
            None, description="Explicit devices x (timesteps + 1) concept matrix; overrides setting."
        )),
        "samples_per_device": (PositiveInt | None, None),
        "test_samples_per_device": (PositiveInt | None, None),
    },
)


UNSUPERVISED_METHODS: tuple[str, ...] = ("fedcref", "perfect", "local")


FedCRefSection = section_model("FedCRefParams", FEDCREF_HYPERPARAMETERS)


class UnsupervisedParams(_Section):
    """fedcref §5.2: unlabelled clients with K_i ∈ [2, |U|/2] categories of S samples."""

    enabled: bool = True
    dataset: Literal[DATASETS] = "digits"  # type: ignore[valid-type]
    n_clients: Annotated[int, Field(ge=2, strict=True)] = 10
    samples_per_category: PositiveInt = 60
    overlap: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    initial: Literal["dirty", "kmeans", "dec", "dec_paper"] = Field(
        "dirty", description="Initial local clustering: dirty uniform, k-means on an AE embedding, DEC (small "
        "d-256-64-10) or DEC with the original d-500-500-2000-10 encoder (dec_paper).",
    )
    dirtiness: Annotated[float, Field(ge=0.0, le=1.0)] = 0.3
    methods: Annotated[list[Literal[UNSUPERVISED_METHODS]], Field(min_length=1)] = list(UNSUPERVISED_METHODS)  # type: ignore[valid-type]
    fedcref: FedCRefSection = Field(  # type: ignore[valid-type]
        FedCRefSection(), description="FedCRef (fedcref Alg. 1-2): α, θ, τ written alpha, theta, tau."
    )


class Params(_Section):
    """Every experiment parameter; one section per stage as in ``dvc.yaml``."""

    seeds: Annotated[list[Annotated[int, Field(ge=0, strict=True)]], Field(min_length=1)] = [10, 55, 2077]
    data: DataParams = DataParams()
    scenario: ScenarioParams = ScenarioParams()
    model: ModelParams = ModelParams()
    training: TrainingParams = TrainingParams()
    coldstart: ColdstartParams = ColdstartParams()
    continual: ContinualParams = ContinualParams()
    evaluate: EvaluateParams = EvaluateParams()
    unsupervised: UnsupervisedParams = UnsupervisedParams()

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v


class ParamsError(ValueError):
    """params.yaml is invalid; the message names every offending key."""


def _cross_checks(params: Params) -> list[str]:
    """Rules that involve more than one key, each naming the key to change."""
    out = []
    s, c = params.scenario, params.continual
    uses_root = params.data.dataset != "digits" or (s.second_dataset not in (None, "digits"))
    if uses_root and params.data.root is None:
        out.append(f"data.root: required for dataset {params.data.dataset!r}")
    u = params.unsupervised
    if u.enabled and u.dataset != "digits" and params.data.root is None:
        out.append(f"data.root: required for unsupervised.dataset {u.dataset!r}")
    if s.name in ("label_skew", "dirichlet") and s.n_devices is None:
        out.append(f"scenario.n_devices: required for scenario {s.name!r}")
    if s.name == "hybrid" and s.second_dataset is None:
        out.append("scenario.second_dataset: required for scenario 'hybrid'")
    if s.name in THESIS_SCENARIOS and isinstance(s.samples_per_device, list):
        out.append(f"scenario.samples_per_device: scenario {s.name} takes one number, not a range")
    if params.training.participation < 1.0:
        full = [a for a in params.coldstart.algorithms if registry.declarations("coldstart")[a].full_participation]
        if full:
            out.append(
                f"coldstart.algorithms: {full} need every device in every round "
                f"(training.participation is {params.training.participation})"
            )
    if s.s1_out_of_range != "relabel" and s.name != "S1":
        out.append(f"scenario.s1_out_of_range: read only by scenario S1, not {s.name!r}")
    if s.construction != "authors" and s.data_seed != DATA_SEED:
        out.append(f"scenario.data_seed: read only by the authors' construction, not {s.construction!r} "
                   "(the thesis reading draws its data from the run seed)")
    if s.construction != "authors" and s.first_devices is not None:
        out.append(f"scenario.first_devices: read only by the authors' construction, not {s.construction!r} "
                   "(the thesis reading sets its devices with group_sizes)")
    if s.construction == "authors":
        if s.name not in ("S1", "S2", "A1", "A2"):
            out.append(f"scenario.construction: the authors' construction builds S1, S2, A1, A2, not {s.name!r}")
        else:
            try:
                continual_devices(params)
            except ValueError as exc:
                out.append(str(exc))
    if s.name == "custom" and s.path is None:
        out.append("scenario.path: required for scenario 'custom' (a folder of one .npz file per device)")
    if s.name != "custom" and s.path is not None:
        out.append(f"scenario.path: only read by scenario 'custom', not {s.name!r}")
    if c.enabled and s.name not in ("S1", "S2", "A1", "A2"):
        out.append(f"continual.enabled: continual concepts come from S1, S2, A1, A2, not {s.name!r}")
    return out


def continual_devices(params: Params) -> int:
    """Devices of the continual scenario: ``scenario.group_sizes`` summed, or under the
    authors' construction the devices its FedProx users make, or the first
    ``scenario.first_devices`` of them (ValueError naming ``scenario.users`` or
    ``scenario.first_devices`` when they cannot)."""
    s = params.scenario
    if s.construction == "authors":
        users = default_users(params.data.dataset) if s.users is None else s.users
        return authors_devices(s.name, users, s.first_devices)
    return sum(s.group_sizes)


def load_params(path: str | Path = "params.yaml", *, overrides: dict[str, object] | None = None) -> Params:
    """Read and validate ``path``, with dotted-key ``overrides`` applied first (as
    ``dvc exp run -S key=value``, the Prefect flows); raise ``ParamsError`` naming
    each bad key."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    for key, value in (overrides or {}).items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_params(raw, source=str(path) + (f" with overrides {overrides}" if overrides else ""))


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
    problems = _cross_checks(params)
    if problems:
        raise ParamsError(f"{source}: invalid parameters\n" + "\n".join(f"  {p}" for p in problems))
    if params.continual.schedule is not None:
        from clusterfed.continual.schedules import validate_schedule

        try:
            validate_schedule(
                params.continual.schedule,
                n_devices=continual_devices(params),
                timesteps=params.continual.timesteps,
                n_concepts=2,
            )
        except ValueError as exc:
            raise ParamsError(f"{source}: continual.{exc}") from None
    return params


TABLE_START = "<!-- params-table: generated by `clusterfed params-doc --write README.md`; do not edit -->"
TABLE_END = "<!-- params-table end -->"


def params_table() -> str:
    """The README's table of every method parameter, from the declarations."""
    rows = [("training.participation", PARTICIPATION), ("coldstart.rounds", ROUNDS),
            ("coldstart.checkpoint_every", CHECKPOINT_EVERY)]
    for name, d in registry.declarations("coldstart").items():
        rows += [(f"coldstart.{name}.{p.name}", p) for p in d.hyperparameters]
    rows.append(("continual.rounds", CONTINUAL_ROUNDS))
    for name, d in registry.declarations("continual").items():
        rows += [(f"continual.{name}.{p.name}", p) for p in d.hyperparameters]
    rows += [(f"unsupervised.fedcref.{p.name}", p) for p in FEDCREF_HYPERPARAMETERS]
    return markdown_table(rows)


def with_params_table(text: str) -> str:
    """``text`` (the README) with the table between its markers regenerated."""
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"the README lacks the markers {TABLE_START!r} … {TABLE_END!r}")
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_START}\n{params_table()}{TABLE_END}{tail}"
