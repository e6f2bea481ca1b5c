"""FedCRef on MNIST standing in for EMNIST-Digits (fedcref Tables 1–4, 7–8; RESULTS.md "FedCRef").

Only MNIST is on this machine; it has EMNIST-Digits' ten digit classes in the same
28×28 format, so it stands in for it (train + test pooled: ~7000 images a digit).
Each run builds the paper's default system (N = 25 clients, K_i ∈ [2, 5], S = 500
samples per category, overlap 0), runs one method and appends one line to
``benchmarks/out/fedcref/runs.jsonl`` (config, per-iteration rows, summary, wall and
CPU seconds, load average, commit). Runs already in the file are skipped, so an
interrupted sweep resumes. ``--summary`` prints the mean ± 95% CI table of every
finished configuration with ``--samples`` S (default 500: §6.3's rows), the scaling rows of
Tables 7–8 (dirtiness 0.3, N = 20–50, perfect associations beside) next to the paper's
figures, and Global DEC.

Modes: ``fedcref`` (dirty-uniform init), ``perfect`` (association graph from the
true categories, Table 4's upper bound), ``local`` (no federation), ``dec_init``
(local DEC as the initial clustering, Table 1), ``global_dec`` (pooled DEC with K by
silhouette, Table 2).

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedcref_mnist.py \
        --mode fedcref --dirtiness 0.3 --runs 0 1 2 3 4
    .venv/bin/python benchmarks/fedcref_mnist.py --summary
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from clusterfed.algorithms.fedcref import FedCRefParams, fedcref, no_association, reconstruction_association
from clusterfed.algorithms.fedcref.baselines import perfect_association
from clusterfed.algorithms.fedcref.dec import DEC_SHAPES
from clusterfed.algorithms.fedcref.steps import NORMALIZE, association_statistics
from clusterfed.data import load_dataset
from clusterfed.evaluation.clustering_accuracy import clustering_accuracy
from clusterfed.evaluation.fedcref_scores import mean_ci95, score_history, summarize_run
from clusterfed.scenarios.unsupervised import make_clients

OUT = Path(__file__).parent / "out" / "fedcref"
# what makes two runs the same run
KEY = ("mode", "dirtiness", "n_clients", "samples", "overlap", "local_epochs", "fl_rounds", "fl_epochs", "normalize",
       "stable_after", "retrain_on_leave", "tau", "theta", "dec", "dec_pretrain_epochs", "run")
# the value of a key that records older than it lack
OLDER = {"normalize": "pair", "stable_after": 1, "retrain_on_leave": False, "tau": FedCRefParams.τ,
         "theta": FedCRefParams.θ, "dec": "small", "dec_pretrain_epochs": 20, "fl_epochs": 1}
MODES = ("fedcref", "perfect", "local", "dec_init", "global_dec")


def mnist_pool(root: str) -> tuple[np.ndarray, np.ndarray]:
    ds = load_dataset("mnist", root)
    x = np.concatenate([ds.x_train, ds.x_test]).reshape(-1, 28 * 28)
    return x, np.concatenate([ds.y_train, ds.y_test])


def run_one(mode: str, dirtiness: float, n_clients: int, run: int, args, pool) -> dict:
    x, y = pool
    clients, truth = make_clients(
        x, y, n_clients=n_clients, samples_per_category=args.samples, overlap=args.overlap,
        dirtiness=dirtiness, seed=run,
    )
    params = FedCRefParams(local_epochs=args.local_epochs, fl_rounds=args.fl_rounds, fl_epochs=args.fl_epochs,
                           normalize=args.normalize, stable_after=args.stable_after, τ=args.tau, θ=args.theta,
                           retrain_on_leave=args.retrain_on_leave)
    started, cpu = time.time(), time.process_time()
    if mode == "global_dec":
        from clusterfed.algorithms.fedcref.dec import global_dec

        out = global_dec(clients, truth, seed=run, shape=args.dec, pretrain_epochs=args.dec_pretrain_epochs)
        return {"summary": out, "wall_s": time.time() - started, "cpu_s": time.process_time() - cpu}
    if mode == "dec_init":
        clients = clients.with_initial(cached_local_dec(clients, n_clients, run, args))
    readings: list[dict] = []  # one per association, i.e. per iteration (the paper's rule only)
    associate = {"perfect": perfect_association(truth), "local": no_association}.get(mode) or recording_association(
        params, np.concatenate(truth.y), readings)
    result = fedcref(clients, params, seed=run, associate=associate)
    rows = score_history(result.history, list(clients.initial), truth)
    return {
        "rows": rows,
        "graph": [{**graph_reading(h, truth), **(readings[t] if readings else {})} for t, h in enumerate(result.history)],
        "summary": summarize_run(rows, truth),
        # per client, samples of its category c (columns, in truth.categories order) in cluster q (rows)
        "contingency": {"init": contingency(clients.initial, truth), "end": contingency(result.assignment, truth)},
        "pool_reshuffles": truth.pool_reshuffles,
        "wall_s": time.time() - started,
        "cpu_s": time.process_time() - cpu,
    }


def cached_local_dec(clients, n_clients: int, run: int, args) -> list[np.ndarray]:
    """Table 1's local DEC labels, computed once per system and DEC setting and kept in
    ``<out>/dec_labels/`` (the paper's DEC takes ~1700 CPU s a system; FedCRef's own
    parameters, e.g. τ, can then be swept on the same initial clustering). The cache
    holds the clients' sample counts and is refused if they differ."""
    from clusterfed.algorithms.fedcref.dec import local_dec

    path = args.out / "dec_labels" / (f"{args.dec}_e{args.dec_pretrain_epochs}_n{n_clients}_s{args.samples}"
                                      f"_o{args.overlap}_run{run}.npz")
    sizes = np.array([len(x) for x in clients.x])
    if path.exists():
        z = np.load(path)
        if not np.array_equal(z["sizes"], sizes):
            raise SystemExit(f"{path}: cached DEC labels are for other client sizes; delete the file to recompute")
        return [z[f"client{i}"] for i in range(len(sizes))]
    labels = local_dec(clients, seed=run, shape=args.dec, pretrain_epochs=args.dec_pretrain_epochs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, sizes=sizes, **{f"client{i}": q for i, q in enumerate(labels)})
    tmp.replace(path)  # never a half-written cache
    return labels


