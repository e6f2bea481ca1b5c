"""Where a pipeline run writes: one type names every output path.

The DVC stages, the Prefect flows (each under its own root), MLflow tracking and the
continual checkpoints all take a :class:`RunLayout`, so the folder layout is spelled
out here and nowhere else.

::

    <root>/data/partitions/seed_<s>.npz, groups.json
    <root>/data/coldstart/<algorithm>/seed_<s>/clustering.json, history.json,
                                               device_accuracy.json, models.safetensors,
                                               rejections.json, newcomers.json
    <root>/data/continual/schedule.json
    <root>/data/continual/<algorithm>/seed_<s>/timesteps.json, final_clustering.json,
                                               models.safetensors, checkpoints/t_<ttt>/
    <root>/data/unsupervised/...                  (FedCRef, clusterfed.pipeline_unsupervised)
    <root>/metrics/metrics.json
    <root>/plots/
    <root>/logs/wall_times.jsonl                   (untracked)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ColdStartFiles:
    """The outputs of one cold-start method on one seed."""

    dir: Path

    @property
    def clustering(self) -> Path:
        return self.dir / "clustering.json"

    @property
    def history(self) -> Path:
        return self.dir / "history.json"

    @property
    def device_accuracy(self) -> Path:
        return self.dir / "device_accuracy.json"

    @property
    def models(self) -> Path:
        return self.dir / "models.safetensors"

    @property
    def rejections(self) -> Path:
        return self.dir / "rejections.json"

    @property
    def newcomers(self) -> Path:
        return self.dir / "newcomers.json"


@dataclass(frozen=True)
class ContinualFiles:
    """The outputs of one continual method on one seed."""

    dir: Path

    @property
    def timesteps(self) -> Path:
        return self.dir / "timesteps.json"

    @property
    def final_clustering(self) -> Path:
        return self.dir / "final_clustering.json"

    @property
    def models(self) -> Path:
        return self.dir / "models.safetensors"

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"


@dataclass(frozen=True)
class RunLayout:
    """Every output path of one pipeline run under ``root`` (``.`` for ``dvc repro``).

    ``shared_partitions`` points the run at another run's partitions (a sweep trains
    every algorithm and seed of a scenario on one set of federations)."""

    root: Path = Path(".")
    shared_partitions: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def partitions(self) -> Path:
        if self.shared_partitions is not None:
            return Path(self.shared_partitions)
        return self.root / "data" / "partitions"

    def partition(self, seed: int) -> Path:
        return self.partitions / f"seed_{seed}.npz"

    @property
    def groups(self) -> Path:
        return self.partitions / "groups.json"

    @property
    def coldstart(self) -> Path:
        return self.root / "data" / "coldstart"

    def coldstart_run(self, algorithm: str, seed: int, *, under: Path | None = None) -> ColdStartFiles:
        """``under`` replaces ``coldstart`` (a stage's temporary folder)."""
        return ColdStartFiles((self.coldstart if under is None else Path(under)) / algorithm / f"seed_{seed}")

    @property
    def continual(self) -> Path:
        return self.root / "data" / "continual"

    @property
    def schedule(self) -> Path:
        return self.continual / "schedule.json"

    def continual_run(self, algorithm: str, seed: int) -> ContinualFiles:
        return ContinualFiles(self.continual / algorithm / f"seed_{seed}")

    @property
    def unsupervised(self) -> Path:
        """FedCRef's outputs (``clusterfed.pipeline_unsupervised``)."""
        return self.root / "data" / "unsupervised"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics" / "metrics.json"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def wall_times(self) -> Path:
        """Timings, outside the tracked outputs (they differ between identical runs)."""
        return self.root / "logs" / "wall_times.jsonl"
