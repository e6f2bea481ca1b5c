"""FAACL's steps (thesis Alg. 1–6) on constructed clusterings and real digits data."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import (
    FAACL,
    Cluster,
    Clustering,
    cluster_initialization,
    cluster_merge,
    cluster_merge_overlapping,
    cluster_support,
    cluster_train,
)
from clusterfed.algorithms.base import model_bytes
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.engine.stacked import take
from clusterfed.scenarios import build_scenario


def _clustering(sups: dict[int, set[int]]) -> Clustering:
    """Singleton clusters 0..k-1 whose model is a scalar equal to its id."""
    clusters = tuple(Cluster(id=i, devices=frozenset({i}), sup=frozenset(s)) for i, s in sups.items())
    return Clustering(clusters, {"w": torch.arange(len(sups), dtype=torch.float32)[:, None]})


def test_one_way_support_is_kept_and_not_merged():
    c = _clustering({0: {1}, 1: set()})  # 1 supports 0, but not the other way round
    out = cluster_merge(c, np.random.default_rng(0))
    assert out is c
    assert out.clusters[0].sup == {1} and out.clusters[1].sup == set()


def test_mutual_support_merges_devices_intersects_sup_and_keeps_one_model():
    c = _clustering({0: {1, 2}, 1: {0, 2}, 2: set(), 3: {0, 1}})
    kept = set()
    for seed in range(20):
        out = cluster_merge(c, np.random.default_rng(seed))
        assert [sorted(k.devices) for k in out.clusters] == [[0, 1], [2], [3]]
        merged = out.clusters[0]
        assert merged.id == 4 and merged.sup == {2}
        # cluster 3 listed both merged clusters: it now lists the merged one
        assert out.clusters[2].sup == {4}
        value = float(out.params["w"][0])
        assert value in (0.0, 1.0)  # one parent's model, never the average 0.5
        kept.add(value)
    assert kept == {0.0, 1.0}  # chosen at random


def test_each_cluster_merges_at_most_once_per_call():
    c = _clustering({0: {1, 2}, 1: {0, 2}, 2: {0, 1}})  # all mutually supportive
    out = cluster_merge(c, np.random.default_rng(0))
    assert sorted(sorted(k.devices) for k in out.clusters) == [[0, 1], [2]]


def test_merge_without_inheritance_leaves_the_merged_cluster_unlisted_and_without_supporters():
    """The authors' code: C' = C1 ∪ C2 starts with no supporter, and a cluster that
    listed C1 and C2 lists neither nor C' until a test finds C' supportive."""
    c = _clustering({0: {1, 2}, 1: {0, 2}, 2: set(), 3: {0, 1}})
    out = cluster_merge(c, np.random.default_rng(0), inherit=False)
    assert [sorted(k.devices) for k in out.clusters] == [[0, 1], [2], [3]]
    assert [set(k.sup) for k in out.clusters] == [set(), set(), set()]
    kept = cluster_merge(_clustering({0: {1}, 1: {0}, 2: {0}}), np.random.default_rng(0), inherit=False)
    assert kept.clusters[1].sup == set()  # 2 listed only C1: dropped under both readings


def test_overlapping_merge_unites_every_mutual_pair_with_the_first_model():
    """The authors' merge loop: cluster 0 merges with both of its mutual partners in one
    call, so C' = {0, 1} and {0, 2} share device 0; each takes cluster 0's model and no
    supporter, and cluster 3 drops the merged ids it listed. A second call unites the two."""
    c = _clustering({0: {1, 2}, 1: {0, 2}, 2: {0, 1}, 3: {0, 2}})
    out = cluster_merge_overlapping(c)
    assert out.overlapping
    assert [(k.id, sorted(k.devices), set(k.sup)) for k in out.clusters] == [
        (4, [0, 1], set()), (5, [0, 2], set()), (3, [3], set())]
    assert out.params["w"].flatten().tolist() == [0.0, 0.0, 3.0]
    rows, devices = out.memberships()
    assert list(zip(rows.tolist(), devices.tolist())) == [(0, 0), (1, 0), (0, 1), (1, 2), (2, 3)]
    assert out.model_of_device(4).tolist() == [0, 0, 1, 2]  # a shared device: its first cluster
    mutual = Clustering(tuple(Cluster(k.id, k.devices, frozenset({4, 5} - {k.id}) if k.id != 3 else frozenset())
                              for k in out.clusters), out.params, overlapping=True)
    again = cluster_merge_overlapping(mutual)
    assert [sorted(k.devices) for k in again.clusters] == [[0, 1, 2], [3]]
    assert cluster_merge_overlapping(_clustering({0: {1}, 1: set()})).overlapping is False  # nothing merged


@pytest.fixture(scope="module")
def s2_engine(digits):
    fed = build_scenario(digits, "S2", group_sizes=[3, 3], seed=10)
    return fed, Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")


def test_support_on_trained_models_follows_the_concepts(s2_engine):
    fed, engine = s2_engine
    gen = torch.Generator().manual_seed(0)
    clustering = cluster_initialization(engine, gen, init_epochs=40)
    clustering = cluster_support(engine, clustering, alpha=0.1, epsilon=0.5)
    for c in clustering.clusters:
        (d,) = c.devices
        same = {e for e in range(fed.n_devices) if e != d and fed.groups[e] == fed.groups[d]}
        assert c.sup == same  # same-concept models support, shifted-label ones never


def test_accumulated_support_keeps_a_supporter_the_test_no_longer_finds(s2_engine):
    """``accumulate``: a test only adds supporters (the authors' ``add_supportive``).
    Each device's cluster is given the first shifted-label cluster as a supporter,
    which the test never finds (previous test): recomputed drops it, accumulated keeps
    it beside the same-concept supporters the test finds."""
    fed, engine = s2_engine
    clustering = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    planted = {c.id: min(e for e in range(fed.n_devices) if fed.groups[e] != fed.groups[min(c.devices)])
               for c in clustering.clusters}
    clustering = Clustering(
        tuple(Cluster(c.id, c.devices, frozenset({planted[c.id]})) for c in clustering.clusters), clustering.params
    )
    for accumulate in (False, True):
        out = cluster_support(engine, clustering, alpha=0.1, epsilon=0.5, accumulate=accumulate)
        for c in out.clusters:
            (d,) = c.devices
            same = {e for e in range(fed.n_devices) if e != d and fed.groups[e] == fed.groups[d]}
            assert c.sup == (same | {planted[c.id]} if accumulate else same)


def test_an_empty_cluster_lists_no_supporter_so_it_neither_trains_nor_merges(s2_engine):
    """C-FAACL keeps a cluster whose devices all left as the memory of its concept.
    Here it holds concept 0's model, and concept-0 device 0's own cluster finds that
    model supportive. Read vacuously ("every device of C1 ..." over no devices), the
    empty cluster would list every cluster, train on all six devices and merge with
    device 0's cluster. With no supporter it keeps its model through Alg. 4's training
    and is still there after Alg. 3's merge, with or without ``accumulate``."""
    fed, engine = s2_engine
    trained = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    memory_row = 0  # device 0's trained model (concept 0) as the remembered one
    params = {k: torch.cat([v, v[memory_row : memory_row + 1]]) for k, v in trained.params.items()}
    empty = Cluster(id=99, devices=frozenset(), sup=frozenset({1, 2}))
    clustering = Clustering(trained.clusters + (empty,), params)
    for accumulate in (False, True):
        out = cluster_support(engine, clustering, alpha=0.1, epsilon=0.5, accumulate=accumulate)
        assert out.clusters[-1].sup == set()
        assert 99 in out.clusters[0].sup  # the remembered concept-0 model supports device 0
        models, _ = out.training_pairs()
        assert len(out.clusters) - 1 not in models.tolist()  # no (model, device) pair for it
        after = cluster_train(engine, out, torch.Generator().manual_seed(1))
        for k, v in after.params.items():
            assert torch.equal(v[-1], params[k][-1]), k  # the remembered model is untouched
        merged = cluster_merge(out, np.random.default_rng(0))
        assert [c.id for c in merged.clusters if not c.devices] == [99]


def test_two_empty_clusters_under_partitions_are_skipped_not_evaluated(s2_engine):
    """Under H-FAACL's partitions, every emptied cluster lands in partition −1; two of them
    form a "partition" of clusters with no device to test on. It is skipped (no engine
    call over zero devices) and the other clusters' supports are what they are without
    the empty ones."""
    _, engine = s2_engine
    trained = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    partition = np.array([0, 1, 0, 1, 0, 1])
    alone = cluster_support(engine, trained, alpha=0.1, epsilon=0.5, partition_of_device=partition)
    params = {k: torch.cat([v, v[:2]]) for k, v in trained.params.items()}
    empties = (Cluster(id=98, devices=frozenset()), Cluster(id=99, devices=frozenset()))
    out = cluster_support(engine, Clustering(trained.clusters + empties, params), alpha=0.1, epsilon=0.5,
                          partition_of_device=partition)
    assert [c.sup for c in out.clusters[-2:]] == [frozenset(), frozenset()]
    assert [c.sup for c in out.clusters[:-2]] == [c.sup for c in alone.clusters]


def test_support_is_restricted_to_partitions(s2_engine):
    _, engine = s2_engine
    clustering = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    partition = np.array([0, 1, 0, 1, 0, 1])
    out = cluster_support(engine, clustering, alpha=0.1, epsilon=0.5, partition_of_device=partition)
    for c in out.clusters:
        (d,) = c.devices
        assert all(partition[s] == partition[d] for s in c.sup)


def _support_before_issue_17(engine, clustering, *, alpha, epsilon, partition_of_device=None, accumulate=False,
                             penalized=False, misclassified="model"):
    """Alg. 2 as it was computed before issue 17: every model on every device, one
    Python-assembled test per (C1, C2, d); returns each cluster's support set."""
    from clusterfed.stats import significant, support_pvalues

    assert not penalized and misclassified == "model", "the reference compares the data losses only"

    clusters = clustering.clusters
    losses = engine.losses(clustering.params, "val").cpu().numpy()
    counts = engine.data.val.counts.cpu().numpy()
    part = [0 if partition_of_device is None else int(partition_of_device[min(c.devices)]) for c in clusters]
    tests, own, other = [], [], []
    for i, c1 in enumerate(clusters):
        for j in range(len(clusters)):
            if i != j and part[i] == part[j]:
                for d in c1.devices:
                    tests.append((i, j))
                    own.append(losses[i, d, : counts[d]])
                    other.append(losses[j, d, : counts[d]])
    ok = significant(support_pvalues(own, other, epsilon), alpha)
    failed = {t for t, good in zip(tests, ok) if not good}
    return [
        {clusters[j].id for j in range(len(clusters)) if (i, j) in set(tests) - failed}
        for i in range(len(clusters))
    ]


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("partition", [None, [0, 1, 0, 1, 0, 1, 1, 0, 0, 1], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1]])
def test_support_by_partition_equals_the_full_evaluation(digits, partition, overlapping):
    fed = build_scenario(digits, "S2", group_sizes=[5, 5], seed=55)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    gen = torch.Generator().manual_seed(0)
    clustering = cluster_initialization(engine, gen, init_epochs=10)
    # clusters of several devices: merge two pairs (or, overlapping, every mutual pair), then test again
    supported = cluster_support(engine, clustering, alpha=0.1, epsilon=0.5)
    if overlapping:
        clustering = cluster_merge_overlapping(supported)
        _, devices = clustering.memberships()
        assert len(devices) > len(set(devices.tolist()))  # some device is in two clusters
    else:
        clustering = cluster_merge(supported, np.random.default_rng(0))
    part = None if partition is None else np.asarray(partition)
    edges = 0
    for eps in (0.05, 0.5, 2.0):
        out = cluster_support(engine, clustering, alpha=0.1, epsilon=eps, partition_of_device=part)
        expected = _support_before_issue_17(engine, clustering, alpha=0.1, epsilon=eps, partition_of_device=part)
        assert [set(c.sup) for c in out.clusters] == expected
        edges += sum(len(s) for s in expected)
    assert edges > 0 and len(clustering.clusters) < 10  # the comparison is not empty


