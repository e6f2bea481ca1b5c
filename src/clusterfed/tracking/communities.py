"""FedCRef's community autoencoders in the registry: one registered model per community.

A FedCRef community p serves local clusters (client i, cluster q) of several clients,
so a client can be served by several community models, one per local cluster. Each
community AE_Gp is registered like the other stages' cluster models
(``<experiment>.unsupervised.<method>.seed<s>.cluster<p>``, alias ``serving``) with
the extra tag ``local_clusters`` (JSON list of [client, q]); "which model serves
local cluster q of client i" is :func:`lookup_local_cluster`. Files are
``model.safetensors`` + ``spec.json`` (format below), never pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from clusterfed.tracking import registry
from clusterfed.tensorfile import save_tensors

FORMAT = "clusterfed-community-autoencoder/1"
STAGE = "unsupervised"


def save_community_model(path: str | Path, state_dict: dict[str, torch.Tensor], *, input_dim: int, provenance: dict) -> Path:
    """One community autoencoder (the engine's per-model parameters w0, b0, …)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(state_dict, path / "model.safetensors", metadata={"format": FORMAT})
    (path / "spec.json").write_text(json.dumps({"format": FORMAT, "input_dim": input_dim, "provenance": provenance}, indent=2))
    return path


def load_community_model(path: str | Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Parameters stacked as one model ([1, ...], ready for the engine's
    ``reconstruction_errors``) and the spec."""
    path = Path(path)
    spec = json.loads((path / "spec.json").read_text())
    if spec.get("format") != FORMAT:
        raise ValueError(f"{path}: not a community autoencoder (format {spec.get('format')!r}, expected {FORMAT!r})")
    return {k: v[None] for k, v in load_file(str(path / "model.safetensors")).items()}, spec


def lookup_local_cluster(
    client: MlflowClient,
    device: int,
    local_cluster: int,
    *,
    experiment: str,
    algorithm: str | None = None,
    seed: int | None = None,
) -> registry.ServedModel:
    """The community model in service for local cluster ``local_cluster`` of client
    ``device``; :class:`registry.LookupFailed` says what is registered otherwise."""
    models = [m for m in registry.in_experiment(client, experiment) if m.stage == STAGE]
    if not models:
        raise registry.LookupFailed(f"no FedCRef community models registered in {experiment!r}")
    models = registry._narrow(models, "algorithm", algorithm, experiment)
    models = registry._narrow(models, "seed", seed, experiment)
    in_service = [m for m in models if registry.SERVING in m.aliases]
    wanted = [device, local_cluster]
    for m in in_service:
        mv = client.get_model_version(m.name, str(m.version))
        if wanted in json.loads(mv.tags.get("local_clusters", "[]")):
            return m
    raise registry.LookupFailed(
        f"local cluster {local_cluster} of client {device} is isolated: no community model serves it in "
        f"{experiment!r} (communities in service: {len(in_service)})"
    )
