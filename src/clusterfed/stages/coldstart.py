"""Stage ``coldstart``: every configured method on every seed's federation."""

from __future__ import annotations

import json
import shutil

import numpy as np

from clusterfed.algorithms import ColdStartResult
from clusterfed.algorithms.newcomers import assign_newcomers, newcomer_rule
from clusterfed.build import build_algorithm, build_engine, checkpoint_fingerprint, federated_devices
from clusterfed.config import Params
from clusterfed.engine.robust import check_rejections
from clusterfed.layout import ColdStartFiles, RunLayout
from clusterfed.scenarios import Federation
from clusterfed.stages.files import atomic_dir, save_models, write_json


def coldstart(params: Params, layout: RunLayout, *, progress: bool = True) -> None:
    """Writes, per method and seed (``RunLayout.coldstart_run``), ``clustering.json``
    (devices and supportive clusters of each cluster, ground-truth groups, rejected
    uploads), ``history.json`` (per-round accuracy, clusters, traffic, rejected
    uploads), ``device_accuracy.json``, ``models.safetensors`` (cluster models, no
    pickle), ``rejections.json`` (uploads screened and rejected per device; the stage
    fails with ``TooManyRejected`` above ``training.max_rejected_share``, writing
    nothing) and, when the scenario holds newcomers out, ``newcomers.json`` (the model
    each newcomer is given and its test accuracy).

    Each fit snapshots itself every ``coldstart.checkpoint_every`` rounds
    (``RunLayout.coldstart_checkpoint``, untracked): rerunning an interrupted stage
    resumes every fit from its last snapshot, when the parameters and code are
    unchanged, and ends with the same outputs. The snapshots are deleted once the
    outputs are in place.
    """
    with atomic_dir(layout.coldstart) as tmp:
        for seed in params.seeds:
            full = Federation.load(layout.partition(seed))
            members = federated_devices(full)
            newcomers = full.description.get("newcomers", [])
            fed = full.subset(members) if newcomers else full
            for name in params.coldstart.algorithms:
                engine = build_engine(params, fed)
                algorithm = build_algorithm(name, params)
                result = algorithm.fit(
                    engine, seed=seed, progress=progress, ground_truth=fed.groups, oracle_pools=fed.oracle_pools,
                    checkpoint=layout.coldstart_checkpoint(name, seed), fingerprint=checkpoint_fingerprint(params),
                    checkpoint_every=params.coldstart.checkpoint_every,
                )
                if progress and result.resumed_from_round is not None:
                    print(f"seed {seed:>5} {name:<12} resumed from round {result.resumed_from_round}", flush=True)
                files = layout.coldstart_run(name, seed, under=tmp)
                ground_truth = fed.description.get("ground_truth", True)
                write_result(result, files, seed, members, fed.groups if ground_truth else None)
                by_device = [0] * full.n_devices  # as the federation's device ids
                for d, n in zip(members, result.rejected_by_device):
                    by_device[d] = n
                write_json(files.rejections, {"uploads": result.uploads, "rejected": sum(by_device),
                                              "rejected_by_device": by_device})
                check_rejections(by_device, result.uploads, params.training.max_rejected_share,
                                 what=f"{name} seed {seed}")
                line = (
                    f"seed {seed:>5} {name:<12} accuracy {result.device_accuracy.mean():.4f}"
                    f"  clusters {result.n_clusters}"
                )
                if newcomers:
                    new_engine = build_engine(params, full.subset(newcomers))
                    rows = assign_newcomers(algorithm, result, new_engine, seed=seed)
                    accuracy = new_engine.accuracy(result.params, rows)
                    write_json(files.newcomers, {
                        "devices": newcomers,
                        "rule": newcomer_rule(algorithm),
                        "model_index": [int(r) for r in rows],
                        "accuracy": [round(float(a), 6) for a in accuracy],
                    })
                    line += f"  newcomers {accuracy.mean():.4f}"
                if progress:
                    print(line, flush=True)
    shutil.rmtree(layout.coldstart_checkpoints, ignore_errors=True)  # the outputs are in place


def write_result(
    result: ColdStartResult, files: ColdStartFiles, seed: int, devices: list[int], groups: np.ndarray | None
) -> None:
    """Cluster devices are written as the federation's device ids (newcomers excluded)."""
    files.dir.mkdir(parents=True)
    clustering = result.clustering_json()
    for c in clustering["clusters"]:
        c["devices"] = [devices[d] for d in c["devices"]]
    clustering["devices"] = devices
    clustering["ground_truth_groups"] = None if groups is None else [int(g) for g in groups]
    write_json(files.clustering, {"seed": seed, **clustering})
    write_json(files.history, result.history)
    write_json(files.device_accuracy, [round(float(a), 6) for a in result.device_accuracy])
    save_models(files.models, result.params, {
        "algorithm": result.algorithm,
        "seed": str(seed),
        "cluster_ids": json.dumps([c.id for c in result.clusters]),
        "layout": "stacked: row i is the model of clusters[i] in clustering.json",
    })