def test_faacl_clusters_and_rounds_unchanged_by_partial_evaluation(digits, monkeypatch):
    import clusterfed.algorithms.faacl as faacl

    fed = build_scenario(digits, "S2", group_sizes=[5, 5], seed=55)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    runs = []
    for support in (faacl.cluster_support, None):
        if support is None:
            def support(engine, clustering, **kw):
                sups = _support_before_issue_17(engine, clustering, **kw)
                return Clustering(
                    tuple(Cluster(c.id, c.devices, frozenset(s)) for c, s in zip(clustering.clusters, sups)),
                    clustering.params,
                )
        monkeypatch.setattr(faacl, "cluster_support", support)
        result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=3).fit(engine, seed=55)
        runs.append(([sorted(c.devices) for c in result.clusters], [h["accuracy"] for h in result.history]))
    assert runs[0] == runs[1]
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0


def test_cluster_train_uses_supporters_data(s2_engine):
    _, engine = s2_engine
    clustering = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=1)
    clustering = Clustering(
        tuple(Cluster(c.id, c.devices, frozenset({1}) if c.id == 0 else frozenset()) for c in clustering.clusters),
        clustering.params,
    )
    models, devices = clustering.training_pairs()
    assert devices[models == 0].tolist() == [0, 1]  # cluster 0 trains on device 1's data too
    assert devices[models == 1].tolist() == [1]
    trained = cluster_train(engine, clustering, torch.Generator().manual_seed(1))
    assert not torch.equal(trained.params["output.bias"], clustering.params["output.bias"])


