"""Scores of a clustering run: accuracy with its standard error, ARI and NMI."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score


def mean_stderr(values: np.ndarray | list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_stderr of no values")
    stderr = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0
    return float(v.mean()), stderr


def clustering_scores(groups: np.ndarray, model_of_device: np.ndarray) -> dict[str, float]:
    """ARI and NMI of the device clustering against the ground-truth groups."""
    return {
        "ari": float(adjusted_rand_score(groups, model_of_device)),
        "nmi": float(normalized_mutual_info_score(groups, model_of_device)),
    }


def summarize_runs(runs: list[dict]) -> dict[str, float | int | str]:
    """Metrics of one algorithm over seeds, as in the thesis tables.

    Each run holds ``device_accuracy`` (list), ``n_clusters``, ``ari`` and ``nmi``.
    ``accuracy`` is the mean device test accuracy averaged over seeds; its standard
    error is taken over seeds, or over devices when there is a single seed.
    """
    per_seed = [float(np.mean(r["device_accuracy"])) for r in runs]
    if len(runs) > 1:
        accuracy, stderr = mean_stderr(per_seed)
        over = "seeds"
    else:
        accuracy, stderr = mean_stderr(runs[0]["device_accuracy"])
        over = "devices"
    return {
        "accuracy": accuracy,
        "accuracy_stderr": stderr,
        "stderr_over": over,
        "n_clusters": float(np.mean([r["n_clusters"] for r in runs])),
        "ari": float(np.mean([r["ari"] for r in runs])),
        "nmi": float(np.mean([r["nmi"] for r in runs])),
        "n_seeds": len(runs),
    }
