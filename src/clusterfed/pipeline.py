"""The pipeline's stages as functions: partition -> coldstart -> evaluate.

``stages/*.py`` (DVC), the CLI and orchestration call these same functions, so an
experiment runs identically from any of them. Each stage writes its outputs into a
temporary sibling and renames it into place at the end: a failed stage leaves
nothing half-written.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from safetensors.torch import save_file

from clusterfed.algorithms import FAACL, IFCA, Centralized, ColdStartResult, FedAvg, Local
from clusterfed.algorithms.base import ColdStartAlgorithm
from clusterfed.config import Params
from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.evaluation import clustering_scores, summarize_runs
from clusterfed.evaluation.plots import plot_accuracy
from clusterfed.scenarios import Federation, NoiseParams, ScarcityParams, build_scenario


def build_federation(params: Params, seed: int) -> Federation:
    dataset = load_dataset(params.data.dataset, params.data.root, seed=seed)
    s = params.scenario
    return build_scenario(
        dataset,
        s.name,
        group_sizes=s.group_sizes,
        seed=seed,
        samples_per_device=s.samples_per_device,
        test_samples_per_device=s.test_samples_per_device,
        val_fraction=s.val_fraction,
        noise=NoiseParams(**s.noise.model_dump()),
        scarcity=ScarcityParams(**s.scarcity.model_dump()),
    )


def build_engine(params: Params, federation: Federation) -> Engine:
    t = params.training
    return Engine(
        federation,
        model=params.model.name,
        hidden=params.model.hidden,
        training=TrainingConfig(lr=t.lr, l2=t.l2, batch_size=t.batch_size, local_epochs=t.local_epochs),
        device=t.device,
    )


def build_algorithm(name: str, params: Params, federation: Federation) -> ColdStartAlgorithm:
    c = params.coldstart
    if name == "faacl":
        return FAACL(epochs=c.epochs, **c.faacl.model_dump())
    if name == "ifca":
        return IFCA(n_clusters=c.ifca.n_clusters, epochs=c.epochs)
    if name == "fedavg":
        return FedAvg(epochs=c.epochs)
    if name == "local":
        return Local(epochs=c.epochs)
    if name == "centralized":
        return Centralized(federation.groups, epochs=c.epochs)
    raise ValueError(f"unknown algorithm {name!r}")


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def partition(params: Params, out_dir: Path) -> None:
    """Build one federation per seed: ``seed_<s>.npz`` and a readable ``groups.json``."""
    summary = {}
    with atomic_dir(out_dir) as tmp:
        for seed in params.seeds:
            fed = build_federation(params, seed)
            fed.save(tmp / f"seed_{seed}.npz")
            summary[str(seed)] = {
                "groups": fed.groups.tolist(),
                "n_train": [d.n_train for d in fed.devices],
                "n_val": [len(d.y_val) for d in fed.devices],
                "n_test": [len(d.y_test) for d in fed.devices],
            }
        _write_json(tmp / "groups.json", summary)


def coldstart(params: Params, partitions_dir: Path, out_dir: Path, *, progress: bool = True) -> None:
    """Run every configured algorithm on every seed's federation.

    Writes ``<algorithm>/seed_<s>/`` with ``clustering.json`` (devices and supportive
    clusters of each cluster), ``history.json`` (per-round accuracy),
    ``device_accuracy.json`` and ``models.safetensors`` (cluster models, no pickle).
    """
    with atomic_dir(out_dir) as tmp:
        for seed in params.seeds:
            fed = Federation.load(Path(partitions_dir) / f"seed_{seed}.npz")
            for name in params.coldstart.algorithms:
                engine = build_engine(params, fed)
                result = build_algorithm(name, params, fed).fit(engine, seed=seed, progress=progress)
                _write_result(result, tmp / name / f"seed_{seed}", seed)
                if progress:
                    print(
                        f"seed {seed:>5} {name:<12} accuracy {result.device_accuracy.mean():.4f}"
                        f"  clusters {result.n_clusters}",
                        flush=True,
                    )


def evaluate(
    params: Params, partitions_dir: Path, coldstart_dir: Path, metrics_path: Path, plots_dir: Path
) -> dict:
    """Summarise every algorithm over seeds into ``metrics.json`` and per-round plots."""
    metrics: dict[str, dict] = {}
    curves: dict[str, list[float]] = {}
    for name in params.coldstart.algorithms:
        runs, histories = [], []
        for seed in params.seeds:
            run_dir = Path(coldstart_dir) / name / f"seed_{seed}"
            clustering = json.loads((run_dir / "clustering.json").read_text())
            with np.load(Path(partitions_dir) / f"seed_{seed}.npz") as f:
                groups = f["groups"]
            model_of_device = np.asarray(clustering["model_of_device"])
            runs.append(
                {
                    "device_accuracy": json.loads((run_dir / "device_accuracy.json").read_text()),
                    "n_clusters": clustering["n_clusters"],
                    **clustering_scores(groups, model_of_device),
                }
            )
            histories.append([row["accuracy"] for row in json.loads((run_dir / "history.json").read_text())])
        metrics[name] = summarize_runs(runs)
        length = min(len(h) for h in histories)
        curves[name] = np.mean([h[:length] for h in histories], axis=0).tolist()

    metrics_path = Path(metrics_path)
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_dir(plots_dir) as tmp:
        (tmp / "accuracy").mkdir()
        for name, acc in curves.items():
            with open(tmp / "accuracy" / f"{name}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["round", "accuracy"])
                writer.writerows((r + 1, round(a, 6)) for r, a in enumerate(acc))
        plot_accuracy(
            curves,
            tmp / "accuracy.png",
            title=f"{params.data.dataset} {params.scenario.name}, mean over seeds {params.seeds}",
        )
    _write_json(metrics_path, metrics)
    return metrics


def _write_result(result: ColdStartResult, run_dir: Path, seed: int) -> None:
    run_dir.mkdir(parents=True)
    _write_json(run_dir / "clustering.json", {"seed": seed, **result.clustering_json()})
    _write_json(run_dir / "history.json", result.history)
    _write_json(run_dir / "device_accuracy.json", [round(float(a), 6) for a in result.device_accuracy])
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in result.params.items()},
        str(run_dir / "models.safetensors"),
        metadata={
            "algorithm": result.algorithm,
            "seed": str(seed),
            "cluster_ids": json.dumps([c.id for c in result.clusters]),
            "layout": "stacked: row i is the model of clusters[i] in clustering.json",
        },
    )


def _write_json(path: Path, obj: object) -> None:
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