@pytest.mark.parametrize("w", [0.0, 0.25, 1.0])
def test_supporter_weight_scales_the_supporters_share_of_alg4(s2_engine, w):
    fed, engine = s2_engine
    clustering = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=1)
    clustering = Clustering(
        tuple(Cluster(c.id, c.devices, frozenset({1, 2}) if c.id == 0 else frozenset()) for c in clustering.clusters),
        clustering.params,
    )
    models, devices = clustering.training_pairs()
    local = engine.local_models(clustering.params, models, devices, torch.Generator().manual_seed(3)).params
    trained = cluster_train(engine, clustering, torch.Generator().manual_seed(3), supporter_weight=w)
    n = np.array([d.n_train for d in fed.devices], dtype=np.float64)
    rows = np.flatnonzero(models == 0)  # cluster 0: its device 0, supporters 1 and 2
    weight = n[devices[rows]] * np.where(devices[rows] == 0, 1.0, w)
    for key, value in trained.params.items():
        expected = sum(wi * local[key][r].double() for wi, r in zip(weight, rows)) / weight.sum()
        torch.testing.assert_close(value[0].double(), expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="supporter_weight"):
        FAACL(supporter_weight=1.5)


@pytest.mark.parametrize("variant", ["flat", "hierarchical"])
def test_faacl_recovers_the_two_s2_groups_on_digits(digits, variant):
    fed = build_scenario(digits, "S2", group_sizes=[5, 5], seed=55)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=30, variant=variant).fit(engine, seed=55)
    assert result.n_clusters == 2
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert result.device_accuracy.mean() > 0.9
    assert result.history[-1]["phase"] == "training" and len(result.history) >= 31