def contingency(assignment: list[np.ndarray], truth) -> list[list[list[int]]]:
    return [[[int(((a == q) & (y == c)).sum()) for c in cats] for q in range(len(cats))]
            for a, y, cats in zip(assignment, truth.y, truth.categories)]


def graph_reading(h: dict, truth) -> dict:
    """How one iteration's association graph sits on the true categories: links between
    clusters of the same / different majority category, and per category the number
    of communities it leads and of its clusters left isolated (why |G| ≠ |U|)."""
    from clusterfed.evaluation.fedcref_scores import cluster_category

    def cat(i: int, q: int) -> int | None:
        return cluster_category(h["assignment_at_association"][i], truth.y[i], q)

    same = sum(cat(*a) == cat(*b) for a, b in h["links"])
    led = [int(np.bincount([cat(i, q) for i, q in g]).argmax()) for g in h["groups"]]
    isolated = [cat(i, q) for i, q in h["isolated_clusters"]]
    before, after = h["assignment_at_association"], h["assignment"]
    return {
        "links_same_category": int(same), "links_other_category": int(len(h["links"]) - same),
        "communities_per_category": [led.count(c) for c in range(truth.n_categories)],
        "isolated_per_category": [isolated.count(c) for c in range(truth.n_categories)],
        # per client: ACC between its clusterings before and after this refinement (the
        # stability test against τ; 1 for a client no longer in A) and ACC against the truth
        "client_stability": [round(clustering_accuracy(a, b), 4) for a, b in zip(after, before)],
        "client_acc": [round(clustering_accuracy(a, y), 4) for a, y in zip(after, truth.y)],
        # per client: [clusters, samples] of this refinement formed by a community model (Alg. 2)
        "from_community": h["from_community"],
    }


def recording_association(params: FedCRefParams, y_all: np.ndarray, readings: list[dict]):
    """The paper's rule, unchanged, that also records how eq. (2)'s statistic sits on
    the true categories (the clusters' majority digits) at each association."""
    rule = reconstruction_association(params)

    def associate(errors: np.ndarray, layout) -> np.ndarray:
        adjacency = rule(errors, layout)
        stat = association_statistics(errors, layout.members, layout.client_of, α=params.α,
                                      normalize=params.normalize)
        readings.append(statistic_reading(stat, adjacency, layout.members, layout.client_of, y_all, params.θ))
        return adjacency

    return associate


