"""One pipeline execution = one MLflow parent run; each stage and algorithm a nested run.

The tracker reads what the stages wrote (the files DVC tracks), so the same record
comes out whether the stages ran from ``dvc repro``, a Prefect flow or Python, and
tracking never changes a result. It talks to MLflow through an explicit
``MlflowClient`` and run ids, never the fluent "active run", so it is safe in
Prefect's worker threads and picklable to Dask workers.

Run tree::

    pipeline                          all of params.yaml, summary metrics
    ├── partition                     groups.json
    ├── coldstart                     model / training / coldstart params
    │   └── coldstart/<alg>/seed_<s>  per-round accuracy and n_clusters, final scores,
    │                                 clustering JSON, cluster models (registered)
    ├── continual                     (when the stage ran) one run per timestep
    └── evaluate                      metrics.json, plots
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from safetensors.torch import load_file

from clusterfed.config import Params
from clusterfed.evaluation import clustering_scores
from clusterfed.tracking import registry
from clusterfed.tracking.model_files import ModelSpec, cluster_state_dict, save_cluster_model
from clusterfed.tracking.store import ensure_experiment, experiment_name, tracking_uri

_BATCH = 900  # MLflow accepts at most 1000 metrics per log_batch


@dataclass(frozen=True)
class PipelineTracker:
    """Handle on a pipeline's parent run: plain data, recreated clients."""

    tracking_uri: str
    root: str
    experiment: str
    experiment_id: str
    run_id: str

    @classmethod
    def start(
        cls, params: Params, *, root: str | Path = ".", run_name: str = "pipeline", tags: dict[str, str] | None = None
    ) -> "PipelineTracker":
        """Open the parent run in the experiment of ``params`` and log every parameter."""
        uri = tracking_uri(root)
        client = MlflowClient(uri, uri)
        experiment = experiment_name(params)
        experiment_id = ensure_experiment(client, experiment, root)
        run = client.create_run(experiment_id, run_name=run_name, tags=tags or {})
        _log_params(client, run.info.run_id, _flatten(params.model_dump()))
        return cls(uri, str(Path(root).resolve()), experiment, experiment_id, run.info.run_id)

    @property
    def client(self) -> MlflowClient:
        return MlflowClient(self.tracking_uri, self.tracking_uri)

    def log_partition(self, params: Params, partitions_dir: str | Path) -> str:
        client, run_id = self.client, self._child("partition", self.run_id)
        sub = {"seeds": params.seeds, "data": params.data.model_dump(), "scenario": params.scenario.model_dump()}
        _log_params(client, run_id, _flatten(sub))
        client.log_artifact(run_id, str(Path(partitions_dir) / "groups.json"))
        client.set_terminated(run_id)
        return run_id

    def log_coldstart(
        self, params: Params, partitions_dir: str | Path, coldstart_dir: str | Path, *, register: bool = True
    ) -> list[registry.ServedModel]:
        """Nested run per algorithm and seed; every cluster model registered at timestep 0."""
        client, stage = self.client, self._child("coldstart", self.run_id)
        sub = {"model": params.model.model_dump(), "training": params.training.model_dump(), "coldstart": params.coldstart.model_dump()}
        _log_params(client, stage, _flatten(sub))
        served = []
        for algorithm in params.coldstart.algorithms:
            for seed in params.seeds:
                served += self.log_clustering(
                    params, partitions_dir, Path(coldstart_dir) / algorithm / f"seed_{seed}",
                    algorithm=algorithm, seed=seed, timestep=0, parent_run_id=stage, register=register,
                )
        client.set_terminated(stage)
        return served

    def log_continual(
        self, params: Params, partitions_dir: str | Path, continual_dir: str | Path, *, register: bool = True
    ) -> list[registry.ServedModel]:
        """Timesteps written as ``<continual_dir>/<alg>/seed_<s>/t<k>/`` (the coldstart file set).

        Registered in increasing k, so ``serving`` ends on the last timestep.
        """
        client, stage = self.client, self._child("continual", self.run_id)
        served = []
        for algorithm_dir in sorted(p for p in Path(continual_dir).iterdir() if p.is_dir()):
            for seed in params.seeds:
                steps = sorted(
                    (int(p.name[1:]), p) for p in (algorithm_dir / f"seed_{seed}").glob("t*")
                    if p.name[1:].isdigit() and (p / "clustering.json").is_file()
                )
                for timestep, run_dir in steps:
                    served += self.log_clustering(
                        params, partitions_dir, run_dir, algorithm=algorithm_dir.name, seed=seed,
                        timestep=timestep, parent_run_id=stage, register=register,
                    )
        client.set_terminated(stage)
        return served

    def log_clustering(
        self,
        params: Params,
        partitions_dir: str | Path,
        run_dir: str | Path,
        *,
        algorithm: str,
        seed: int,
        timestep: int,
        parent_run_id: str | None = None,
        register: bool = True,
    ) -> list[registry.ServedModel]:
        """Log one clustering result directory as a nested run and register its clusters.

        ``run_dir`` holds ``clustering.json``, ``device_accuracy.json``,
        ``models.safetensors`` (row i = ``clusters[i]``) and optionally ``history.json``.
        """
        run_dir = Path(run_dir)
        client = self.client
        name = f"coldstart/{algorithm}/seed_{seed}" if timestep == 0 else f"continual/{algorithm}/seed_{seed}/t{timestep}"
        run_id = self._child(name, parent_run_id or self.run_id)
        clustering = json.loads((run_dir / "clustering.json").read_text())
        device_accuracy = np.asarray(json.loads((run_dir / "device_accuracy.json").read_text()))
        meta, groups = _federation_meta(Path(partitions_dir) / f"seed_{seed}.npz")
        model_of_device = np.asarray(clustering["model_of_device"])

        _log_params(client, run_id, {"algorithm": algorithm, "seed": seed, "timestep": timestep})
        metrics = []
        if (run_dir / "history.json").is_file():
            for row in json.loads((run_dir / "history.json").read_text()):
                metrics += [("accuracy", row["accuracy"], row["round"]), ("n_clusters", row["n_clusters"], row["round"])]
        final = {"final_accuracy": float(device_accuracy.mean()), "final_n_clusters": clustering["n_clusters"]}
        final |= clustering_scores(groups, model_of_device)
        metrics += [(k, v, 0) for k, v in final.items()]
        _log_metrics(client, run_id, metrics)
        for file in ("clustering.json", "history.json", "device_accuracy.json"):
            if (run_dir / file).is_file():
                client.log_artifact(run_id, str(run_dir / file))

        stacked = load_file(str(run_dir / "models.safetensors"))
        base = {"experiment": self.experiment, "dataset": params.data.dataset, "scenario": params.scenario.name}
        with tempfile.TemporaryDirectory() as tmp:
            for cluster in clustering["clusters"]:
                spec = ModelSpec(
                    architecture=params.model.name,
                    input_shape=tuple(meta["input_shape"]),
                    n_classes=int(meta["n_classes"]),
                    hidden=params.model.hidden,
                    provenance={**base, "algorithm": algorithm, "seed": seed, "timestep": timestep, **cluster},
                )
                save_cluster_model(Path(tmp) / f"cluster-{cluster['id']}", cluster_state_dict(stacked, cluster["model_index"]), spec)
            client.log_artifacts(run_id, tmp, "models")

        versions = []
        if register:
            for cluster in clustering["clusters"]:
                accuracy = float(device_accuracy[cluster["devices"]].mean()) if cluster["devices"] else float("nan")
                versions.append(
                    registry.register_cluster(
                        client, run_id=run_id, artifact_path=f"models/cluster-{cluster['id']}",
                        experiment=self.experiment, algorithm=algorithm, seed=seed, timestep=timestep,
                        cluster=cluster, accuracy=accuracy,
                        extra_tags={**base, "pipeline_run_id": self.run_id},
                    )
                )
            registry.set_service_aliases(
                client, versions, experiment=self.experiment, algorithm=algorithm, seed=seed, timestep=timestep
            )
        client.set_terminated(run_id)
        return [registry.ServedModel.from_version(client.get_model_version(v.name, v.version)) for v in versions]

    def log_evaluate(self, metrics_path: str | Path, plots_dir: str | Path) -> str:
        """Per-algorithm summary metrics (``<alg>.accuracy`` …) on the stage and parent runs."""
        client, run_id = self.client, self._child("evaluate", self.run_id)
        summary = json.loads(Path(metrics_path).read_text())
        metrics = [
            (f"{algorithm}.{key}", value, 0)
            for algorithm, scores in summary.items()
            for key, value in scores.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        _log_metrics(client, run_id, metrics)
        _log_metrics(client, self.run_id, metrics)
        client.log_artifact(run_id, str(metrics_path))
        client.log_artifacts(run_id, str(plots_dir), "plots")
        client.set_terminated(run_id)
        return run_id

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status)

    def _child(self, name: str, parent_run_id: str) -> str:
        run = self.client.create_run(self.experiment_id, run_name=name, tags={MLFLOW_PARENT_RUN_ID: parent_run_id})
        return run.info.run_id


