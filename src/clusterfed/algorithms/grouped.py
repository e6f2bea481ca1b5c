"""Bookkeeping shared by the baselines that hold one model per group of devices.

A grouping is a label per device; ``labels_clustering`` turns labels and one model
row per label into a ``Clustering``, and ``flat_updates`` gives the flattened weight
updates Δθ that CFL, FL+HC and FedGroup cluster on.
"""

from __future__ import annotations

import numpy as np
import torch

from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.engine import Engine, StackedParams
from clusterfed.engine.stacked import is_finite, take


def flat(params: StackedParams) -> torch.Tensor:
    """Every model of the stack as one flat vector, ``[M, p]``."""
    return torch.cat([v.flatten(1) for v in params.values()], dim=1)


def labels_clustering(labels: np.ndarray, params: StackedParams) -> Clustering:
    """Cluster g holds the devices labelled g and is served row g of ``params``
    (``params`` itself, not a copy, when every row serves: per-device methods hold
    N models)."""
    labels = np.asarray(labels, dtype=np.int64)
    clusters = tuple(
        Cluster(id=int(g), devices=frozenset(np.flatnonzero(labels == g).tolist()))
        for g in range(int(labels.max()) + 1)
    )
    used = [i for i, c in enumerate(clusters) if c.devices]
    every_row = used == list(range(len(next(iter(params.values())))))
    return Clustering(tuple(clusters[i] for i in used), params if every_row else take(params, used))


def per_device(params: StackedParams) -> Clustering:
    """Device d is its own cluster, served row d."""
    n = next(iter(params.values())).shape[0]
    return labels_clustering(np.arange(n), params)


def replace_rows(
    params: StackedParams, rows: np.ndarray, new: StackedParams, ok: np.ndarray, *, in_place: bool = False
) -> StackedParams:
    """``params`` with rows ``rows[ok]`` taken from ``new[ok]`` (a diverged row keeps its old value).

    ``in_place`` writes into ``params`` instead of a copy: for a caller that owns
    ``params`` and drops it, e.g. a personalised method's one model per device, where
    a copy is a second set of N models (7.8 GB for StoCFL's N = 1200 and 784-2048-10
    MLP, ``benchmarks/personal_memory.py``)."""
    out = params if in_place else {k: v.clone() for k, v in params.items()}
    keep = np.flatnonzero(ok)
    if len(keep):
        idx = torch.as_tensor(np.asarray(rows)[keep], device=next(iter(params.values())).device)
        src = torch.as_tensor(keep, device=idx.device)
        for k in out:
            out[k][idx] = new[k].index_select(0, src)
    return out


def relabel(labels: np.ndarray) -> np.ndarray:
    """Labels renumbered 0..k−1 by first appearance (device 0 is in cluster 0)."""
    _, first, inverse = np.unique(np.asarray(labels), return_index=True, return_inverse=True)
    return np.argsort(np.argsort(first))[inverse].astype(np.int64)


def updates(
    engine: Engine, start: StackedParams, model_of_pair: np.ndarray, trained: StackedParams
) -> tuple[torch.Tensor, np.ndarray]:
    """Each pair's flat update Δθ = θ_trained − θ_start (``trained`` holds one row per
    pair, ``start`` the models they started from) and a finite mask ``[P]``: a
    diverged pair's update is zero (the engine also lists it in ``Round.rejected``)."""
    finite = is_finite(trained)
    delta = flat(trained) - flat(take(start, np.asarray(model_of_pair).tolist()))
    delta[~finite] = 0.0
    return delta, finite.cpu().numpy()


def average(
    engine: Engine,
    trained: StackedParams,
    model_of_pair: np.ndarray,
    device_of_pair: np.ndarray,
    ok: np.ndarray,
    previous: StackedParams,
) -> StackedParams:
    """Each model becomes the |Z^train|-weighted average of its finite pairs
    (``Engine.aggregate``, as ``Engine.train`` does); a model without finite pairs
    keeps ``previous``."""
    if not ok.any():
        return previous
    return engine.aggregate(trained, np.asarray(model_of_pair), np.asarray(device_of_pair), previous,
                            rejected=np.flatnonzero(~ok))