def statistic_reading(stat: np.ndarray, adjacency: np.ndarray, members: list[np.ndarray], client_of: np.ndarray,
                      y_all: np.ndarray, θ: float) -> dict:
    """Quantiles (min, 25%, median, 75%, max) of the two-way statistic max(stat[b, a],
    stat[a, b]) over tested pairs of the same / different majority digit, ordered pairs
    of different digits passing one way, and every link between different digits as
    [digit a, digit b, stat on a, stat on b, purity a, purity b, size a, size b, client a, client b]."""
    counts = [np.bincount(y_all[m]) if len(m) else np.zeros(1, dtype=np.int64) for m in members]
    cat = np.array([int(c.argmax()) if c.sum() else -1 for c in counts])
    purity = [float(c.max() / c.sum()) if c.sum() else 0.0 for c in counts]
    two_way = np.maximum(stat, stat.T)
    a, b = np.triu_indices(len(members), 1)
    tested = np.isfinite(two_way[a, b])
    same = cat[a] == cat[b]

    def quantiles(v: np.ndarray) -> list[float]:
        return [round(float(x), 4) for x in np.percentile(v, [0, 25, 50, 75, 100])] if len(v) else []

    other = cat[:, None] != cat[None, :]
    links = [(i, j) for i, j in zip(a, b) if adjacency[i, j] and cat[i] != cat[j]]
    return {
        "stat_same_category": quantiles(two_way[a, b][tested & same]),
        "stat_other_category": quantiles(two_way[a, b][tested & ~same]),
        "pairs_same_category": int((tested & same).sum()), "pairs_other_category": int((tested & ~same).sum()),
        "other_category_one_way": int(((stat <= θ) & other).sum()),
        "other_category_links": [[int(cat[i]), int(cat[j]), round(float(stat[j, i]), 4), round(float(stat[i, j]), 4),
                                  round(purity[i], 3), round(purity[j], 3), len(members[i]), len(members[j]),
                                  int(client_of[i]), int(client_of[j])]
                                 for i, j in links],
    }


def finished(out: Path) -> list[dict]:
    runs = out / "runs.jsonl"
    return [json.loads(line) for line in runs.read_text().splitlines() if line.strip()] if runs.exists() else []


# fedcref Tables 3–4 (N = 25) and 7–8 (EMNIST-Digits, dirtiness 0.3, 5 runs): communities,
# |W|, isolated start, isolated end, ACC end, ACC end with perfect associations
PAPER_SCALING = {20: (10.2, 0.22, 70.9, 21.4, 0.869, 0.921), 25: (9.8, 5.1, 87.6, 16.1, 0.879, 0.949),
                 30: (10.4, 1.43, 106.4, 20.3, 0.905, 0.937), 40: (11.5, 3.38, 141.4, 30.9, 0.86, 0.953),
                 50: (14.4, 8.71, 177.7, 65.1, 0.801, 0.955)}