def test_random_pairs_follow_no_device_order_and_the_authors_fold_does():
    from clusterfed.algorithms.faacl import pair_partitions

    rng = np.random.default_rng(0)
    level1 = pair_partitions(np.arange(10), "random", rng)
    assert sorted(np.bincount(level1).tolist()) == [2] * 5  # singletons paired
    assert level1.tolist() != pair_partitions(np.arange(10), "random", rng).tolist()  # drawn anew
    level2 = pair_partitions(level1, "random", rng)
    assert sorted(np.bincount(level2).tolist()) == [2, 4, 4]  # an odd partition waits alone
    # the authors' code: partition k with partition P-1-k, in device order
    assert pair_partitions(np.arange(6), "authors", rng).tolist() == [0, 1, 2, 2, 1, 0]
    assert pair_partitions(np.array([0, 1, 2, 2, 1, 0]), "authors", rng).tolist() == [0, 1, 0, 0, 1, 0]
    assert pair_partitions(np.arange(5), "authors", rng).tolist() == [0, 1, 2, 1, 0]
    # the authors' earlier procedure: 2i with 2i+1, in device order
    assert pair_partitions(np.arange(5), "adjacent", rng).tolist() == [0, 0, 1, 1, 2]
    assert pair_partitions(np.array([0, 0, 1, 1, 2]), "adjacent", rng).tolist() == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("scenario", ["S1", "S2"])
def test_hierarchical_faacl_finds_the_flat_clusters_and_every_level_compares(digits, scenario, monkeypatch):
    import clusterfed.algorithms.faacl as faacl

    fed = build_scenario(digits, scenario, group_sizes=[6, 6], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    compared = []  # cluster pairs each support test compares

    def counting_support(engine, clustering, **kw):
        part = kw.get("partition_of_device")
        labels = np.array([0 if part is None else part[min(c.devices)] for c in clustering.clusters])
        compared.append(int((labels[:, None] == labels[None, :]).sum() - len(labels)))
        return support(engine, clustering, **kw)

    support = faacl.cluster_support
    monkeypatch.setattr(faacl, "cluster_support", counting_support)
    partitions = {}
    for variant in ("flat", "hierarchical"):
        compared.clear()
        result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1, variant=variant).fit(engine, seed=10)
        partitions[variant] = {frozenset(c.devices) for c in result.clusters}
        assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
        assert min(compared) > 0  # no round (in particular no level) compares nothing
        if variant == "hierarchical":  # 12 devices: 4 levels, one round each but the last (until stable)
            assert len(compared) >= 4
    assert partitions["flat"] == partitions["hierarchical"]


