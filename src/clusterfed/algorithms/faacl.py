"""FAACL: Federated Adaptive Asymmetric Clustered Learning (thesis ch. 3, Alg. 1–6).

Each step is a separate function named after its algorithm box:
``cluster_initialization`` (Alg. 1), ``cluster_support`` (Alg. 2), ``cluster_merge``
(Alg. 3) and ``cluster_train`` (Alg. 4); ``FAACL`` runs them flat (Alg. 5) or by
hierarchical partition merge (Alg. 6).

References
----------
Z. Zhang, "Asymmetric Clustering in Federated Continual Learning", MMath thesis,
University of Waterloo, 2024, §3.2 and appendices A–B.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch

from clusterfed.algorithms.base import model_bytes, pair_traffic, support_edges
from clusterfed.algorithms.clustering import Cluster, Clustering
from clusterfed.algorithms.protocol import ColdStart, Context, RoundPlan
from clusterfed.hyperparams import Param
from clusterfed.registry import register
from clusterfed.engine import Engine
from clusterfed.engine.stacked import take
from clusterfed.stats import significant, support_pvalues


def cluster_initialization(
    engine: Engine, generator: torch.Generator, *, init_epochs: int
) -> Clustering:
    """Alg. 1: one random θ for all; every device forms a singleton cluster and trains
    θ locally (``init_epochs`` epochs stand for the argmin; a rejected upload keeps θ)."""
    n = engine.n_devices
    params = engine.init_params(n, generator, distinct=False)
    devices = np.arange(n)
    params = engine.train(params, devices, devices, generator, local_epochs=init_epochs).params
    clusters = tuple(Cluster(id=d, devices=frozenset({d})) for d in range(n))
    return Clustering(clusters=clusters, params=params)


def cluster_support(
    engine: Engine,
    clustering: Clustering,
    *,
    alpha: float,
    epsilon: float,
    partition_of_device: np.ndarray | None = None,
    accumulate: bool = False,
    penalized: bool = False,
    misclassified: Literal["model", "uniform"] = "model",
) -> Clustering:
    """Alg. 2: C2 ∈ C1.sup iff every device of C1 finds C2's model no worse than C1's,
    by the one-sided Wilcoxon test on its validation losses (ε tolerance, level α).
    A device that overlapping clusters share is tested once for each of them.

    Only clusters of the same partition are compared (H-FAACL's ``partition_of_device``;
    flat: one partition), so each partition's models are evaluated on that partition's
    devices only, one engine call per partition holding two clusters or more (memory
    bounded by ``Engine.losses``). Every (C1, C2, d) test is then gathered from those
    losses by indexing and all p-values come from one ``support_pvalues`` call.
    Support sets are recomputed from scratch each call (the box), so they always name
    current clusters; ``accumulate`` adds the supporters found to those C1 already
    lists instead (the authors' code: a test only ever adds a supporter, which C1 keeps
    until it merges). ``penalized`` adds each model's L2 penalty (``Engine.penalties``)
    to every loss it is tested on: the authors' losses come from Keras' ``evaluate``,
    which reports the regulariser inside each per-sample loss, so C1's own model is
    effectively granted ε + R(C1.θ) − R(C2.θ). ``misclassified="uniform"`` is the
    "corrected loss" of an earlier procedure of the authors' code (``cluster_merge_absorbing``
    names it): a validation sample a model gets wrong counts with ln K,
    the loss of a uniform guess over the K classes, whatever the model's own loss on it,
    and ε is added only where C1's model is right. A sample both models get wrong then
    ties (dropped by the test), and a confidently wrong model is charged no more than
    an unsure one.

    A cluster with no devices (C-FAACL keeps one when its concept leaves, as the
    memory its global concept search returns to) has nobody to run the test, so it
    lists no supporter. Read literally, "every device of C1" would hold vacuously: the
    empty cluster would be supported by every cluster, train on every device (Alg. 4)
    and merge with the first cluster that finds its model no worse, so the remembered
    concept would be overwritten or lost (RESULTS §8, session 26).
    """
    if misclassified not in ("model", "uniform"):
        raise ValueError(f"misclassified must be 'model' or 'uniform', got {misclassified!r}")
    uniform = misclassified == "uniform"
    clusters = clustering.clusters
    m = len(clusters)
    counts = engine.counts("val")
    member_row, member_device = clustering.memberships()  # one per device unless clusters overlap
    partition = np.asarray(_partition_of_cluster(clusters, partition_of_device))
    own, other, sizes, c1, c2 = [], [], [], [], []
    for part in np.unique(partition):
        rows = np.flatnonzero(partition == part)  # the partition's clusters (rows of params)
        if len(rows) < 2:
            continue
        inside = np.isin(member_row, rows)
        devices = np.unique(member_device[inside])
        models = take(clustering.params, rows)
        losses = engine.losses(models, "val", devices=devices).cpu().numpy()
        if penalized:
            losses = losses + engine.penalties(models)[:, None, None]  # padding is never read (counts)
        if uniform:
            wrong = engine.losses(models, "val", devices=devices, measure="zero_one").cpu().numpy() > 0.5
            losses = np.where(wrong, np.log(engine.n_classes), losses)
        own_row = np.searchsorted(rows, member_row[inside])  # local row of each membership's cluster
        column = np.searchsorted(devices, member_device[inside])  # its device's column of losses
        k, j = np.nonzero(np.arange(len(rows))[None, :] != own_row[:, None])  # membership k tests model j
        own_losses = losses[own_row[k], column[k]]
        if uniform:  # ε only where C1's model is right; its wrong samples stay at ln K
            own_losses = own_losses + np.where(wrong[own_row[k], column[k]], 0.0, epsilon)
        own.append(own_losses)
        other.append(losses[j, column[k]])
        sizes.append(counts[devices[column[k]]])
        c1.append(rows[own_row[k]])
        c2.append(rows[j])
    compared = partition[:, None] == partition[None, :]
    np.fill_diagonal(compared, False)
    failed = np.zeros((m, m), dtype=bool)
    if own:
        tolerance = 0.0 if uniform else epsilon  # uniform: already added where C1's model is right
        p = support_pvalues(np.concatenate(own), np.concatenate(other), tolerance, counts=np.concatenate(sizes))
        np.logical_or.at(failed, (np.concatenate(c1), np.concatenate(c2)), ~significant(p, alpha))
    supported = compared & ~failed
    supported[[not c.devices for c in clusters]] = False  # an empty cluster lists no supporter
    new = tuple(
        Cluster(
            id=c.id, devices=c.devices,
            sup=frozenset(clusters[j].id for j in np.flatnonzero(supported[i]))
            | (c.sup if accumulate and c.devices else frozenset()),
        )
        for i, c in enumerate(clusters)
    )
    return replace(clustering, clusters=new)


def cluster_merge(clustering: Clustering, rng: np.random.Generator, *, inherit: bool = True) -> Clustering:
    """Alg. 3: merge each pair of mutually supportive clusters (one merge per cluster
    per call, in cluster order): C'.D = C1.D ∪ C2.D, C'.sup = C1.sup ∩ C2.sup and
    C'.θ = the model of C1 or C2 at random — never their average (§3.2.2).

    A cluster that listed both C1 and C2 as supporters lists C' instead; one that
    listed only one of them drops it until the next support test. ``inherit=False``
    (the authors' code): C' starts with no supporter and every other cluster drops C1
    and C2, so C' is only ever listed after a test of it.
    """
    clusters = list(clustering.clusters)
    position = {c.id: i for i, c in enumerate(clusters)}
    old: set[int] = set()
    merged: dict[int, tuple[Cluster, int]] = {}  # C1.id -> (C', row of kept θ)
    replaced: dict[frozenset[int], int] = {}
    next_id = clustering.next_id()
    for c1 in clusters:
        if c1.id in old:
            continue
        # C1's supporters in cluster order: only they can be mutually supportive with it
        for j in sorted(position[s] for s in c1.sup if s in position):
            c2 = clusters[j]
            if c2.id == c1.id or c2.id in old:
                continue
            if c1.id in c2.sup:
                keep = (c1, c2)[int(rng.integers(2))]
                sup = c1.sup & c2.sup if inherit else frozenset()
                new = Cluster(id=next_id, devices=c1.devices | c2.devices, sup=sup)
                merged[c1.id] = (new, position[keep.id])
                replaced[frozenset({c1.id, c2.id})] = next_id
                old |= {c1.id, c2.id}
                next_id += 1
                break
    if not merged:
        return clustering
    out, rows = [], []
    for i, c in enumerate(clusters):
        if c.id in merged:
            new, row = merged[c.id]
            out.append(new)
            rows.append(row)
        elif c.id not in old:
            out.append(c)
            rows.append(i)
    # without inheritance nobody lists C': the remap then only drops C1 and C2
    partner = (
        {a: (b, new) for pair, new in replaced.items() for a, b in (tuple(pair), tuple(pair)[::-1])} if inherit else {}
    )
    out = [Cluster(c.id, c.devices, _remap_sup(c.sup, partner, old)) for c in out]
    return Clustering(clusters=tuple(out), params=take(clustering.params, rows))


def cluster_merge_overlapping(clustering: Clustering) -> Clustering:
    """Alg. 3 as the authors' code runs it (github.com/FAACL/FAACL, ``test-FAACL.py``,
    ``Partition.merge``): each cluster C1, in cluster order, merges with *every*
    mutually supportive C2 not merged yet in this call, so C1 ∪ C2 and C1 ∪ C3 can both
    be made and share C1's devices. Each C' takes C1's model and starts with no
    supporter; the parents leave every support set. The result may overlap
    (``Clustering.overlapping``); later merges of clusters that share devices unite them.
    """
    clusters = clustering.clusters
    merged: set[int] = set()
    made: dict[int, list[Cluster]] = {}  # row of C1 -> the C' made from it, in order
    next_id = clustering.next_id()
    for i, c1 in enumerate(clusters):
        if c1.id in merged:
            continue
        for c2 in clusters:
            if c2.id == c1.id or c2.id in merged or c2.id not in c1.sup or c1.id not in c2.sup:
                continue
            made.setdefault(i, []).append(Cluster(id=next_id, devices=c1.devices | c2.devices))
            merged |= {c1.id, c2.id}
            next_id += 1
    if not made:
        return clustering
    out, rows = [], []
    for i, c in enumerate(clusters):
        if c.id not in merged:
            out.append(Cluster(c.id, c.devices, c.sup - merged))
            rows.append(i)
        for new in made.get(i, []):
            out.append(new)
            rows.append(i)
    return Clustering(clusters=tuple(out), params=take(clustering.params, rows), overlapping=True)


def cluster_merge_absorbing(clustering: Clustering) -> Clustering:
    """Alg. 3 as an earlier merge of the authors' code runs it (github.com/FAACL/FAACL,
    ``test-FAACL.py``: the procedure left inside a string literal after ``train``, which
    the current code does not run): support alone merges. Each C1 that lists supporters
    (every device of C1 finds their model no worse) absorbs all of them that are not
    inside it: C' = C1 ∪ ⋃ C2.D keeps C1's model and replaces C1 (appended at the end
    of the list); the C2 stay as they are. Their devices then help train C1's model (Alg. 4's
    support, as membership) and a device in several clusters can be served by any of
    them (FAACL's ``serve``). A C' whose devices a cluster already has is not made (C1
    is dropped); when two C1 make the same C', the first keeps its model. The support
    sets are spent: every cluster leaves with none, so each trains on its own devices.
    """
    clusters = clustering.clusters
    by_id = {c.id: c for c in clusters}
    made: dict[int, frozenset[int]] = {}  # row of C1 -> devices of C'
    for i, c1 in enumerate(clusters):
        absorbed = [by_id[s].devices for s in sorted(c1.sup) if s in by_id and not by_id[s].devices <= c1.devices]
        if absorbed:
            made[i] = c1.devices.union(*absorbed)
    kept = [i for i in range(len(clusters)) if i not in made]
    have = {c.devices for c in clusters}
    new_rows: list[int] = []
    for i, devices in made.items():
        if devices not in have:
            have.add(devices)
            new_rows.append(i)
    if not made and not any(c.sup for c in clusters):
        return clustering
    next_id = clustering.next_id()
    out = [Cluster(clusters[i].id, clusters[i].devices) for i in kept]
    out += [Cluster(next_id + k, made[i]) for k, i in enumerate(new_rows)]
    return Clustering(clusters=tuple(out), params=take(clustering.params, kept + new_rows), overlapping=True)


def serve_by_validation(engine: Engine, clustering: Clustering) -> Clustering:
    """Serve each device that several clusters share by the one whose model is most
    accurate on its validation data (the authors' earlier procedure, which reports
    each client's test accuracy under its best-validated cluster); ties go to the
    first. A device in one cluster is served by it."""
    rows, devices = clustering.memberships()
    served = replace(clustering, served=None).model_of_device(engine.n_devices)  # the first cluster of each
    shared = np.unique(devices[np.bincount(devices, minlength=engine.n_devices)[devices] > 1])
    if len(shared):
        involved = np.unique(rows[np.isin(devices, shared)])
        error = engine.mean_losses(take(clustering.params, involved), "val", devices=shared,
                                   measure="zero_one").cpu().numpy()  # [rows involved, shared devices]
        member = np.zeros_like(error, dtype=bool)
        inside = np.isin(devices, shared)
        member[np.searchsorted(involved, rows[inside]), np.searchsorted(shared, devices[inside])] = True
        best = np.where(member, error, np.inf).argmin(0)  # the first of equal errors
        served[shared] = involved[best]
    return replace(clustering, served=served)


def cluster_train(
    engine: Engine, clustering: Clustering, generator: torch.Generator, *, supporter_weight: float = 1.0
) -> Clustering:
    """Alg. 4: every cluster model trains on its devices and its supporters' devices,
    then becomes their |Z^train|-weighted average — all clusters in one engine call.

    ``supporter_weight`` w scales a supporter device's |Z^train| in the average
    (:func:`supporter_pair_weight`; w = 1: the box)."""
    models, devices = clustering.training_pairs()
    weight = supporter_pair_weight(clustering, models, devices, supporter_weight)
    return clustering.with_params(engine.train(clustering.params, models, devices, generator, pair_weight=weight).params)


def supporter_pair_weight(
    clustering: Clustering, models: np.ndarray, devices: np.ndarray, supporter_weight: float
) -> np.ndarray | None:
    """Factor on each (model, device) pair's |Z^train| in Alg. 4: 1 for the cluster's own
    devices, ``supporter_weight`` for its supporters' (None when that is 1, the box).

    With w < 1 a supported cluster's own devices keep their say over its model, so a
    data-poor cluster is not turned into its rich supporter's model, which would make
    the support mutual and merge them (benchmarks/RESULTS.md, "Authors' construction")."""
    if supporter_weight == 1.0:
        return None
    own = [d in clustering.clusters[m].devices for m, d in zip(models, devices)]
    return np.where(own, 1.0, supporter_weight)


def round_traffic(clustering: Clustering, n_devices: int, *, with_support: bool) -> dict[str, int]:
    """Bytes of one round: Alg. 4 sends each (model, device) pair its model and back;
    Alg. 2 adds every cluster model to every device and a support set (one int64 per
    cluster) back to the server."""
    models, _ = clustering.training_pairs()
    traffic = pair_traffic(clustering.params, len(models))
    if with_support:
        m = len(clustering.clusters)
        traffic["bytes_down"] += n_devices * m * model_bytes(clustering.params)
        traffic["bytes_up"] += n_devices * m * 8
    return traffic


def settle_clusters(
    engine: Engine,
    clustering: Clustering,
    *,
    alpha: float,
    epsilon: float,
    rng: np.random.Generator,
    generator: torch.Generator,
    max_rounds: int,
) -> Clustering:
    """Alg. 5's loop: train, support, merge until the device partition stops changing
    or for ``max_rounds`` rounds, unrecorded (C-FAACL's timesteps;
    FAACL's cold start runs the same steps as hooks of the shared round loop)."""
    for _ in range(max_rounds):
        before = clustering.partition()
        clustering = cluster_train(engine, clustering, generator)
        clustering = cluster_support(engine, clustering, alpha=alpha, epsilon=epsilon)
        clustering = cluster_merge(clustering, rng)
        if clustering.partition() == before:
            break
    return clustering


def pair_partitions(partition_of_device: np.ndarray, order: str, rng: np.random.Generator) -> np.ndarray:
    """Alg. 6's next level: partitions merged two by two, as labels ``0..⌈P/2⌉-1`` per device.

    ``order="random"``: pairs sampled without repetition at random (the box: "P_i, P_j
    sampled non-repeatedly from 𝒫"), so which devices first meet follows no device
    order, in particular not the ground-truth groups. ``order="authors"``: partition k
    is merged with partition P−1−k in device order (the authors' code, whose devices
    alternate between groups). ``order="adjacent"``: partition 2i with 2i+1 in device
    order (the authors' earlier procedure, ``cluster_merge_absorbing``). With an odd P
    one partition waits a level alone.
    """
    labels, inverse = np.unique(partition_of_device, return_inverse=True)
    k = len(labels)
    if order == "random":
        new = np.empty(k, dtype=np.int64)
        new[rng.permutation(k)] = np.arange(k) // 2
    elif order == "authors":
        new = np.minimum(np.arange(k), k - 1 - np.arange(k))
    elif order == "adjacent":
        new = np.arange(k) // 2
    else:
        raise ValueError(f"partition_order: unknown order {order!r}; expected 'random', 'authors' or 'adjacent'")
    return new[inverse]


@dataclass(frozen=True)
class FAACLState:
    """Where FAACL stands: the clustering, the phase, the rounds made in it, and for
    H-FAACL the partition of each device at the current level."""

    clustering: Clustering
    phase: Literal["clustering", "training", "done"] = "clustering"
    rounds_in_phase: int = 0
    before: frozenset[frozenset[int]] = frozenset()
    partition_of_device: np.ndarray | None = None
    support_before: frozenset[tuple[int, int]] = frozenset()
    untested_rounds: int = 0


@register
class FAACL(ColdStart[FAACLState]):
    """Federated Adaptive Asymmetric Clustered Learning (thesis Alg. 5 and 6).

    Clustering rounds (train, record, support test, merge) run until the device
    partition stops changing (flat: at most ``max_rounds``). Hierarchical: the first
    level pairs the singleton partitions of Alg. 1 (``pair_partitions``: a level of
    singletons would compare nothing), partitions then merge two by two; each level
    but the last runs ``rounds_per_level`` rounds (fewer if one merges nothing): one by
    default, Theorem 6's "log n iterations", since the next level's first support test
    compares the same clusters again among more; the last level, one partition of
    all devices initialised with the levels' clusters, runs Alg. 5's loop until the
    partition stops changing (at most ``max_rounds``). Then ``rounds`` training
    rounds (Alg. 4). Each round evaluates a partition's
    models on that partition's devices only (``cluster_support``), so a level costs
    O(n × clusters per partition) instead of flat's O(n × clusters). Parameters are
    declared in ``hyperparameters`` (Table B.1).

    "Stops changing" is the partition by default. Alg. 5 loops while C ≠ C*, and a
    clustering holds its support sets too: ``stable="support"`` also waits for a
    round that leaves every support set as it was, so a one-way edge C ← C' (C' no
    worse for all of C's devices, not yet the reverse) gets the round of Alg. 4 that
    trains C on C''s devices and may make it mutual (a small cluster left beside its
    group's big one; benchmarks/RESULTS.md §10). ``stable="no_one_way"`` waits until no
    one-way edge is left (§3.2.3: such an edge is C catching up with C'), at most
    ``max_rounds`` rounds, which an asymmetric federation whose one-way edges persist
    will use up.

    The authors' code (github.com/FAACL/FAACL, ``test-FAACL.py``) runs Alg. 6 another
    way, reachable as options: ``partition_order="authors"`` (partition k with P−1−k),
    ``rounds_per_level=3`` with ``level_end="fixed"`` (its ``repeat``: every level, the
    last included, runs exactly that many rounds, none until stable) and
    ``support_sets="accumulated"`` (its ``add_supportive`` never removes a supporter;
    a merged cluster is a new object with none) and ``merge="overlapping"`` (its merge
    loop lets a cluster merge with several partners in one call, which makes clusters
    that share devices: ``cluster_merge_overlapping``; a shared device is served by its
    first cluster, and each of its clusters trains on it and tests its model on it),
    and ``support_loss="penalized"`` (its per-sample losses come from Keras'
    ``evaluate``, which adds the model's L2 penalty to each). The same file keeps an
    earlier procedure inside a string literal (not run by its current code) whose merge
    test counts a wrongly classified validation sample with ln K (its "corrected loss":
    ``misclassified_loss="uniform"``), merges on one-way support (``merge="absorbing"``:
    ``cluster_merge_absorbing``) and serves each device by its best-validated cluster
    (``serve="validation"``), and trains every cluster 10 rounds between two merge steps
    (``train_rounds_per_test=10``).
    Their loop also tests and merges before it trains; here every round trains first.
    """

    name = "faacl"
    full_participation = True
    hyperparameters = (
        Param("alpha", 0.1, "significance level of the support test", symbol="α", gt=0.0, lt=1.0),
        Param("epsilon", 0.7, "loss tolerance of the support test (Table B.1: MNIST S0–S2 0.7, A1 0.5, A2 0.4)",
              symbol="ε", ge=0.0),
        Param("variant", "flat", "flat (Alg. 5) or hierarchical partition merge (Alg. 6)", kind=str,
              choices=("flat", "hierarchical")),
        Param("init_epochs", 5, "local epochs of Alg. 1's initial training", kind=int, gt=0),
        Param("max_rounds", 20, "cap on the flat loop's train/support/merge rounds", kind=int, gt=0),
        Param("rounds_per_level", 1, "train/support/merge rounds of each H-FAACL level but the last, fewer when "
              "a round merges nothing (1: Theorem 6's one iteration per level; the authors' code: 3)",
              kind=int, gt=0),
        Param("partition_order", "random", "how H-FAACL pairs partitions: at random under the seed (Alg. 6) or "
              "partition k with partition len-1-k in device order (authors: the authors' code) or 2i with 2i+1 "
              "(adjacent: the authors' earlier procedure)", kind=str, choices=("random", "authors", "adjacent")),
        Param("supporter_weight", 1.0, "scale of a supporter device's training-set size in Alg. 4's average (1: the box)",
              ge=0.0, le=1.0),
        Param("stable", "partition", "when Alg. 5's loop (and an H-FAACL level) stops: partition = after a round that "
              "merged nothing; support = after a round that changed neither the partition nor any support set "
              "(Alg. 5's C = C*, supports included); no_one_way = after a round that merged nothing and left no "
              "one-way support edge (at most max_rounds)", kind=str, choices=("partition", "support", "no_one_way")),
        Param("level_end", "merge_less", "when an H-FAACL level ends: merge_less = after rounds_per_level rounds or "
              "a round that merged nothing, the last level by the stable rule; fixed = every level, the last "
              "included, runs exactly rounds_per_level rounds (the authors' code)", kind=str,
              choices=("merge_less", "fixed")),
        Param("support_sets", "recomputed", "recomputed = each support test starts afresh and a merged cluster "
              "inherits C1.sup ∩ C2.sup (the box); accumulated = a test only adds supporters, kept until they "
              "merge, and a merged cluster starts with none (the authors' code)", kind=str,
              choices=("recomputed", "accumulated")),
        Param("support_loss", "data", "the loss Alg. 2's test compares: data = each sample's cross-entropy ℓ(θ, z) "
              "(the box); penalized = plus the model's L2 penalty l2·Σ‖kernel‖² (the authors' code: Keras' "
              "evaluate reports the regulariser inside every loss)", kind=str, choices=("data", "penalized")),
        Param("misclassified_loss", "model", "the loss a wrongly classified validation sample counts with in "
              "Alg. 2's test: model = its cross-entropy (the box); uniform = ln K, a uniform guess's loss, with ε "
              "added only where C1's model is right (the authors' earlier procedure: its corrected loss, 2.3 "
              "on MNIST)",
              kind=str, choices=("model", "uniform")),
        Param("merge", "partition", "partition = Alg. 3 with one merge per cluster a round, clusters stay disjoint "
              "and C' keeps a parent's model at random; overlapping = a cluster merges with every mutually "
              "supportive cluster in one round, so clusters can share devices, and C' keeps the first parent's "
              "model and no supporter (the authors' code); absorbing = support alone merges: a cluster absorbs "
              "the devices of every supporter, which stays as it is (an earlier procedure of the authors' code)",
              kind=str, choices=("partition", "overlapping", "absorbing")),
        Param("serve", "first", "which cluster serves a device that several clusters share: first = the first "
              "that lists it; validation = the one whose model is most accurate on its validation data (the "
              "authors' earlier procedure)", kind=str, choices=("first", "validation")),
        Param("train_rounds_per_test", 1, "clustering-phase training rounds per support test and merge: 1 = Alg. "
              "5 tests after every round; the authors' earlier procedure trains 10 rounds between merge steps. "
              "Only the rounds that test count towards rounds_per_level and max_rounds", kind=int, gt=0),
    )
    alpha: float
    epsilon: float
    variant: str
    init_epochs: int
    max_rounds: int
    rounds_per_level: int
    partition_order: str
    supporter_weight: float
    stable: str
    level_end: str
    support_sets: str
    support_loss: str
    misclassified_loss: str
    merge: str
    serve: str
    train_rounds_per_test: int

    def expected_rounds(self, n_devices: int) -> int:
        levels = int(np.ceil(np.log2(max(n_devices, 2))))
        tests = self.max_rounds if self.variant == "flat" else (levels - 1) * self.rounds_per_level + 2
        return self.rounds + tests * self.train_rounds_per_test

    def init(self, engine: Engine, ctx: Context) -> FAACLState:
        clustering = cluster_initialization(engine, ctx.generator, init_epochs=self.init_epochs)
        partition = None
        if self.variant == "hierarchical":  # level 0's singleton partitions compare nothing: pair them now
            partition = pair_partitions(np.arange(engine.n_devices), self.partition_order, ctx.rng)
        return FAACLState(clustering, before=clustering.partition(), partition_of_device=partition)

    def finished(self, state: FAACLState, rounds_done: int) -> bool:
        return state.phase == "done"

    def configure_round(self, engine, state, participants, ctx):
        clustering = state.clustering
        models, devices = clustering.training_pairs()
        clustering_round = state.phase == "clustering" and self._tests_after(state)
        traffic = round_traffic(clustering, engine.n_devices, with_support=clustering_round)
        weight = supporter_pair_weight(clustering, models, devices, self.supporter_weight)
        plan = RoundPlan(clustering.params, models, devices, phase=state.phase, pair_weight=weight, **traffic)
        return replace(state, before=clustering.partition(), support_before=support_edges(clustering.clusters)), plan

    def aggregate(self, engine, state, plan, trained, ctx):
        clustering = state.clustering.with_params(trained)
        if self.serve == "validation" and clustering.overlapping:
            clustering = serve_by_validation(engine, clustering)
        return replace(state, clustering=clustering)

    def clustering(self, state: FAACLState) -> Clustering:
        return state.clustering

    def recluster(self, engine, state, ctx):
        """Alg. 2 and 3 after a clustering round; then the next phase or level."""
        n = state.rounds_in_phase + 1
        if state.phase == "training":
            return replace(state, rounds_in_phase=n, phase="done" if n >= self.rounds else "training")
        if not self._tests_after(state):
            return replace(state, untested_rounds=state.untested_rounds + 1)
        state = replace(state, untested_rounds=0)
        accumulated = self.support_sets == "accumulated"
        clustering = cluster_support(
            engine, state.clustering, alpha=self.alpha, epsilon=self.epsilon,
            partition_of_device=state.partition_of_device, accumulate=accumulated,
            penalized=self.support_loss == "penalized", misclassified=self.misclassified_loss,
        )
        if self.merge == "overlapping":
            clustering = cluster_merge_overlapping(clustering)
        elif self.merge == "absorbing":
            clustering = cluster_merge_absorbing(clustering)
        else:
            clustering = cluster_merge(clustering, ctx.rng, inherit=not accumulated)
        state = replace(state, clustering=clustering, rounds_in_phase=n)
        stable = clustering.partition() == state.before  # this round merged nothing
        if self.stable == "support":  # ... nor changed who supports whom (ids persist when nothing merged)
            stable = stable and support_edges(clustering.clusters) == state.support_before
        elif self.stable == "no_one_way":  # ... and no cluster still trains on a supporter it does not support
            stable = stable and not support_edges(clustering.clusters)  # mutual edges would have merged
        if self.variant == "flat":
            if stable or n >= self.max_rounds:
                return self._training(state)
            return state
        fixed = self.level_end == "fixed"
        if len(np.unique(state.partition_of_device)) == 1:  # the last level: Alg. 5's loop
            done = n >= self.rounds_per_level if fixed else stable or n >= self.max_rounds
            return self._training(state) if done else state
        if n < self.rounds_per_level and (fixed or not stable):
            return state
        partition = pair_partitions(state.partition_of_device, self.partition_order, ctx.rng)
        return replace(state, rounds_in_phase=0, partition_of_device=partition)

    def _tests_after(self, state: FAACLState) -> bool:
        """Whether this clustering round ends with Alg. 2's test and Alg. 3's merge."""
        return state.untested_rounds + 1 >= self.train_rounds_per_test

    def _training(self, state: FAACLState) -> FAACLState:
        return replace(state, phase="training" if self.rounds > 0 else "done", rounds_in_phase=0)


def _partition_of_cluster(clusters, partition_of_device) -> list[int]:
    if partition_of_device is None:
        return [0] * len(clusters)
    return [int(partition_of_device[min(c.devices)]) if c.devices else -1 for c in clusters]


def _remap_sup(sup: frozenset[int], partner: dict[int, tuple[int, int]], old: set[int]) -> frozenset[int]:
    """Supporters after the merges: old ids dropped, the merged C' listed when both of
    its parents were (``partner``: old id -> (other parent, C'.id))."""
    out = {s for s in sup if s not in old}
    out |= {partner[s][1] for s in sup if s in partner and partner[s][0] in sup}
    return frozenset(out)
