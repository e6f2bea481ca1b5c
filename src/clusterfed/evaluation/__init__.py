"""Scoring runs against the ground truth and summarising them over seeds."""

from clusterfed.evaluation.metrics import (
    clustering_scores,
    mean_stderr,
    rejection_totals,
    summarize_runs,
    traffic_scores,
)

__all__ = ["clustering_scores", "mean_stderr", "rejection_totals", "summarize_runs", "traffic_scores"]
