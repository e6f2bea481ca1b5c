"""Flat vs hierarchical FAACL as the federation grows (issue 17, items 2-3).

MNIST S2 (two label-shift groups of n/2 devices), as many samples per device as the
60k train pool allows (60000 // n, 25% of them Z^val; test 10000 // n), the thesis'
MLP 784-128-10 and SGD (lr 0.01, L2 0.001, batch 10), 5 initial local epochs, α 0.1,
ε 0.7 (``--epsilon`` and ``--lr`` change the last two: a sensitivity check, not the
thesis' setting), cold start until the clustering is stable (flat: a round without merge, at most
``--max-rounds``; hierarchical: ``--rounds-per-level`` rounds per level, the last
level until a round merges nothing) and one training round. Each run is its own
subprocess (so its peak RSS is its own), every n of the first variant, then the
second's (``--flat-max``: the largest n run flat); one JSON line per run is appended to
``--out`` as soon as it ends: re-running the same command skips the runs already there
(resumable). The load average is recorded before and after each run: on a shared
machine timings are upper bounds.

    OMP_NUM_THREADS=2 nice -n 10 .venv/bin/python benchmarks/faacl_scale.py \\
        --n 80 160 320 640 1000 --variants hierarchical flat --flat-max 320 \\
        --out benchmarks/out/faacl_scale.jsonl
    .venv/bin/python benchmarks/faacl_scale.py --summarize --out benchmarks/out/faacl_scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = "../shared/datasets"


def run_one(args) -> dict:
    import resource

    import numpy as np
    import torch
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.algorithms import FAACL
    from clusterfed.data import load_dataset
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios import build_scenario

    torch.set_num_threads(args.threads)
    n = args.one_n
    t0 = time.perf_counter()
    ds = load_dataset("mnist", args.root)
    fed = build_scenario(ds, args.scenario, group_sizes=[n // 2, n - n // 2], seed=args.seed)
    engine = Engine(fed, model="mlp", hidden=128, training=TrainingConfig(lr=args.lr, l2=0.001, batch_size=10),
                    device="cpu")
    setup = time.perf_counter() - t0
    work = count_work(engine)
    trace: list[dict] = []
    method = FAACL(alpha=0.1, epsilon=args.epsilon, init_epochs=args.init_epochs, rounds=1, variant=args.one_variant,
                   max_rounds=args.max_rounds, partition_order=args.partition_order,
                   rounds_per_level=args.rounds_per_level, stable=args.stable)
    trace_rounds(method, fed.groups, trace)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = method.fit(engine, seed=args.seed, ground_truth=fed.groups)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    clustering_rounds = sum(h["phase"] == "clustering" for h in result.history)
    return {
        "n": n,
        "variant": args.one_variant,
        "partition_order": args.partition_order if args.one_variant == "hierarchical" else None,
        "rounds_per_level": args.rounds_per_level if args.one_variant == "hierarchical" else None,
        "scenario": args.scenario,
        "stable": args.stable,
        "seed": args.seed,
        "init_epochs": args.init_epochs,
        "epsilon": args.epsilon,
        "lr": args.lr,
        "samples_per_device": int(fed.devices[0].n_train + len(fed.devices[0].y_val)),
        "threads": args.threads,
        "setup_s": round(setup, 2),
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),  # user + system CPU of the fit: less sensitive to the machine's load
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "clustering_rounds": clustering_rounds,
        "clusters": int(result.n_clusters),
        "ari": float(adjusted_rand_score(fed.groups, result.model_of_device)),
        "accuracy": float(np.mean(result.device_accuracy)),
        "clusters_per_round": [h["n_clusters"] for h in result.history],
        # final clusters as [devices of group 0, devices of group 1, ...], largest first
        "composition": composition(result.clusters, fed.groups),
        "trace": trace,
        "final_tests": final_tests(engine, result, args) if result.n_clusters <= 6 else None,
        **work,  # load-independent cost: samples trained on (× epochs) and (model, sample) losses evaluated
    }


def final_tests(engine, result, args) -> list[dict]:
    """Alg. 2 between every two final clusters C1, C2 (C2 ∈ C1.sup iff every device of
    C1 has p ≤ α): how many of C1's devices refuse C2 (p > α), the largest p, and C1's
    devices' mean validation loss under their own model and under C2's."""
    import numpy as np

    from clusterfed.stats import significant, support_pvalues

    losses = engine.losses(result.params, "val").cpu().numpy()  # [models, devices, samples]
    counts = engine.counts("val")
    out = []
    for i, c1 in enumerate(result.clusters):
        devices = np.array(sorted(c1.devices))
        for j, c2 in enumerate(result.clusters):
            if i == j:
                continue
            p = support_pvalues(losses[i, devices], losses[j, devices], args.epsilon, counts=counts[devices])
            refuse = ~significant(p, 0.1)
            mean = [float(np.mean([losses[k, d, :counts[d]].mean() for d in devices])) for k in (i, j)]
            out.append({"c1": len(c1.devices), "c2": len(c2.devices), "refusing_devices": int(refuse.sum()),
                        "max_p": float(p.max()), "own_loss": round(mean[0], 4), "other_loss": round(mean[1], 4),
                        "refusers_loss_gap": [round(float(losses[j, d, :counts[d]].mean() - losses[i, d, :counts[d]].mean()), 3)
                                              for d in devices[refuse][:10]]})
    return out


def composition(clusters, groups) -> list[list[int]]:
    import numpy as np

    k = int(groups.max()) + 1
    rows = [np.bincount(groups[sorted(c.devices)], minlength=k).tolist() for c in clusters]
    return sorted(rows, key=lambda r: -sum(r))


def trace_rounds(method, groups, trace: list) -> None:
    """After each clustering round's support test and merge (``recluster``), record the
    partitions compared, the clusters, the mixed ones (devices of more than one group)
    and the devices outside their cluster's majority group."""
    import numpy as np

    recluster = method.recluster

    def traced(engine, state, ctx):
        phase, partition = state.phase, state.partition_of_device
        new = recluster(engine, state, ctx)
        if phase == "clustering":
            clusters = new.clustering.clusters
            rows = np.array(composition(clusters, groups))
            ids = {c.id for c in clusters}
            edges = {(c.id, s) for c in clusters for s in c.sup if s in ids}
            size = {c.id: len(c.devices) for c in clusters}
            trace.append({"support_edges": len(edges), "one_way": sum((b, a) not in edges for a, b in edges),
                          # with at most 6 clusters left: (cluster size, sizes of its supporters)
                          "sup": [[size[c.id], sorted(size[s] for s in c.sup if s in ids)] for c in clusters]
                          if len(clusters) <= 6 else None,
                          "partitions": 1 if partition is None else int(len(np.unique(partition))),
                          "clusters": len(rows), "mixed": int((np.count_nonzero(rows, axis=1) > 1).sum()),
                          "minority_devices": int((rows.sum(1) - rows.max(1)).sum()),
                          "largest": rows[:4].tolist()})
        return new

    method.recluster = traced