def test_fixed_levels_run_exactly_rounds_per_level_rounds_the_last_included(digits, monkeypatch):
    """``level_end="fixed"`` (the authors' ``repeat``): 12 devices give levels of 6, 3, 2
    and 1 partitions, each exactly 2 clustering rounds; ``merge_less`` ends a level
    early on a round that merges nothing and runs the last until stable."""
    fed = build_scenario(digits, "S2", group_sizes=[6, 6], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    after = _record_merges(monkeypatch)
    for level_end, rounds in (("fixed", 8), ("merge_less", None)):
        after.clear()
        result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1, variant="hierarchical",
                       rounds_per_level=2, level_end=level_end, support_sets="accumulated").fit(engine, seed=10)
        assert sum(r["phase"] == "clustering" for r in result.history) == len(after)
        if rounds is not None:
            assert len(after) == rounds
        else:
            assert after[-1][0] == after[-2][0]  # the last level ended on a round that merged nothing
        assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    with pytest.raises(ValueError, match="FAACL.support_sets"):
        FAACL(support_sets="sticky")


def test_train_rounds_per_test_trains_between_merge_steps_and_counts_only_tests(digits, monkeypatch):
    """``train_rounds_per_test=3`` (the authors' earlier procedure trains 10 rounds
    between merge steps): the 8 support tests of four fixed levels of 2 come after
    every third clustering round, so the phase has 24 rounds, and only the testing
    rounds carry Alg. 2's traffic (every cluster model to every device)."""
    fed = build_scenario(digits, "S2", group_sizes=[6, 6], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    after = _record_merges(monkeypatch)
    method = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1, variant="hierarchical", rounds_per_level=2,
                   level_end="fixed", support_sets="accumulated", train_rounds_per_test=3)
    result = method.fit(engine, seed=10)
    clustering = [r for r in result.history if r["phase"] == "clustering"]
    assert len(after) == 8 and len(clustering) == 24 == method.expected_rounds(12) - 1
    size = model_bytes(result.params)  # Alg. 4 uploads whole models; Alg. 2 adds 8 bytes a cluster and device
    assert [row["bytes_up"] % size != 0 for row in clustering] == [i % 3 == 2 for i in range(24)]
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    with pytest.raises(ValueError, match="FAACL.train_rounds_per_test"):
        FAACL(train_rounds_per_test=0)


def test_overlapping_merge_takes_k_minus_1_rounds_to_unite_k_mutual_clusters(digits, monkeypatch):
    """``merge="overlapping"`` (the authors' loop), flat, on two groups of 6 devices whose
    singletons all support each other: each round the first cluster of a group merges
    with every other, so the group's k clusters become k − 1 overlapping ones, and
    uniting it takes 5 rounds where one merge per cluster (the default) takes 3. A level
    of exactly 3 rounds (the authors' ``repeat``) leaves such a group in several clusters."""
    import clusterfed.algorithms.faacl as faacl

    fed = build_scenario(digits, "S2", group_sizes=[6, 6], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    merge, listed = faacl.cluster_merge_overlapping, []

    def recording(clustering):
        out = merge(clustering)
        listed.append([sorted(c.devices) for c in out.clusters])
        return out

    monkeypatch.setattr(faacl, "cluster_merge_overlapping", recording)
    result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1, merge="overlapping").fit(engine, seed=10)
    assert [len(x) for x in listed] == [10, 8, 6, 4, 2, 2]
    assert listed[0] == [[0, d] for d in range(1, 6)] + [[6, d] for d in range(7, 12)]
    assert listed[-1] == [list(range(6)), list(range(6, 12))]
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    after = _record_merges(monkeypatch)
    FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1).fit(engine, seed=10)
    assert [len(p) for p, _ in after] == [6, 4, 2, 2]
    with pytest.raises(ValueError, match="FAACL.merge"):
        FAACL(merge="union")


