"""Scores of a clustering run: accuracy with its standard error, ARI, NMI and traffic."""

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


def clustering_scores(groups: np.ndarray | None, model_of_device: np.ndarray) -> dict[str, float | None]:
    """ARI and NMI of the device clustering against the ground-truth groups (None
    when the scenario has none, e.g. a Dirichlet partition)."""
    if groups is None:
        return {"ari": None, "nmi": None}
    return {
        "ari": float(adjusted_rand_score(groups, model_of_device)),
        "nmi": float(normalized_mutual_info_score(groups, model_of_device)),
    }


def traffic_scores(history: list[dict], target_accuracy: float) -> dict[str, float | int | None]:
    """Communication of one run from its per-round history.

    ``mb_per_round_clustering`` / ``_training`` split the rounds as thesis Table 3.7
    does (rounds that form clusters vs. plain training; None when a run has no such
    rounds); ``rounds_to_target`` and ``mb_to_target`` are FedClust Tables 4-5: the
    first round whose mean device test accuracy reaches ``target_accuracy`` and the
    megabytes sent up to it (None if never reached).
    """
    total = np.array([r["bytes_down"] + r["bytes_up"] for r in history], dtype=np.float64) / 1e6
    training = np.array([r["phase"] == "training" for r in history])
    reached = next((i for i, r in enumerate(history) if r["accuracy"] >= target_accuracy), None)
    return {
        "mb_per_round": float(total.mean()),
        "mb_per_round_clustering": float(total[~training].mean()) if (~training).any() else None,
        "mb_per_round_training": float(total[training].mean()) if training.any() else None,
        "rounds": len(history),
        "rounds_to_target": None if reached is None else reached + 1,
        "mb_to_target": None if reached is None else float(total[: reached + 1].sum()),
    }


def rejection_totals(runs: list[dict]) -> dict[str, int | float | list[int]]:
    """Uploads rejected over the seeds' runs (each ``uploads``, ``rejected_by_device``):
    ``rejected_updates``, ``rejected_share`` of the uploads, ``rejected_by_device``."""
    total = int(sum(sum(r["rejected_by_device"]) for r in runs))
    return {
        "rejected_updates": total,
        "rejected_share": round(total / max(1, sum(r["uploads"] for r in runs)), 6),
        "rejected_by_device": np.sum([r["rejected_by_device"] for r in runs], axis=0).astype(int).tolist(),
    }


def summarize_runs(runs: list[dict]) -> dict[str, float | int | str | None]:
    """Metrics of one algorithm over seeds, as in the thesis tables.

    Each run holds ``device_accuracy`` (list), ``n_clusters``, ``ari`` and ``nmi``
    (None without ground-truth groups) and optionally the ``traffic_scores`` keys,
    ``newcomer_accuracy`` and ``rejections`` (the run's ``rejections.json``: rejected
    uploads are summed over seeds, per device too). ``accuracy`` is the mean device test accuracy averaged over
    seeds; its standard error is taken over seeds, or over devices when there is a
    single seed. Other keys are averaged over seeds, None if any seed has None
    (``target_reached`` counts the seeds that reached the target).
    """
    per_seed = [float(np.mean(r["device_accuracy"])) for r in runs]
    if len(runs) > 1:
        accuracy, stderr = mean_stderr(per_seed)
        over = "seeds"
    else:
        accuracy, stderr = mean_stderr(runs[0]["device_accuracy"])
        over = "devices"
    out: dict[str, float | int | str | None] = {
        "accuracy": accuracy,
        "accuracy_stderr": stderr,
        "stderr_over": over,
        "n_clusters": float(np.mean([r["n_clusters"] for r in runs])),
    }
    optional = ("ari", "nmi", "newcomer_accuracy", "mb_per_round", "mb_per_round_clustering",
                "mb_per_round_training", "rounds_to_target", "mb_to_target")
    for key in optional:
        if any(key in r for r in runs):
            values = [r.get(key) for r in runs]
            out[key] = None if any(v is None for v in values) else float(np.mean(values))
    if any("rejections" in r for r in runs):  # a run's rejections.json: summed over seeds
        out.update(rejection_totals([r["rejections"] for r in runs if "rejections" in r]))
    if any("rounds_to_target" in r for r in runs):
        out["target_reached"] = f"{sum(r.get('rounds_to_target') is not None for r in runs)}/{len(runs)}"
    out["n_seeds"] = len(runs)
    return out