def count_work(engine) -> dict:
    """Wrap the engine's calls to count the work they are given (filled in place)."""
    import numpy as np

    work = {"train_sample_epochs": 0, "eval_model_samples": 0}
    counts = {s: engine.counts(s) for s in ("train", "val", "test")} if hasattr(engine, "counts") else {
        s: engine.data.split(s).counts.cpu().numpy() for s in ("train", "val", "test")}  # before the protocol
    losses = engine.losses

    def counted(train):  # Engine.train and Engine.local_models (neither calls the other)
        def call(params, model_of_pair, device_of_pair, generator, *, local_epochs=None, **kw):
            e = engine.training.local_epochs if local_epochs is None else local_epochs
            work["train_sample_epochs"] += int(counts["train"][np.asarray(device_of_pair)].sum()) * e
            return train(params, model_of_pair, device_of_pair, generator, local_epochs=local_epochs, **kw)
        return call

    def count_losses(params, split="val", *, devices=None):
        d = slice(None) if devices is None else np.asarray(devices)
        work["eval_model_samples"] += next(iter(params.values())).shape[0] * int(counts[split][d].sum())
        return losses(params, split, devices=devices)

    engine.train, engine.local_models = counted(engine.train), counted(engine.local_models)
    engine.losses = count_losses
    return work


def load() -> tuple[float, float, float]:
    return os.getloadavg()


def read(out: Path) -> list[dict]:
    if not out.exists():
        return []
    rows = []
    for line in out.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


def key(row: dict) -> tuple:
    hier = row["variant"] == "hierarchical"
    return (row["n"], row["variant"], row["seed"], row["init_epochs"], row.get("partition_order"),
            row.get("rounds_per_level", 3) if hier else None, row.get("stable", "partition"),
            row.get("epsilon", 0.7), row.get("lr", 0.01), row.get("scenario", "S2"))


