"""Checkpoints of a continual run: one directory per finished timestep, no pickle.

Tensors (cluster models, memory samples, extras) go to ``state.safetensors``; the
structure (clusters, memory index, lineage, per-timestep metrics) to ``state.json``.
A checkpoint directory is written under a temporary name and renamed when complete,
so a run interrupted mid-write resumes from the previous timestep.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from clusterfed.algorithms import Cluster, Clustering
from clusterfed.continual.memory import Memory, MemoryEntry
from clusterfed.continual.state import ContinualState
from clusterfed.layout import CheckpointFiles, checkpoint_files, saved_checkpoints
from clusterfed.snapshot import warn_stale
from clusterfed.tensorfile import save_tensors


def save_checkpoint(directory: Path, t: int, state: ContinualState, rows: list[dict], fingerprint: str) -> None:
    final = checkpoint_files(directory, t).dir
    tmp = CheckpointFiles(final.with_name(final.name + ".tmp"))
    shutil.rmtree(tmp.dir, ignore_errors=True)
    tmp.dir.mkdir(parents=True)
    tensors = {f"params.{k}": v.detach().cpu().contiguous() for k, v in state.clustering.params.items()}
    entries = []
    for d, mem in enumerate(state.memory.device):
        entries.append([{"t": e.t, "cluster": e.cluster} for e in mem])
        for i, e in enumerate(mem):
            tensors[f"memory.{d}.{i}.x"] = torch.as_tensor(e.x).contiguous()
            tensors[f"memory.{d}.{i}.y"] = torch.as_tensor(e.y).contiguous()
    for name, params in state.extras.items():
        tensors.update({f"extra.{name}.{k}": v.detach().cpu().contiguous() for k, v in params.items()})
    save_tensors(tensors, tmp.tensors)
    meta = {
        "t": t,
        "fingerprint": fingerprint,
        "clusters": [{"id": c.id, "devices": sorted(c.devices), "sup": sorted(c.sup)} for c in state.clustering.clusters],
        "memory": entries,
        "cluster_memory": {str(c): {str(t_): ds for t_, ds in m.items()} for c, m in state.memory.cluster.items()},
        "lineage": {str(k): v for k, v in state.memory.lineage.items()},
        "extras": sorted(state.extras),
        "device_values": {k: v.tolist() for k, v in state.device_values.items()},
        "rows": rows,
    }
    tmp.meta.write_text(json.dumps(meta))
    shutil.rmtree(final, ignore_errors=True)
    tmp.dir.rename(final)


def latest_checkpoint(directory: Path, fingerprint: str) -> tuple[int, ContinualState, list[dict]] | None:
    """The newest complete checkpoint, if it was written with the same ``fingerprint``."""
    for files in reversed(saved_checkpoints(directory)):
        if not files.meta.is_file():
            continue
        meta = json.loads(files.meta.read_text())
        if meta["fingerprint"] != fingerprint:
            return None
        return meta["t"], _load_state(files, meta), meta["rows"]
    return None


def load_checkpoint(directory: Path, t: int) -> ContinualState:
    """The state saved after timestep ``t`` (for reading a finished run's history)."""
    files = checkpoint_files(directory, t)
    if not files.meta.is_file():
        raise FileNotFoundError(f"{files.meta}: no checkpoint of timestep {t}")
    return _load_state(files, json.loads(files.meta.read_text()))


def discard_checkpoints(directory: Path) -> None:
    """Delete every checkpoint in ``directory`` (a run starting over): left beside the
    new run's, another run's later timesteps would be mistaken for its newest checkpoint
    and block every resume, and would be registered as its models."""
    saved = saved_checkpoints(directory)
    if saved:
        warn_stale(directory, f"{len(saved)} timestep checkpoint(s)", "deleting them now")
    for files in saved:
        shutil.rmtree(files.dir)
    for tmp in Path(directory).glob("t_[0-9][0-9][0-9].tmp"):
        shutil.rmtree(tmp)


def _load_state(files: CheckpointFiles, meta: dict) -> ContinualState:
    tensors = load_file(str(files.tensors))
    params = {k[len("params.") :]: v for k, v in tensors.items() if k.startswith("params.")}
    clusters = tuple(Cluster(c["id"], frozenset(c["devices"]), frozenset(c["sup"])) for c in meta["clusters"])
    device = [
        [
            MemoryEntry(e["t"], e["cluster"], tensors[f"memory.{d}.{i}.x"].numpy(), tensors[f"memory.{d}.{i}.y"].numpy())
            for i, e in enumerate(entries)
        ]
        for d, entries in enumerate(meta["memory"])
    ]
    memory = Memory(
        device=device,
        cluster={int(c): {int(t): ds for t, ds in m.items()} for c, m in meta["cluster_memory"].items()},
        lineage={int(k): v for k, v in meta["lineage"].items()},
    )
    extras = {
        name: {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"extra.{name}.")}
        for name in meta["extras"]
    }
    values = {k: np.asarray(v) for k, v in meta["device_values"].items()}
    return ContinualState(Clustering(clusters, params), memory, extras, values)
