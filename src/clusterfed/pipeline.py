"""The pipeline's stages as functions: partition -> coldstart -> continual -> evaluate.

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
from clusterfed.continual.baselines import ContinualFedAvg, FedDrift, FedProxEWC
from clusterfed.continual.cfaacl import CFAACL
from clusterfed.continual.driver import concept_reuse_rate, run_continual
from clusterfed.continual.schedules import make_schedule, validate_schedule
from clusterfed.continual.state import ContinualAlgorithm, timestep_seed
from clusterfed.evaluation import mean_stderr
from clusterfed.evaluation.plots import plot_assignments, plot_curves
from clusterfed.scenarios import (
    Federation,
    NoiseParams,
    ScarcityParams,
    build_scenario,
    federation_from_concepts,
)


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


def build_schedule(params: Params) -> np.ndarray:
    """The device x timestep concept matrix: explicit in params, or generated."""
    c = params.continual
    n_devices = sum(params.scenario.group_sizes)
    if c.schedule is not None:
        return validate_schedule(c.schedule, n_devices=n_devices, timesteps=c.timesteps, n_concepts=2)
    return make_schedule(c.setting, n_devices, c.timesteps, block=c.block)


def build_continual_algorithm(name: str, params: Params) -> ContinualAlgorithm:
    c = params.continual
    if name == "cfaacl":
        return CFAACL(epochs=c.epochs, **c.cfaacl.model_dump())
    if name == "feddrift":
        return FedDrift(epochs=c.epochs, **c.feddrift.model_dump())
    if name == "fedprox_ewc":
        return FedProxEWC(epochs=c.epochs, **c.fedprox_ewc.model_dump())
    if name == "fedavg":
        return ContinualFedAvg(epochs=c.epochs)
    raise ValueError(f"unknown continual algorithm {name!r}")


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


def continual(params: Params, out_dir: Path, *, progress: bool = True, stop_after: int | None = None) -> None:
    """Run every continual algorithm through timesteps 0..T for every seed.

    Devices get new data at every timestep, drawn for the concept the schedule gives
    them. Each finished timestep is checkpointed under
    ``<algorithm>/seed_<s>/checkpoints/``; rerunning after an interruption resumes
    from the last finished timestep (only if the parameters are unchanged) and ends
    with the same result. Results: ``timesteps.json`` (per-timestep metrics, the
    cluster of every device), ``final_clustering.json`` and ``models.safetensors``.
    """
    out_dir = Path(out_dir)
    c = params.continual
    schedule = build_schedule(params)
    _write_json_atomic(out_dir / "schedule.json", schedule.tolist())
    s = params.scenario
    for seed in params.seeds:
        dataset = load_dataset(params.data.dataset, params.data.root, seed=seed)

        def engine_at(t: int, seed: int = seed, dataset=dataset) -> Engine:
            fed = federation_from_concepts(
                dataset, s.name, schedule[:, t], n_concepts=2, seed=timestep_seed(seed, t),
                samples_per_device=c.samples_per_device, test_samples_per_device=c.test_samples_per_device,
                val_fraction=s.val_fraction, noise=NoiseParams(**s.noise.model_dump()),
                scarcity=ScarcityParams(**s.scarcity.model_dump()),
            )
            return build_engine(params, fed)

        for name in c.algorithms:
            run_dir = out_dir / name / f"seed_{seed}"
            fingerprint = _fingerprint(params, name, seed)
            rows, state = run_continual(
                build_continual_algorithm(name, params), engine_at, schedule, seed=seed,
                checkpoint_dir=run_dir / "checkpoints", fingerprint=fingerprint,
                progress=progress, stop_after=stop_after,
            )
            if rows[-1]["t"] < c.timesteps:
                return  # stopped early on request: checkpoints only
            summary = {
                "accuracy": float(np.mean([r["accuracy"] for r in rows[1:]])),
                "concept_reuse_rate": concept_reuse_rate(rows, schedule, state.memory.resolve),
                "n_clusters": [r["n_clusters"] for r in rows],
            }
            _write_json_atomic(run_dir / "timesteps.json", {"summary": summary, "rows": rows})
            final = {
                "clusters": [
                    {"id": k.id, "model_index": i, "devices": sorted(k.devices), "supportive_clusters": sorted(k.sup)}
                    for i, k in enumerate(state.clustering.clusters)
                ],
                "cluster_of_device": rows[-1]["cluster_of_device"],
            }
            _write_json_atomic(run_dir / "final_clustering.json", final)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in state.clustering.params.items()},
                str(run_dir / "models.safetensors"),
                metadata={"algorithm": name, "seed": str(seed), "timestep": str(rows[-1]["t"])},
            )
            if progress:
                print(
                    f"seed {seed:>5} {name:<12} mean accuracy over t=1..{c.timesteps} "
                    f"{summary['accuracy']:.4f}  concept reuse {summary['concept_reuse_rate']}",
                    flush=True,
                )


def evaluate(
    params: Params,
    partitions_dir: Path,
    coldstart_dir: Path,
    metrics_path: Path,
    plots_dir: Path,
    continual_dir: Path | None = None,
) -> dict:
    """Summarise every algorithm over seeds into ``metrics.json`` (sections
    ``coldstart`` and ``continual``) and plots."""
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
        plot_curves(
            curves,
            tmp / "accuracy.png",
            xlabel="communication round",
            ylabel="mean device test accuracy",
            title=f"{params.data.dataset} {params.scenario.name}, mean over seeds {params.seeds}",
            first_x=1,
            ylim=(0, 1),
        )
        report = {"coldstart": metrics}
        if continual_dir is not None and params.continual.enabled:
            report["continual"] = _evaluate_continual(params, Path(continual_dir), tmp)
    _write_json(metrics_path, report)
    return report


def _evaluate_continual(params: Params, continual_dir: Path, plots: Path) -> dict:
    """Mean accuracy on the current concept per timestep and over t = 1..T (the
    thesis tables' figure), clusters per timestep, concept-reuse rate; plots."""
    out: dict[str, dict] = {}
    accuracy_curves, cluster_curves = {}, {}
    (plots / "continual").mkdir()
    for name in params.continual.algorithms:
        runs = [
            json.loads((continual_dir / name / f"seed_{seed}" / "timesteps.json").read_text())
            for seed in params.seeds
        ]
        per_t = np.mean([[r["accuracy"] for r in run["rows"]] for run in runs], axis=0)
        clusters_t = np.mean([[r["n_clusters"] for r in run["rows"]] for run in runs], axis=0)
        mean, stderr = mean_stderr([run["summary"]["accuracy"] for run in runs])
        reuse = [run["summary"]["concept_reuse_rate"] for run in runs]
        out[name] = {
            "accuracy": mean,
            "accuracy_stderr": stderr,
            "accuracy_per_timestep": [round(float(a), 6) for a in per_t],
            "n_clusters_per_timestep": [float(k) for k in clusters_t],
            "concept_reuse_rate": None if reuse[0] is None else float(np.mean(reuse)),
            "n_seeds": len(runs),
        }
        accuracy_curves[name], cluster_curves[name] = per_t.tolist(), clusters_t.tolist()
        with open(plots / "continual" / f"{name}.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["timestep", "accuracy", "n_clusters"])
            writer.writerows((t, round(a, 6), k) for t, (a, k) in enumerate(zip(per_t, clusters_t)))
        first = runs[0]["rows"]
        plot_assignments(
            np.array([r["cluster_of_device"] for r in first]).T,
            np.array([r["concept_of_device"] for r in first]).T,
            plots / "continual" / f"clusters_{name}.png",
            title=f"{name}: cluster of each device over time (seed {params.seeds[0]})",
        )
    title = f"{params.data.dataset} {params.scenario.name} {params.continual.setting}"
    plot_curves(
        accuracy_curves, plots / "continual_accuracy.png", xlabel="timestep",
        ylabel="mean accuracy on current concept", title=title, ylim=(0, 1),
    )
    plot_curves(
        cluster_curves, plots / "continual_clusters.png", xlabel="timestep",
        ylabel="clusters serving devices", title=title,
    )
    return out


def _fingerprint(params: Params, algorithm: str, seed: int) -> str:
    """What a checkpoint depends on: resuming is refused if any of it changed."""
    import hashlib

    relevant = params.model_dump(include={"data", "scenario", "model", "training", "continual"})
    relevant["continual"].pop("algorithms")
    blob = json.dumps({"params": relevant, "algorithm": algorithm, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_json_atomic(path: Path, obj: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, obj)


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