def test_supporter_weight_is_a_declared_parameter_that_reaches_alg4(digits):
    from clusterfed.config import parse_params
    from clusterfed.build import build_federation

    base = {"scenario": {"name": "A2", "construction": "authors"}, "continual": {"enabled": False}}
    params = parse_params({**base, "coldstart": {"faacl": {"supporter_weight": 0.1}}})
    assert params.coldstart.faacl.supporter_weight == 0.1
    fed = build_federation(params, seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    results = [
        FAACL(epsilon=0.4, init_epochs=10, rounds=2, supporter_weight=w).fit(engine, seed=10) for w in (1.0, 0.1)
    ]
    # a round that trained with supporters gives other models under the other weight
    rounds = [i for i, r in enumerate(results[0].history) if r["support_edges"]]
    assert rounds
    assert all(results[0].history[i]["accuracy"] != results[1].history[i]["accuracy"] for i in rounds)


def _record_merges(monkeypatch) -> list[tuple]:
    """(partition, support edges) after each round's support test and merge: FAACL's
    ``cluster_merge`` wrapped for the rest of the test."""
    import clusterfed.algorithms.faacl as faacl

    merge, after = faacl.cluster_merge, []

    def recording_merge(clustering, rng, **kw):
        out = merge(clustering, rng, **kw)
        after.append((out.partition(), {(c.id, s) for c in out.clusters for s in c.sup}))
        return out

    monkeypatch.setattr(faacl, "cluster_merge", recording_merge)
    return after


def test_stable_support_waits_for_a_round_that_changes_no_support_set(digits, monkeypatch):
    """Alg. 5's loop ends on C = C*: with ``stable="support"`` the last clustering
    round leaves the partition and every support set as the round before it; with
    ``"partition"`` it ends on the first round that merges nothing. On this H-FAACL
    run the first leaves 4 clusters (one-way edges still standing), the second waits
    until they turn mutual and finds the 2 groups."""

    fed = build_scenario(digits, "S2", group_sizes=[10, 10], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    after = _record_merges(monkeypatch)  # (partition, support edges) after each round's test and merge
    found = {}
    for stable in ("partition", "support"):
        after.clear()
        result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=10, rounds=1, variant="hierarchical",
                       stable=stable).fit(engine, seed=10)
        last, before = after[-1], after[-2]
        assert last[0] == before[0]  # the last round merged nothing
        if stable == "support":
            assert last[1] == before[1]  # ... and changed no support set
        else:
            assert last[1] != before[1]
        found[stable] = (len(after), result.n_clusters, adjusted_rand_score(fed.groups, result.model_of_device))
    assert found["partition"][1:] == (4, pytest.approx(0.568, abs=1e-3))
    assert found["support"][1:] == (2, 1.0) and found["support"][0] > found["partition"][0]
    with pytest.raises(ValueError, match="FAACL.stable"):
        FAACL(stable="edges")


def test_stable_no_one_way_waits_until_every_one_way_support_is_gone(digits, monkeypatch):
    """A one-way edge C ← C' trains C on C''s devices (Alg. 4) until C' finds C no
    worse too: here the partition rule stops with 3 clusters (a small one still
    supported one way by its group's big one), ``"no_one_way"`` waits and merges it."""

    fed = build_scenario(digits, "S2", group_sizes=[10, 10], seed=10)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    after = _record_merges(monkeypatch)
    found = {}
    for stable in ("partition", "no_one_way"):
        after.clear()
        result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=1, variant="hierarchical",
                       stable=stable).fit(engine, seed=10)
        found[stable] = (len(after), result.n_clusters, adjusted_rand_score(fed.groups, result.model_of_device))
        assert bool(after[-1][1]) == (stable == "partition")  # one-way edges left only by the partition rule
    assert found["partition"][1:] == (3, pytest.approx(0.743, abs=1e-3))
    assert found["no_one_way"][1:] == (2, 1.0) and found["no_one_way"][0] > found["partition"][0]


def _rescaled(params: dict, c: float) -> dict:
    """The same ReLU MLP function with the hidden layer × c and the output kernel / c
    (positive homogeneity): identical losses, a different L2 penalty."""
    w1, b1, w2 = list(params)[:3]  # the MLP's hidden kernel, hidden bias, output kernel
    out = dict(params)
    out[w1], out[b1], out[w2] = params[w1] * c, params[b1] * c, params[w2] / c
    return out


def test_engine_penalties_are_l2_times_the_squared_kernels(s2_engine):
    _, engine = s2_engine
    params = engine.init_params(2, torch.Generator().manual_seed(0), distinct=True)
    expected = [engine.training.l2 * sum(float((v[m].double() ** 2).sum()) for k, v in params.items()
                                         if k.endswith("weight")) for m in range(2)]
    np.testing.assert_allclose(engine.penalties(params), expected, rtol=1e-12)


