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
                                               models.safetensors,
                                               checkpoints/t_<ttt>/state.json, state.safetensors
    <root>/data/unsupervised/metrics.json, curves.json
    <root>/data/unsupervised/<method>/seed_<s>/history.json, summary.json, communities.json,
                                               graph.json, community_models.safetensors
    <root>/metrics/metrics.json
    <root>/plots/accuracy.csv, accuracy.png, accuracy_vs_traffic.png,
                 support/edges.csv, support/<algorithm>.png,
                 continual/accuracy.csv, accuracy.png, clusters.png, clusters_<algorithm>.png,
                 unsupervised/iterations.csv, iterations.png, association_graph.png
    <root>/logs/wall_times.jsonl                   (untracked)
    <root>/checkpoints/coldstart/<algorithm>/seed_<s>/state.json, state.safetensors
                                                   (untracked; while the stage runs)

A stage that writes atomically asks for its files ``under`` its temporary folder.
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
class CheckpointFiles:
    """One finished timestep of a continual run (``clusterfed.continual.checkpoint``)."""

    dir: Path

    @property
    def meta(self) -> Path:
        return self.dir / "state.json"

    @property
    def tensors(self) -> Path:
        return self.dir / "state.safetensors"


def checkpoint_files(checkpoints: Path, t: int) -> CheckpointFiles:
    return CheckpointFiles(Path(checkpoints) / f"t_{t:03d}")


def saved_checkpoints(checkpoints: Path) -> list[CheckpointFiles]:
    """The checkpoints under ``checkpoints``, oldest first."""
    checkpoints = Path(checkpoints)
    return [CheckpointFiles(p) for p in sorted(checkpoints.glob("t_[0-9][0-9][0-9]"))] if checkpoints.is_dir() else []


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
class UnsupervisedFiles:
    """The outputs of one FedCRef method on one seed."""

    dir: Path

    @property
    def history(self) -> Path:
        return self.dir / "history.json"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"

    @property
    def communities(self) -> Path:
        return self.dir / "communities.json"

    @property
    def graph(self) -> Path:
        return self.dir / "graph.json"

    @property
    def models(self) -> Path:
        return self.dir / "community_models.safetensors"


@dataclass(frozen=True)
class UnsupervisedOutputs:
    """The ``unsupervised`` stage's folder: per-run files, metrics and mean curves."""

    dir: Path

    def run(self, method: str, seed: int) -> UnsupervisedFiles:
        return UnsupervisedFiles(self.dir / method / f"seed_{seed}")

    @property
    def metrics(self) -> Path:
        return self.dir / "metrics.json"

    @property
    def curves(self) -> Path:
        return self.dir / "curves.json"


@dataclass(frozen=True)
class PlotFiles:
    """The ``evaluate`` stage's plots (the names ``dvc.yaml`` declares)."""

    dir: Path

    @property
    def accuracy_csv(self) -> Path:
        return self.dir / "accuracy.csv"

    @property
    def accuracy_png(self) -> Path:
        return self.dir / "accuracy.png"

    @property
    def accuracy_vs_traffic_png(self) -> Path:
        return self.dir / "accuracy_vs_traffic.png"

    @property
    def support(self) -> Path:
        return self.dir / "support"

    @property
    def support_edges_csv(self) -> Path:
        return self.support / "edges.csv"

    def support_png(self, algorithm: str) -> Path:
        return self.support / f"{algorithm}.png"

    @property
    def continual(self) -> Path:
        return self.dir / "continual"

    @property
    def continual_accuracy_csv(self) -> Path:
        return self.continual / "accuracy.csv"

    @property
    def continual_accuracy_png(self) -> Path:
        return self.continual / "accuracy.png"

    @property
    def continual_clusters_png(self) -> Path:
        return self.continual / "clusters.png"

    def continual_assignments_png(self, algorithm: str) -> Path:
        return self.continual / f"clusters_{algorithm}.png"

    @property
    def unsupervised(self) -> Path:
        return self.dir / "unsupervised"

    @property
    def iterations_csv(self) -> Path:
        return self.unsupervised / "iterations.csv"

    @property
    def iterations_png(self) -> Path:
        return self.unsupervised / "iterations.png"

    @property
    def association_graph_png(self) -> Path:
        return self.unsupervised / "association_graph.png"


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
        """FedCRef's outputs (``clusterfed.stages.unsupervised``)."""
        return self.root / "data" / "unsupervised"

    def unsupervised_outputs(self, *, under: Path | None = None) -> UnsupervisedOutputs:
        return UnsupervisedOutputs(self.unsupervised if under is None else Path(under))

    @property
    def metrics(self) -> Path:
        return self.root / "metrics" / "metrics.json"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    def plot_files(self, *, under: Path | None = None) -> PlotFiles:
        return PlotFiles(self.plots if under is None else Path(under))

    @property
    def coldstart_checkpoints(self) -> Path:
        """Snapshots of the cold-start stage's fits, outside the tracked outputs: an
        interrupted stage resumes from them; it deletes them when it finishes."""
        return self.root / "checkpoints" / "coldstart"

    def coldstart_checkpoint(self, algorithm: str, seed: int) -> Path:
        return self.coldstart_checkpoints / algorithm / f"seed_{seed}"

    @property
    def wall_times(self) -> Path:
        """Timings, outside the tracked outputs (they differ between identical runs)."""
        return self.root / "logs" / "wall_times.jsonl"


@dataclass(frozen=True)
class SweepLayout:
    """A sweep's folders (``pipelines/sweep_flow.py``): one run per (scenario,
    algorithm, seed) sharing its scenario's partitions, and the comparison table.

    ::

        <root>/<scenario>/data/partitions/
        <root>/<scenario>/<algorithm>-seed<s>/   a RunLayout
        <root>/comparison.csv, .json, .md, .png
    """

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def scenario(self, scenario: str) -> RunLayout:
        return RunLayout(self.root / scenario)

    def run(self, scenario: str, algorithm: str, seed: int) -> RunLayout:
        return RunLayout(self.root / scenario / f"{algorithm}-seed{seed}", shared_partitions=self.scenario(scenario).partitions)

    def comparison(self, suffix: str) -> Path:
        """``suffix`` one of csv, json, md, png."""
        return self.root / f"comparison.{suffix}"
