"""Reproduce the MNIST column of the thesis' cold-start tables (Tables 3.3-3.6).

For each (scenario, seed) the federation (20 devices, two ground-truth groups of 10)
and one Engine are built once; then each algorithm runs and one JSON line is appended
to ``--out`` right away, so partial results survive an interruption. Runs already in
the file (same scenario, algorithm, seed and epochs) are skipped, and a fit that was
interrupted resumes from its last snapshot (``<out>.checkpoints/``, every
``--checkpoint-every`` rounds): re-running the same command resumes.

Hyperparameters (thesis Table B.1, MNIST): lr 0.01, L2 0.001, batch 10, one local
epoch per round, 300 rounds, alpha 0.1, epsilon 0.7 (S1/S2), 0.5 (A1), 0.4 (A2);
FAACL is the flat variant with 5 initial local epochs. ``--algorithms`` takes any
registered cold-start method, built through the registry with its declared defaults
(the ``params.yaml`` defaults) plus FAACL's settings above; the fixed-k baselines IFCA,
FeSEM, FedGroup and FedSoft start with 5 clusters (§3.3.4), their default.

    .venv/bin/python benchmarks/thesis_mnist.py --scenarios S1 S2 A1 A2 \\
        --algorithms faacl fedavg ifca local centralized --seeds 10 55 2077 \\
        --epochs 300 --out benchmarks/out/thesis_mnist.jsonl
    .venv/bin/python benchmarks/thesis_mnist.py --scenarios S1 S2 A1 A2 \\
        --algorithms fesem fedgroup fedsoft --seeds 10 --epochs 300 --threads 1 \\
        --out benchmarks/out/thesis_mnist_baselines.jsonl
    .venv/bin/python benchmarks/thesis_mnist.py --summarize --out benchmarks/out/thesis_mnist.jsonl

``--construction authors`` builds the scenarios as the authors' code does
(``clusterfed.scenarios.authors``: 100 devices, 50 on A2, of FedProx users with
standardised pixels); ``--local-epochs``, ``--init-epochs`` and ``--variant`` set the
training schedule (the authors: 300 rounds x 10 local epochs, 500 initial epochs,
hierarchical FAACL).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from clusterfed.scenarios.authors import DATA_SEED

#: The grid's default methods; ``--algorithms`` takes any registered cold-start method.
ALGORITHMS = ("faacl", "fedavg", "ifca", "local", "centralized")
#: The baselines of Tables 3.3-3.6 (issue 14), run with ``--algorithms fesem fedgroup fedsoft``.
BASELINES = ("fesem", "fedgroup", "fedsoft")
SCENARIOS = ("S1", "S2", "A1", "A2")
EPSILON = {"S0": 0.7, "S1": 0.7, "S2": 0.7, "A1": 0.5, "A2": 0.4}
ALPHA = 0.1

# Thesis Tables 3.3-3.6, MNIST column: accuracy % [clusters]. Local has no figure.
THESIS = {
    "S1": {"centralized": (94.85, 2), "fedavg": (81.86, 1), "ifca": (91.16, 5), "faacl": (93.44, 2),
           "fesem": (50.24, 3), "fedgroup": (93.73, 5), "fedsoft": (90.49, 5)},
    "S2": {"centralized": (97.06, 2), "fedavg": (51.36, 1), "ifca": (94.36, 4), "faacl": (95.73, 2),
           "fesem": (49.35, 3), "fedgroup": (95.55, 5), "fedsoft": (93.92, 5)},
    "A1": {"centralized": (78.39, 2), "fedavg": (70.33, 1), "ifca": (69.90, 5), "faacl": (75.12, 4),
           "fesem": (65.79, 4), "fedgroup": (74.65, 5), "fedsoft": (71.28, 5)},
    "A2": {"centralized": (97.32, 2), "fedavg": (89.77, 1), "ifca": (95.35, 3), "faacl": (96.01, 5),
           "fesem": (74.65, 1), "fedgroup": (95.44, 5), "fedsoft": (95.73, 5)},
}
LABEL = {"faacl": "FAACL", "fedavg": "FedAvg", "ifca": "IFCA", "local": "Local", "centralized": "Centralize",
         "fesem": "FeSEM", "fedgroup": "FedGroup", "fedsoft": "FedSoft"}


def coldstart_methods() -> list[str]:
    from clusterfed import registry

    return list(registry.methods("coldstart"))


def thesis_settings(name: str, scenario: str, *, init_epochs: int = 5, variant: str = "flat",
                    supporter_weight: float = 1.0) -> dict:
    """What the thesis sets for ``name`` beyond its declared defaults: FAACL's Table B.1
    (α, ε per scenario) and this script's schedule options. The fixed-k baselines
    (IFCA, FeSEM, FedGroup, FedSoft) start with five clusters (§3.3.4), which is their
    declared default, so they take none."""
    if name == "faacl":
        return {"alpha": ALPHA, "epsilon": EPSILON[scenario], "init_epochs": init_epochs, "variant": variant,
                "supporter_weight": supporter_weight}
    return {}


def make_algorithm(name: str, scenario: str, epochs: int, *, hyperparameters: dict | None = None, **options):
    """The registered cold-start method ``name`` with its declared defaults (those of
    ``params.yaml``'s ``coldstart.<name>`` section), the thesis' settings and then
    ``hyperparameters`` (``--set``)."""
    from clusterfed import registry

    settings = {**thesis_settings(name, scenario, **options), **(hyperparameters or {})}
    return registry.get("coldstart", name)(rounds=epochs, **settings)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut off by a kill: ignore it, the run reruns
                pass
    return rows


def _setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``, the value read as YAML (``K=3``, ``centres=random``)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--set expects KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _data_seed(row: dict) -> int:
    """The row's data seed: the authors' 0 for rows written before it was recorded and
    for the thesis reading (whose data follow the run seed)."""
    return DATA_SEED if row.get("data_seed") is None else row["data_seed"]


def _key(row: dict) -> tuple:
    return (row["scenario"], row["algorithm"], row["seed"], row["epochs"], row.get("local_epochs", 1),
            row.get("lr", 0.01), _data_seed(row))


def _checkpoint(out: Path, key: tuple, args) -> Path:
    """Where the fit of ``key`` keeps its snapshot: ``<out>.checkpoints/<key>`` (deleted
    once its row is written; a rerun of the command resumes from it)."""
    return out.with_name(out.name + ".checkpoints") / "_".join(str(k) for k in key)


def _fingerprint(key: tuple, args) -> str:
    """What a snapshot's rounds depend on beyond the method, seed and federation size:
    resuming is refused when any of it, or the library's code, changed. Not the
    ``--device``: every random draw is made on the CPU, so a GPU run resumed on a CPU
    differs from either only by float rounding (the row records the device it finished
    on and `resumed_from_round`)."""
    from clusterfed.build import code_digest

    return json.dumps({
        "key": list(key), "construction": args.construction, "users": args.users, "group_sizes": args.group_sizes,
        "first_devices": args.first_devices,
        "init_epochs": args.init_epochs, "variant": args.variant, "supporter_weight": args.supporter_weight,
        "set": sorted(args.set), "sparse_inputs": args.sparse_inputs, "code": code_digest(),
    }, sort_keys=True)


def _claim(out: Path, key: tuple) -> bool:
    """Record in ``<out>.claims`` that this process runs ``key``; False when a live
    process already claimed it (several workers sharing one out file)."""
    import fcntl

    path = out.with_name(out.name + ".claims")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        f.seek(0)
        for line in f.read().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if tuple(entry["key"]) == key and entry["pid"] != os.getpid() and _alive(entry["pid"]):
                return False
        f.write(json.dumps({"key": list(key), "pid": os.getpid()}) + "\n")
        f.flush()
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def append_row(path: Path, row: dict) -> None:
    """One O_APPEND write of the whole line under an exclusive lock, so several workers
    can share one out file without interleaving lines."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def run(args) -> None:
    import torch
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.data import load_dataset
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.algorithms.base import support_edges
    from clusterfed.scenarios import build_authors_scenario, build_scenario

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    done = {_key(r) for r in read_rows(out)}
    ds = load_dataset("mnist", args.root)
    training = TrainingConfig(lr=args.lr, l2=0.001, batch_size=10, local_epochs=args.local_epochs)
    for scenario in args.scenarios:
        for seed in args.seeds:
            todo = [a for a in args.algorithms
                    if (scenario, a, seed, args.epochs, args.local_epochs, args.lr, args.data_seed) not in done]
            if not todo:
                continue
            if args.construction == "authors":
                fed = build_authors_scenario(ds, scenario, seed=seed, users=args.users, data_seed=args.data_seed,
                                             first_devices=args.first_devices)
            else:
                fed = build_scenario(ds, scenario, group_sizes=args.group_sizes, seed=seed)
            eng = Engine(fed, model="mlp", training=training, hidden=128, device=args.device,
                         sparse_inputs=args.sparse_inputs)
            for name in todo:
                key = (scenario, name, seed, args.epochs, args.local_epochs, args.lr, args.data_seed)
                # another worker on the same out file may have done or started it meanwhile
                if key in {_key(r) for r in read_rows(out)} or not _claim(out, key):
                    print(f"[{datetime.now():%H:%M:%S}] {scenario} seed {seed} {name}: done or "
                          "running elsewhere, skipped", flush=True)
                    continue
                algo = make_algorithm(name, scenario, args.epochs, init_epochs=args.init_epochs,
                                      variant=args.variant, supporter_weight=args.supporter_weight,
                                      hyperparameters=dict(_setting(s) for s in args.set))
                print(f"[{datetime.now():%H:%M:%S}] {scenario} seed {seed} {name} ...", flush=True)
                ckpt = _checkpoint(out, key, args)
                t0, c0 = time.perf_counter(), time.process_time()
                res = algo.fit(eng, seed=seed, progress=args.progress, ground_truth=fed.groups,
                               oracle_pools=fed.oracle_pools, checkpoint=ckpt, checkpoint_every=args.checkpoint_every,
                               fingerprint=_fingerprint(key, args))
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                acc = res.device_accuracy
                hist = res.history
                edges = support_edges(res.clusters)
                row = {
                    "scenario": scenario,
                    "algorithm": name,
                    "seed": seed,
                    "epochs": args.epochs,
                    "construction": args.construction,
                    "data_seed": args.data_seed if args.construction == "authors" else None,
                    "first_devices": args.first_devices,
                    "local_epochs": args.local_epochs,
                    "lr": args.lr,
                    "init_epochs": args.init_epochs if name == "faacl" else None,
                    "variant": args.variant if name == "faacl" else None,
                    "supporter_weight": args.supporter_weight if name == "faacl" else None,
                    "sparse_inputs": args.sparse_inputs,
                    "groups": fed.groups.tolist(),
                    "n_train": [d.n_train for d in fed.devices],
                    "n_test": [len(d.y_test) for d in fed.devices],
                    "accuracy_group": {
                        int(g): float(acc[fed.groups == g].mean()) for g in np.unique(fed.groups)
                    },
                    "clusters": [
                        {"id": c.id, "devices": sorted(c.devices), "sup": sorted(c.sup)} for c in res.clusters
                    ],
                    "support_edges": len(edges),
                    "one_way_edges": sum((b, a) not in edges for a, b in edges),
                    "history_support_edges": [h.get("support_edges", 0) for h in hist],
                    "history_one_way_edges": [h.get("one_way_edges", 0) for h in hist],
                    "history_helping_memberships": [h.get("helping_memberships", 0) for h in hist],
                    "accuracy_mean": float(acc.mean()),
                    "accuracy_device": [round(float(a), 4) for a in acc],
                    "n_clusters": int(res.n_clusters),
                    "clusters_listed": len(res.clusters),
                    # FedSoft serving local models serves n models: its clusters are the largest-u ones
                    "importance_clusters": int(len(np.unique(algo.u_.argmax(1)))) if hasattr(algo, "u_") else None,
                    "importance_ari": float(adjusted_rand_score(fed.groups, algo.u_.argmax(1))) if hasattr(algo, "u_") else None,
                    # FedSoft: the last importance weights u_ks, [n, S] (v_sk ∝ u_ks n_k follows from them and n_train)
                    "importance_weights": algo.u_.round(4).tolist() if hasattr(algo, "u_") else None,
                    # FeSEM serving each client the centre it was last sent serves n models: its groups are its labels
                    "group_clusters": (int(len(np.unique(algo.labels_)))
                                       if name == "fesem" and algo.serve == "received" else None),
                    "group_ari": (float(adjusted_rand_score(fed.groups, algo.labels_))
                                  if name == "fesem" and algo.serve == "received" else None),
                    # FedSoft serving local models: the other reading, each device's largest-u cluster model
                    "accuracy_device_cluster_served": (
                        [round(float(a), 4) for a in eng.accuracy(algo.c_, algo.u_.argmax(1))]
                        if hasattr(algo, "c_") else None),
                    "accuracy_memberships": membership_accuracy(eng, res, fed),
                    "ari": float(adjusted_rand_score(fed.groups, res.model_of_device)),
                    "model_of_device": res.model_of_device.tolist(),
                    "wall_s": wall,  # of this process: a resumed fit's earlier rounds are not in it
                    "cpu_s": cpu,
                    "resumed_from_round": res.resumed_from_round,
                    # the values the fit ran with (Table B.1's unless --set changed them)
                    "epsilon": algo.epsilon if name == "faacl" else None,
                    "alpha": algo.alpha if name == "faacl" else None,
                    "ifca_clusters": algo.n_clusters if name == "ifca" else None,
                    "hyperparameters": {p.name: getattr(algo, p.name) for p in algo.declared()},
                    "mb_per_round": float(np.mean([h["bytes_down"] + h["bytes_up"] for h in hist])) / 1e6,
                    "clustering_rounds": sum(h["phase"] == "clustering" for h in hist),
                    "rejected_updates": int(res.rejected_updates),
                    "history_accuracy": [round(h["accuracy"], 4) for h in hist],
                    "history_n_clusters": [h["n_clusters"] for h in hist],
                    "group_sizes": list(args.group_sizes),
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "host": platform.node(),
                    "torch_threads": torch.get_num_threads(),
                    "device": str(eng.device),
                }
                append_row(out, row)
                shutil.rmtree(ckpt, ignore_errors=True)
                done.add(key)
                print(
                    f"    acc {row['accuracy_mean']:.4f}  clusters {row['n_clusters']}  "
                    f"ARI {row['ari']:.3f}  wall {wall:.1f}s  CPU {cpu:.1f}s  (clustering rounds "
                    f"{row['clustering_rounds']}, rejected {row['rejected_updates']})",
                    flush=True,
                )


def membership_accuracy(eng: Engine, res, fed) -> float:
    """The authors' figure when clusters overlap: every cluster's model on each of its
    devices' test data, averaged over all those (cluster, device) test samples, so a
    device listed by k clusters counts k times (their ``Partition.test``); equal to the
    accuracy over all test samples for a partition."""
    from clusterfed.algorithms import Clustering

    rows, devices = Clustering(res.clusters, res.params, overlapping=True).memberships()
    correct = tested = 0.0
    for row in np.unique(rows):
        acc = eng.accuracy(res.params, np.full(fed.n_devices, row))
        members = devices[rows == row]
        n_test = np.array([len(fed.devices[d].y_test) for d in members])
        correct += float((acc[members] * n_test).sum())
        tested += float(n_test.sum())
    return correct / tested


_N_TEST: dict[tuple, list[int]] = {}


def n_test(row: dict, root: str) -> list[int]:
    """Test samples per device of the row's federation (rows written before ``n_test``
    was recorded: rebuilt, the authors' federations do not depend on the seed)."""
    if "n_test" in row:
        return row["n_test"]
    key = (row.get("construction", "thesis"), row["scenario"], row["seed"], _data_seed(row))
    if key not in _N_TEST:
        from clusterfed.data import load_dataset
        from clusterfed.scenarios import build_authors_scenario, build_scenario

        ds = load_dataset("mnist", root)
        fed = (build_authors_scenario(ds, row["scenario"], seed=row["seed"], data_seed=key[3]) if key[0] == "authors"
               else build_scenario(ds, row["scenario"], group_sizes=row["group_sizes"], seed=row["seed"]))
        _N_TEST[key] = [len(d.y_test) for d in fed.devices]
    return _N_TEST[key]


def weighted_accuracy(row: dict, root: str, devices=None) -> float:
    """Test accuracy over all test samples (device accuracies weighted by their test
    samples): the figure the authors' code reports (``np.average(acc, weights=...)``)."""
    acc, n = np.asarray(row["accuracy_device"]), np.asarray(n_test(row, root), dtype=float)
    if devices is not None:
        acc, n = acc[devices], n[devices]
    return float((acc * n).sum() / n.sum())


def _clusters(row: dict) -> int:
    """Clusters of a run: the largest-u ones for FedSoft serving local models and the
    centres' groups for FeSEM serving what each client was last sent (both serve one
    model per device), the served models' otherwise."""
    return row.get("importance_clusters") or row.get("group_clusters") or row["n_clusters"]


def _cell(rows: list[dict], key: str = "accuracy_mean") -> str:
    acc = np.array([r[key] for r in rows]) * 100
    se = acc.std(ddof=1) / np.sqrt(len(acc)) if len(acc) > 1 else float("nan")
    k = [_clusters(r) for r in rows]
    ks = str(k[0]) if len(set(k)) == 1 else "/".join(map(str, k))
    se_s = f"{se:.2f}" if np.isfinite(se) else "n/a"
    n = "" if len(rows) == 3 else f" (n={len(rows)})"
    return f"{acc.mean():.2f} ± {se_s} [{ks}]{n}"


def summarize(args) -> None:
    rows = [r for r in read_rows(Path(args.out))
            if r["epochs"] == args.epochs and r.get("local_epochs", 1) == args.local_epochs
            and _data_seed(r) == args.data_seed]
    by, seen = {}, set()
    for r in rows:
        if _key(r) in seen:  # a run done twice (two workers): keep the first
            continue
        seen.add(_key(r))
        if r["seed"] in args.seeds:
            by.setdefault((r["algorithm"], r["scenario"]), []).append(r)
    if args.cluster_served:  # FedSoft serving local models: score the largest-u clusters it also records
        for rows in by.values():
            for r in rows:
                if r.get("accuracy_device_cluster_served") is None:
                    raise SystemExit(f"--cluster-served: the {r['algorithm']} {r['scenario']} seed {r['seed']} row "
                                     "records no accuracy_device_cluster_served (only FedSoft's rows do)")
                acc = np.asarray(r["accuracy_device_cluster_served"])
                groups = np.asarray(r["groups"])
                r["accuracy_device"], r["accuracy_mean"] = acc.tolist(), float(acc.mean())
                r["accuracy_group"] = {str(g): float(acc[groups == g].mean()) for g in np.unique(groups)}
    scen = [s for s in args.scenarios]
    print(f"MNIST, {args.epochs} rounds, seeds {args.seeds}: mean test accuracy % ± stderr over seeds "
          "[clusters per seed]; thesis figure beside (Tables 3.3-3.6).\n")
    head = "| algorithm | " + " | ".join(f"{s} ours | {s} thesis" for s in scen) + " |"
    for rows in by.values():
        for r in rows:
            r["accuracy_weighted"] = weighted_accuracy(r, args.root)
    key = "accuracy_weighted" if args.weighted else "accuracy_mean"
    print(f"Cells: {'test accuracy over all test samples (the authors code)' if args.weighted else 'mean device test accuracy'}.\n")
    print(head)
    print("|---" * (1 + 2 * len(scen)) + "|")
    for a in args.algorithms:
        cells = []
        for s in scen:
            got = by.get((a, s))
            cells.append(_cell(sorted(got, key=lambda r: r["seed"]), key) if got else "not run")
            th = THESIS.get(s, {}).get(a)
            cells.append(f"{th[0]:.2f} [{th[1]}]" if th else "—")
        print(f"| {LABEL.get(a, a)} | " + " | ".join(cells) + " |")

    print("\nAdjusted Rand index vs ground-truth groups (mean over seeds) and wall time per run (mean s; a resumed "
          "run's wall time counts only the rounds after its snapshot):\n")
    print("| algorithm | " + " | ".join(f"{s} ARI | {s} wall s" for s in scen) + " |")
    print("|---" * (1 + 2 * len(scen)) + "|")
    for a in args.algorithms:
        cells = []
        for s in scen:
            got = by.get((a, s))
            if got:
                cells.append(f"{np.mean([r['ari'] for r in got]):.3f}")
                resumed = any(r.get("resumed_from_round") is not None for r in got)
                cells.append(f"{np.mean([r['wall_s'] for r in got]):.0f}" + (" (part: resumed)" if resumed else ""))
            else:
                cells += ["—", "—"]
        print(f"| {LABEL.get(a, a)} | " + " | ".join(cells) + " |")

    print("\nPer group (S2/A1/A2: group 1 = the shifted / noisy / scarce devices; S1: group 0 = labels 0-4), "
          "mean device test accuracy % over seeds; FAACL's support edges (final / most in one round, one-way):\n")
    print("| scenario | algorithm | group 0 | group 1 | clusters | final edges (one-way) | max one-way in a round |")
    print("|---|---|---|---|---|---|---|")
    for sc in scen:
        for a in args.algorithms:
            got = by.get((a, sc))
            if not got or "accuracy_group" not in got[0]:
                continue
            g = [np.mean([100 * (weighted_accuracy(r, args.root, np.asarray(r["groups"]) == int(k)) if args.weighted
                                 else r["accuracy_group"][k]) for r in got]) for k in ("0", "1")]
            k = "/".join(str(_clusters(r)) for r in got)
            edges = "/".join(f"{r['support_edges']} ({r['one_way_edges']})" for r in got)
            most = "/".join(str(max(r["history_one_way_edges"], default=0)) for r in got)
            print(f"| {sc} | {LABEL.get(a, a)} | {g[0]:.2f} | {g[1]:.2f} | {k} | {edges} | {most} |")

    if args.support_png:
        write_support_graphs(by, Path(args.support_png), scen, args.algorithms)

    missing = [
        f"{s}/{a}/seed {sd}"
        for s in scen
        for a in args.algorithms
        for sd in args.seeds
        if not any(r["seed"] == sd for r in by.get((a, s), []))
    ]
    print(f"\nruns present: {sum(len(v) for v in by.values())}; missing: {len(missing)}")
    if missing:
        print("missing runs: " + ", ".join(missing))


def write_support_graphs(by: dict, folder: Path, scenarios: list[str], algorithms: list[str]) -> None:
    """``<scenario>_<algorithm>.png`` in ``folder``: the final support graph of each seed
    (the evaluate stage's picture), for runs with supporters or shared devices."""
    from clusterfed.algorithms import helping_memberships
    from clusterfed.evaluation.plots import plot_support_graph

    def shares(r: dict) -> bool:
        return bool(max(r.get("history_support_edges") or [0]) or max(r.get("history_helping_memberships") or [0])
                    or helping_memberships([c["devices"] for c in r["clusters"]], r["model_of_device"]))

    folder.mkdir(parents=True, exist_ok=True)
    for sc in scenarios:
        for a in algorithms:
            got = sorted(by.get((a, sc), []), key=lambda r: r["seed"])
            if not any(shares(r) for r in got):
                continue
            panels = {f"seed {r['seed']}": {
                "clusters": [{"id": c["id"], "model_index": i, "devices": c["devices"], "supportive_clusters": c["sup"]}
                             for i, c in enumerate(r["clusters"])],
                "model_of_device": r["model_of_device"], "ground_truth_groups": r["groups"]} for r in got}
            path = folder / f"{sc}_{a}.png"
            plot_support_graph(panels, path, title=f"{LABEL.get(a, a)}: final support graph, MNIST {sc} "
                               f"({got[0]['construction']} construction, {got[0]['epochs']} rounds)")
            print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=["S0", *SCENARIOS])
    ap.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=coldstart_methods(),
                    help="registered cold-start methods (default: the grid's five; the baselines: "
                         + " ".join(BASELINES) + ")")
    ap.add_argument("--seeds", nargs="+", type=int, default=[10, 55, 2077])
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--group-sizes", nargs="+", type=int, default=[10, 10])
    ap.add_argument("--construction", choices=["thesis", "authors"], default="thesis")
    ap.add_argument("--users", type=int, default=None, help="authors' construction: FedProx users (1000)")
    ap.add_argument("--first-devices", type=int, default=None,
                    help="authors' construction: only the first N devices (their FAACL --samplesize; thesis "
                    "Table 3.7: 20); rows are not keyed by it, use another --out")
    ap.add_argument("--data-seed", type=int, default=DATA_SEED,
                    help="authors' construction: seed of the FedProx draw and splits (theirs: 0); a row "
                    "per data seed, --summarize reads one")
    ap.add_argument("--local-epochs", type=int, default=1, help="local epochs per round (the authors: 10)")
    ap.add_argument("--lr", type=float, default=0.01,
                    help="local SGD learning rate (thesis Table B.4 and the authors' TrainConfig on MNIST: 0.01); "
                         "rows record it; rows without one ran at 0.01")
    ap.add_argument("--init-epochs", type=int, default=5, help="FAACL's Alg. 1 epochs (the authors: 500)")
    ap.add_argument("--variant", choices=["flat", "hierarchical"], default="flat")
    ap.add_argument("--supporter-weight", type=float, default=1.0,
                    help="FAACL: scale of supporters' |Z^train| in Alg. 4 (1: the box); use its own --out")
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sparse-inputs", action="store_true",
                    help="Engine(sparse_inputs=True): the MLP's sparse-input kernel (same steps up to float rounding; "
                         "rows are keyed without it)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--out", default="benchmarks/out/thesis_mnist.jsonl")
    ap.add_argument("--progress", action="store_true", help="progress lines on stderr (long schedules)")
    ap.add_argument("--checkpoint-every", type=int, default=25,
                    help="rounds between snapshots in <out>.checkpoints/: an interrupted run resumes from the "
                         "last one when the command is rerun")
    ap.add_argument("--summarize", action="store_true", help="print the comparison table and exit")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="hyperparameters of every --algorithms method (use another --out: rows are not keyed by them)")
    ap.add_argument("--support-png", default=None, metavar="DIR",
                    help="with --summarize: write each run's final support graph (seeds side by side) to DIR")
    ap.add_argument("--cluster-served", action="store_true",
                    help="summarize FedSoft's rows by their largest-u cluster models (recorded beside serve=local)")
    ap.add_argument("--weighted", action="store_true",
                    help="summarize accuracy over all test samples (device accuracies weighted by test size)")
    args = ap.parse_args()
    if args.construction != "authors" and args.first_devices is not None:
        ap.error("--first-devices is read only by --construction authors (the thesis reading: --group-sizes)")
    if args.construction != "authors" and args.data_seed != DATA_SEED:
        ap.error("--data-seed is read only by --construction authors (the thesis reading's data follow --seeds)")
    if args.summarize:
        summarize(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