def main(args) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:  # every n of one variant, then the next (--variants sets the order)
        for n in args.n:
            if variant == "flat" and n > args.flat_max:
                continue
            hier = variant == "hierarchical"
            k = (n, variant, args.seed, args.init_epochs, args.partition_order if hier else None,
                 args.rounds_per_level if hier else None, args.stable, args.epsilon, args.lr, args.scenario)
            if k in {key(r) for r in read(out)}:
                continue
            before = load()
            cmd = [sys.executable, __file__, "--one-n", str(n), "--one-variant", variant, "--root", args.root,
                   "--seed", str(args.seed), "--init-epochs", str(args.init_epochs), "--threads", str(args.threads),
                   "--max-rounds", str(args.max_rounds), "--partition-order", args.partition_order,
                   "--rounds-per-level", str(args.rounds_per_level), "--stable", args.stable,
                   "--scenario", args.scenario, "--epsilon", str(args.epsilon), "--lr", str(args.lr)]
            print(f"[{time.strftime('%H:%M:%S')}] n={n} {variant} load {before[0]:.2f} ...", flush=True)
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if res.returncode != 0:
                print(res.stderr[-3000:], flush=True)
                continue
            row = json.loads(res.stdout.strip().splitlines()[-1])
            row["load_before"] = [round(x, 2) for x in before]
            row["load_after"] = [round(x, 2) for x in load()]
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"  {row['wall_s']} s, {row['peak_rss_gb']} GB, {row['clustering_rounds']} rounds, "
                  f"{row['clusters']} clusters, ARI {row['ari']:.3f}", flush=True)


def summarize(args) -> None:
    rows = sorted(read(Path(args.out)), key=lambda r: (r.get("scenario", "S2"), r["n"], r["variant"], r["init_epochs"]))
    print("| n | samples/device | init epochs | variant | wall s | CPU s | peak RSS GB | clustering rounds | clusters | "
          "ARI | accuracy % | trained sample-epochs | evaluated (model, sample) | load before/after (1 min) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        order = f" ({r['partition_order']}, {r.get('rounds_per_level', 3)}/level)" if r.get("partition_order") else ""
        order += f", stable: {r['stable']}" if r.get("stable", "partition") != "partition" else ""
        order += f", ε {r['epsilon']}" if r.get("epsilon", 0.7) != 0.7 else ""
        order += f", lr {r['lr']}" if r.get("lr", 0.01) != 0.01 else ""
        order += f", {r['scenario']}" if r.get("scenario", "S2") != "S2" else ""
        cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else "—"
        work = [f"{r[k]:,}" if k in r else "—" for k in ("train_sample_epochs", "eval_model_samples")]
        print(f"| {r['n']} | {r['samples_per_device']} | {r['init_epochs']} | {r['variant']}{order} | {r['wall_s']:.1f} | "
              f"{cpu} | {r['peak_rss_gb']:.2f} | {r['clustering_rounds']} | {r['clusters']} | {r['ari']:.3f} | "
              f"{100 * r['accuracy']:.2f} | {work[0]} | {work[1]} | {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} |")
    for what in ("wall_s", "cpu_s"):
        hier = {r["n"]: r[what] for r in rows if r["variant"] == "hierarchical" and r["init_epochs"] == 5
                and r.get("rounds_per_level", 3) == 1 and r.get("stable", "partition") == "partition"
                and r.get("epsilon", 0.7) == 0.7 and r.get("lr", 0.01) == 0.01
                and r.get("scenario", "S2") == "S2" and what in r}
        ns = sorted(hier)
        steps = ", ".join(f"{a} -> {b}: x{hier[b] / hier[a]:.2f}" for a, b in zip(ns, ns[1:]))
        if steps:
            print(f"\nhierarchical {what} growth: {steps}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[80, 160, 320, 640, 1000])
    ap.add_argument("--variants", nargs="+", default=["hierarchical", "flat"], choices=["hierarchical", "flat"])
    ap.add_argument("--flat-max", type=int, default=320, help="largest n run flat")
    ap.add_argument("--partition-order", default="random", choices=["random", "authors"])
    ap.add_argument("--rounds-per-level", type=int, default=1)
    ap.add_argument("--stable", default="partition", choices=["partition", "support", "no_one_way"],
                    help="FAACL.stable: when the clustering loop stops")
    ap.add_argument("--scenario", default="S2", choices=["S1", "S2"])
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--init-epochs", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=0.7, help="FAACL's ε (Table B.1, MNIST S2: 0.7)")
    ap.add_argument("--lr", type=float, default=0.01, help="local SGD learning rate (thesis: 0.01)")
    ap.add_argument("--max-rounds", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--root", default=ROOT)
    ap.add_argument("--out", default="benchmarks/out/faacl_scale.jsonl")
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--one-n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one-variant", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one_n is not None:
        print(json.dumps(run_one(a)))
    elif a.summarize:
        summarize(a)
    else:
        main(a)
