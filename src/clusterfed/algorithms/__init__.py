"""Cold-start clustering methods over the shared engine, one module per paper.

Each module registers its method (``@register``); :mod:`clusterfed.registry` lists
them by name. Importing this package registers the built-in ones.
"""

from clusterfed.algorithms.clustering import Cluster, Clustering, ColdStartResult, helping_memberships
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan, run_coldstart
from clusterfed.algorithms.faacl import (
    FAACL,
    cluster_initialization,
    cluster_merge,
    cluster_merge_absorbing,
    cluster_merge_overlapping,
    cluster_support,
    cluster_train,
    settle_clusters,
)
from clusterfed.algorithms.fedclust import FedClust
from clusterfed.algorithms.stocfl import StoCFL
from clusterfed.algorithms.flacc import FLACC
from clusterfed.algorithms.baselines import IFCA, Centralized, FedAvg, Local
# The baselines of the seed papers' tables (issue 14).
from clusterfed.algorithms.cfl import CFL
from clusterfed.algorithms.pacfl import PACFL
from clusterfed.algorithms.flhc import FLHC
from clusterfed.algorithms.fesem import FeSEM
from clusterfed.algorithms.fedgroup import FedGroup
from clusterfed.algorithms.fedsoft import FedSoft
from clusterfed.algorithms.fedprox import FedProx
from clusterfed.algorithms.fednova import FedNova
from clusterfed.algorithms.personalized import Ditto, LGFedAvg, PerFedAvg, PFedMe

__all__ = [
    "CFL",
    "FAACL",
    "FLHC",
    "PACFL",
    "Ditto",
    "FeSEM",
    "FedGroup",
    "FedNova",
    "FedProx",
    "FedSoft",
    "LGFedAvg",
    "PFedMe",
    "PerFedAvg",
    "FLACC",
    "IFCA",
    "Centralized",
    "Cluster",
    "Clustering",
    "ColdStart",
    "ColdStartResult",
    "Context",
    "FedAvg",
    "FedClust",
    "Local",
    "RoundPlan",
    "StoCFL",
    "cluster_initialization",
    "cluster_merge",
    "cluster_merge_absorbing",
    "cluster_merge_overlapping",
    "cluster_support",
    "cluster_train",
    "helping_memberships",
    "run_coldstart",
    "settle_clusters",
]
