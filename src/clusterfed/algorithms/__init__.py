"""Clustering strategies over the shared engine, one per paper."""

from clusterfed.algorithms.baselines import IFCA, Centralized, FedAvg, Local
from clusterfed.algorithms.clustering import Cluster, Clustering, ColdStartResult
from clusterfed.algorithms.faacl import (
    FAACL,
    cluster_initialization,
    cluster_merge,
    cluster_support,
    cluster_train,
    settle_clusters,
)

__all__ = [
    "FAACL",
    "IFCA",
    "Centralized",
    "Cluster",
    "Clustering",
    "ColdStartResult",
    "FedAvg",
    "Local",
    "cluster_initialization",
    "cluster_merge",
    "cluster_support",
    "cluster_train",
    "settle_clusters",
]