def test_penalized_support_turns_equal_losses_into_one_way_support(s2_engine):
    """Two clusters whose models compute the same function, one with its hidden layer
    scaled up (a larger L2 penalty). On the data losses every difference is zero at
    ε = 0, so neither supports the other. Penalized (the authors' Keras losses), the
    cluster with the heavier model finds the lighter model better on every sample and
    lists it as a supporter; the reverse test fails."""
    fed, engine = s2_engine
    base = engine.init_params(1, torch.Generator().manual_seed(0), distinct=True)
    heavy = _rescaled(base, 3.0)
    params = {k: torch.cat([base[k], heavy[k]]) for k in base}
    np.testing.assert_allclose(engine.losses(params)[0].numpy(), engine.losses(params)[1].numpy(), rtol=1e-5, atol=1e-6)
    r = engine.penalties(params)
    assert r[1] > r[0]
    light_devices, heavy_devices = frozenset({0, 1, 2}), frozenset({3, 4, 5})
    clustering = Clustering((Cluster(0, light_devices), Cluster(1, heavy_devices)), params)
    data = cluster_support(engine, clustering, alpha=0.1, epsilon=0.0)
    assert [c.sup for c in data.clusters] == [frozenset(), frozenset()]
    penalized = cluster_support(engine, clustering, alpha=0.1, epsilon=0.0, penalized=True)
    assert [c.sup for c in penalized.clusters] == [frozenset(), frozenset({0})]


def _sharpened(params: dict, c: float) -> dict:
    """The same predictions with the logits × c: more confident, right or wrong."""
    w2, b2 = list(params)[2:4]  # the MLP's output kernel and bias
    out = dict(params)
    out[w2], out[b2] = params[w2] * c, params[b2] * c
    return out


@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_uniform_misclassified_loss_finds_no_support_where_both_models_are_always_wrong(s2_engine, epsilon):
    """A model trained on device 0 (the first concept) and a sharper copy of it that
    predicts the same labels. Devices 3–5 hold the label-shifted concept: both models
    are wrong on nearly every one of their validation samples. On the cross-entropy,
    the unsure original is charged less for those mistakes than the sharp copy, so the
    copy's cluster lists it as a supporter and the two clusters would merge. With the
    authors' corrected loss each mistake counts ln K for both models: the samples tie,
    there is no evidence, and the shifted cluster lists nobody. The first concept's
    devices, mostly right, find the sharper copy no worse under both losses."""
    _, engine = s2_engine
    init = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    unsure = take(init.params, [0])
    params = {k: torch.cat([unsure[k], _sharpened(unsure, 3.0)[k]]) for k in unsure}
    wrong = engine.losses(params, "val", measure="zero_one")[:, 3:].numpy()
    assert wrong.sum() >= 0.98 * 2 * 3 * 60  # both models, devices 3-5, 60 validation samples each
    clustering = Clustering((Cluster(0, frozenset({0, 1, 2})), Cluster(1, frozenset({3, 4, 5}))), params)
    data = cluster_support(engine, clustering, alpha=0.1, epsilon=epsilon)
    assert [c.sup for c in data.clusters] == [frozenset({1}), frozenset({0})]
    corrected = cluster_support(engine, clustering, alpha=0.1, epsilon=epsilon, misclassified="uniform")
    assert [c.sup for c in corrected.clusters] == [frozenset({1}), frozenset()]


def test_uniform_misclassified_loss_equals_a_per_test_reference(s2_engine):
    """Every (C1, C2, d) test of the corrected loss against one assembled by hand:
    ln 10 for each wrong prediction, ε added to C1's right ones only."""
    from clusterfed.stats import significant, support_pvalues

    fed, engine = s2_engine
    clustering = cluster_initialization(engine, torch.Generator().manual_seed(1), init_epochs=5)
    out = cluster_support(engine, clustering, alpha=0.1, epsilon=0.3, misclassified="uniform")
    losses = engine.losses(clustering.params, "val").numpy()
    wrong = engine.losses(clustering.params, "val", measure="zero_one").numpy() > 0.5
    counts = engine.counts("val")
    corrected = np.where(wrong, np.log(10.0), losses)
    expected = []
    for i in range(fed.n_devices):  # singleton cluster i holds device i
        n = counts[i]
        own = corrected[i, i, :n] + np.where(wrong[i, i, :n], 0.0, 0.3)
        others = [j for j in range(fed.n_devices) if j != i]
        p = support_pvalues([own] * len(others), [corrected[j, i, :n] for j in others], 0.0)
        expected.append(frozenset(j for j, ok in zip(others, significant(p, 0.1)) if ok))
    assert [c.sup for c in out.clusters] == expected
    n_tests = fed.n_devices * (fed.n_devices - 1)
    assert 0 < sum(map(len, expected)) < n_tests  # the tests decide both ways here