def track_outputs(
    params: Params,
    *,
    partitions_dir: str | Path,
    coldstart_dir: str | Path,
    metrics_path: str | Path,
    plots_dir: str | Path,
    continual_dir: str | Path | None = None,
    root: str | Path = ".",
    tags: dict[str, str] | None = None,
) -> PipelineTracker:
    """Log finished stage outputs as one pipeline run and register every cluster model."""
    tracker = PipelineTracker.start(params, root=root, tags=tags)
    try:
        tracker.log_partition(params, partitions_dir)
        tracker.log_coldstart(params, partitions_dir, coldstart_dir)
        if continual_dir is not None and Path(continual_dir).is_dir():
            tracker.log_continual(params, partitions_dir, continual_dir)
        tracker.log_evaluate(metrics_path, plots_dir)
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish()
    return tracker


def _federation_meta(path: Path) -> tuple[dict, np.ndarray]:
    """Input shape / class count and ground-truth groups, without loading the images."""
    with np.load(path, allow_pickle=False) as f:
        return json.loads(f["meta_json"].tobytes().decode()), f["groups"]


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _log_params(client: MlflowClient, run_id: str, values: dict[str, object]) -> None:
    params = [Param(k, json.dumps(v) if isinstance(v, (list, dict)) or v is None else str(v)) for k, v in values.items()]
    for i in range(0, len(params), 100):  # MLflow: at most 100 params per batch
        client.log_batch(run_id, params=params[i : i + 100])


def _log_metrics(client: MlflowClient, run_id: str, values: Iterable[tuple[str, float, int]]) -> None:
    now = int(time.time() * 1000)
    metrics = [Metric(key, float(value), now, int(step)) for key, value, step in values]
    for i in range(0, len(metrics), _BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + _BATCH])