def summary(out: Path, samples: int) -> None:
    """Print RESULTS.md §6.3's generated tables: every configuration with S = ``samples``,
    the scaling rows of Tables 7–8 beside the paper's, and Global DEC."""
    groups: dict[tuple, list[dict]] = {}
    for rec in finished(out):
        if rec.get("samples", 500) != samples:
            continue
        key = (rec["mode"] + ("" if rec.get("normalize", "pair") == "pair" else f" ({rec['normalize']})")
               + ("" if rec.get("stable_after", 1) == 1 else f" (stable_after {rec['stable_after']})")
               + (" (retrain on leave)" if rec.get("retrain_on_leave", False) else "")
               + ("" if rec.get("tau", OLDER["tau"]) == OLDER["tau"] else f" (τ {rec['tau']})")
               + ("" if rec.get("theta", OLDER["theta"]) == OLDER["theta"] else f" (θ {rec['theta']})")
               + ("" if rec.get("fl_epochs", OLDER["fl_epochs"]) == FedCRefParams.fl_epochs
                  else f" (FedAvg {rec.get('fl_epochs', OLDER['fl_epochs'])} epochs a round)")
               + ("" if rec.get("dec", "small") == "small" or not rec["mode"].endswith("dec") and rec["mode"] != "dec_init"
                  else f" (DEC {rec['dec']}, {rec['dec_pretrain_epochs']} pretraining epochs)"),
               rec["dirtiness"], rec["n_clients"], rec.get("samples", 500))
        groups.setdefault(key, []).append(rec)

    def cell(recs: list[dict], key: str, fmt: str = "{:.3f}") -> str:
        """Mean (± 95% CI half-width from 2 runs on) of a summary figure over runs."""
        sums = [r["summary"] for r in recs]
        if not sums or key not in sums[0]:
            return "–"
        m, h = mean_ci95([x[key] for x in sums])
        return (fmt + " (±" + fmt + ")").format(m, h) if len(sums) > 1 else fmt.format(m)

    def cost(recs: list[dict]) -> str:
        cpu = f"{np.mean([r['cpu_s'] for r in recs]):.0f}" if all("cpu_s" in r for r in recs) else "–"
        return f"{np.mean([r['wall_s'] for r in recs]):.0f} | {cpu}"

    print("| mode | dirtiness | N | S | runs | communities / 10 | wrong ass. \\|W\\| | isolated start → end "
          "| ACC init | ACC end | iterations | MB exchanged | wall s / run | CPU s / run | digits without / split |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mode, dirt, n, s), recs in sorted(groups.items()):
        if mode.startswith("global_dec"):
            continue
        sums = [r["summary"] for r in recs]
        # at the end: categories leading no community / more than one (|G| = |U| only when both are 0)
        ends = [r["graph"][-1]["communities_per_category"] for r in recs if r.get("graph")]
        per_cat = (f"{np.mean([sum(c == 0 for c in e) for e in ends]):.1f} / "
                   f"{np.mean([sum(c > 1 for c in e) for e in ends]):.1f}") if len(ends) == len(recs) else "–"
        mb = f"{np.mean([x['bytes'] for x in sums]) / 1e6:.0f}" if "bytes" in sums[0] else "–"
        print(f"| {mode} | {dirt} | {n} | {s} | {len(recs)} | {cell(recs, 'communities', '{:.1f}')} | "
              f"{cell(recs, 'wrong_associations', '{:.1f}')} | {cell(recs, 'isolated_start', '{:.1f}')} → "
              f"{cell(recs, 'isolated_end', '{:.1f}')} | {cell(recs, 'acc_init')} | {cell(recs, 'acc_end')} | "
              f"{cell(recs, 'iterations', '{:.1f}')} | {mb} | {cost(recs)} | {per_cat} |")

    scaling = [n for n in sorted(PAPER_SCALING) if ("fedcref", 0.3, n, samples) in groups]
    if scaling:
        print("\nTables 7–8 (3–4 at N = 25), dirtiness 0.3: FedCRef mean (± 95% CI) over its runs [paper: EMNIST-Digits, 5 runs]")
        print("\n| N | runs FedCRef / perfect | communities [paper] | \\|W\\| [paper] | isolated start → end [paper] "
              "| ACC end [paper] | perfect associations ACC end [paper] | wall / CPU s per FedCRef run |")
        print("|---|---|---|---|---|---|---|---|")
    for n in scaling:
        recs, perfect = groups[("fedcref", 0.3, n, samples)], groups.get(("perfect", 0.3, n, samples), [])
        g, w, i0, i1, acc, acc_perfect = PAPER_SCALING[n]
        print(f"| {n} | {len(recs)} / {len(perfect)} | {cell(recs, 'communities', '{:.1f}')} [{g}] | "
              f"{cell(recs, 'wrong_associations', '{:.1f}')} [{w}] | {cell(recs, 'isolated_start', '{:.1f}')} → "
              f"{cell(recs, 'isolated_end', '{:.1f}')} [{i0} → {i1}] | {cell(recs, 'acc_end')} [{acc}] | "
              f"{cell(perfect, 'acc_end') if perfect else 'not run'} [{acc_perfect}] | {cost(recs).replace(' | ', ' / ')} |")

    dec_rows = {key: recs for key, recs in sorted(groups.items()) if key[0].startswith("global_dec")}
    if dec_rows:
        print("\n| Global DEC: mode | N | S | runs | K found (t-SNE silhouette) | ACC pooled | ACC pooled at the K of the highest ACC (oracle) "
              "| ACC per client | wall s / run | CPU s / run |")
        print("|---|---|---|---|---|---|---|---|---|---|")
    for (mode, _, n, s), recs in dec_rows.items():
        best = [max(r["summary"]["acc_pooled_by_k"].values()) for r in recs]
        print(f"| {mode} | {n} | {s} | {len(recs)} | {cell(recs, 'k_found', '{:.1f}')} | {cell(recs, 'acc_pooled')} | "
              f"{np.mean(best):.3f} | {cell(recs, 'acc_end')} | {cost(recs)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="fedcref")
    p.add_argument("--dirtiness", type=float, nargs="+", default=[0.0, 0.3, 0.5])
    p.add_argument("--n-clients", type=int, nargs="+", default=[25])
    p.add_argument("--runs", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--samples", type=int, default=500, help="S, samples per category")
    p.add_argument("--overlap", type=float, default=0.0)
    p.add_argument("--local-epochs", type=int, default=FedCRefParams.local_epochs)
    p.add_argument("--fl-rounds", type=int, default=FedCRefParams.fl_rounds)
    p.add_argument("--fl-epochs", type=int, default=FedCRefParams.fl_epochs,
                   help="local epochs per community FedAvg round (the authors' code: 2 in round 1, then 7)")
    p.add_argument("--normalize", choices=NORMALIZE, default=FedCRefParams.normalize, help="reading of eq. (2)'s Normalize")
    p.add_argument("--stable-after", type=int, default=FedCRefParams.stable_after,
                   help="refinement from which the stability test can end a client's activity (FedCRefParams)")
    p.add_argument("--retrain-on-leave", action="store_true",
                   help="a client leaving A retrains its models on its final clusters (the authors' code order)")
    p.add_argument("--tau", type=float, default=FedCRefParams.τ,
                   help="τ, the stability threshold of §4.5 (the paper: 'within [0.8, 1]')")
    p.add_argument("--theta", type=float, default=FedCRefParams.θ,
                   help="eq. (2)'s θ (the paper: 0.2; the authors' code, my_config: 0.25)")
    p.add_argument("--dec", choices=sorted(DEC_SHAPES), default="small",
                   help="DEC autoencoder of dec_init / global_dec (paper: d-500-500-2000-10)")
    p.add_argument("--dec-pretrain-epochs", type=int, default=20, help="DEC's autoencoder pretraining epochs")
    p.add_argument("--root", default="../shared/datasets")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--summary", action="store_true")
    p.add_argument("--out", type=Path, default=OUT, help="folder of runs.jsonl")
    p.add_argument("--commit", help="commit of the code under test (default: this checkout's HEAD)")
    args = p.parse_args()
    if args.summary:
        summary(args.out, args.samples)
        return
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    pool = mnist_pool(args.root)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent).stdout.strip()
    for run in args.runs:
        for n in args.n_clients:
            for dirt in args.dirtiness:
                config = dict(mode=args.mode, dirtiness=dirt, n_clients=n, samples=args.samples, overlap=args.overlap,
                              local_epochs=args.local_epochs, fl_rounds=args.fl_rounds, fl_epochs=args.fl_epochs,
                              normalize=args.normalize,
                              stable_after=args.stable_after, retrain_on_leave=args.retrain_on_leave,
                              tau=args.tau, theta=args.theta, dec=args.dec,
                              dec_pretrain_epochs=args.dec_pretrain_epochs, run=run)
                if any(all(r.get(k, OLDER.get(k)) == config[k] for k in KEY)
                       for r in finished(args.out)):
                    continue
                load_before = os.getloadavg()[0]
                rec = run_one(args.mode, dirt, n, run, args, pool)
                rec = {**config, **rec, "load_avg_1min": [load_before, os.getloadavg()[0]], "commit": commit,
                       "torch_threads": torch.get_num_threads()}
                with (args.out / "runs.jsonl").open("a") as f:  # one line per finished run: a crash loses at most the run under way
                    f.write(json.dumps(rec) + "\n")
                print(f"{config}: {rec['summary']} ({rec['wall_s']:.0f} s wall, {rec['cpu_s']:.0f} s CPU)", flush=True)


if __name__ == "__main__":
    main()