def test_absorbing_merge_gives_c1_its_supporters_devices_and_keeps_the_supporters():
    """The authors' earlier merge: support alone merges. Cluster 0 lists 1 (one way):
    C' = {0, 1} keeps model 0 and goes to the end; 1 and 2 stay, and every support set
    is spent."""
    from clusterfed.algorithms import cluster_merge_absorbing

    out = cluster_merge_absorbing(_clustering({0: {1}, 1: set(), 2: set()}))
    assert out.overlapping
    assert [(c.id, sorted(c.devices), c.sup) for c in out.clusters] == [
        (1, [1], frozenset()), (2, [2], frozenset()), (3, [0, 1], frozenset())]
    assert out.params["w"][:, 0].tolist() == [1.0, 2.0, 0.0]
    assert out.model_of_device(3).tolist() == [2, 0, 1]  # device 1: its first cluster


def test_absorbing_merge_makes_a_union_once_and_never_a_copy_of_a_cluster():
    """Mutual support: 0 and 1 both make {0, 1}, which is made once, with 0's model.
    A union that a cluster already has is not made: its absorber is dropped."""
    from clusterfed.algorithms import cluster_merge_absorbing

    out = cluster_merge_absorbing(_clustering({0: {1}, 1: {0}}))
    assert [sorted(c.devices) for c in out.clusters] == [[0, 1]] and out.params["w"][:, 0].tolist() == [0.0]
    held = Clustering((Cluster(0, frozenset({0}), frozenset({1})), Cluster(1, frozenset({0, 1}))),
                      {"w": torch.tensor([[0.0], [1.0]])}, overlapping=True)
    out = cluster_merge_absorbing(held)
    assert [(c.id, sorted(c.devices)) for c in out.clusters] == [(1, [0, 1])]
    assert cluster_merge_absorbing(_clustering({0: set(), 1: set()})).clusters == _clustering({0: set(), 1: set()}).clusters


def test_serve_by_validation_gives_a_shared_device_its_best_validated_cluster(s2_engine):
    """Cluster 0 holds all six S2 devices with a model trained on device 3 (the
    label-shifted concept); cluster 1 holds devices 0-2 with device 0's model. Devices
    0-2, in both, are served by cluster 1, the one right on their validation data;
    3-5 by cluster 0, their only cluster. Serving the first cluster gives 0 to all."""
    from clusterfed.algorithms.faacl import serve_by_validation

    fed, engine = s2_engine
    init = cluster_initialization(engine, torch.Generator().manual_seed(0), init_epochs=40)
    shared = Clustering((Cluster(0, frozenset(range(6))), Cluster(1, frozenset({0, 1, 2}))),
                        take(init.params, [3, 0]), overlapping=True)
    assert shared.model_of_device(6).tolist() == [0] * 6
    served = serve_by_validation(engine, shared)
    assert served.model_of_device(6).tolist() == [1, 1, 1, 0, 0, 0]
    assert served.clusters == shared.clusters


def test_faacl_absorbing_merge_recovers_the_two_s2_groups_on_digits(digits):
    """The authors' earlier procedure end to end (one-way merges, corrected loss,
    best-validated serving) on two label-shifted concepts: no supporter crosses the
    concepts, so every absorbed cluster is of the absorber's concept."""
    fed = build_scenario(digits, "S2", group_sizes=[5, 5], seed=55)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    result = FAACL(alpha=0.1, epsilon=0.5, init_epochs=40, rounds=5, variant="hierarchical", merge="absorbing",
                   serve="validation", misclassified_loss="uniform").fit(engine, seed=55)
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert all(len({fed.groups[d] for d in c.devices}) == 1 for c in result.clusters)
    # one round left a device in a cluster that does not serve it; the next merge resolved it
    assert [r["helping_memberships"] for r in result.history] == [0, 0, 1] + [0] * 7


def test_a_served_clustering_survives_a_snapshot():
    """The rows a validation-served clustering picked are in its snapshot."""
    from clusterfed.snapshot import decode, encode

    shared = Clustering((Cluster(0, frozenset({0, 1})), Cluster(1, frozenset({1}))),
                        {"w": torch.tensor([[0.0], [1.0]])}, overlapping=True, served=np.array([0, 1]))
    back = decode(*encode(shared))
    assert back.clusters == shared.clusters and back.overlapping
    assert back.model_of_device(2).tolist() == [0, 1]
