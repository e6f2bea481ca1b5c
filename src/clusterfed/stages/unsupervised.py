"""Stage ``unsupervised``: FedCRef and its baselines (fedcref §5).

A different problem from the other stages: clients hold unlabelled samples of several
categories, so it builds its own clients (``scenarios.unsupervised``) rather than
reading the partitions. For every method and seed it writes (``UnsupervisedOutputs``
names the files)::

    <method>/seed_<s>/history.json        per-iteration scores (Fig. 4), iteration 0 = start
    <method>/seed_<s>/summary.json        Tables 1/3/4 line of the run; ``rejections``: the
                                          community FedAvg uploads screened and rejected per
                                          client (the schema of cold start's rejections.json)
    <method>/seed_<s>/communities.json    which community model serves each (client, q)
    <method>/seed_<s>/graph.json          final association graph and true categories
    <method>/seed_<s>/community_models.safetensors   AE_Gp stacked, row p = community p
    metrics.json                          mean ± 95% CI over seeds per method
    curves.json                           mean ± 95% CI per iteration per method

The outputs appear atomically (temporary sibling, renamed). The community FedAvg's
uploads are screened by params.yaml's rule (``training.outlier_factor``,
``clip_norm``), as every other method's; a run whose rejected share passes
``training.max_rejected_share`` raises ``TooManyRejected`` naming the clients, and the
stage writes nothing. The evaluate stage puts ``metrics.json`` into the pipeline's
metrics and draws :func:`plot_unsupervised`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from clusterfed.algorithms.fedcref import FedCRefParams, fedcref, no_association
from clusterfed.algorithms.fedcref.baselines import perfect_association
from clusterfed.algorithms.fedcref.dec import local_dec
from clusterfed.build import screening_rule
from clusterfed.config import Params
from clusterfed.data import load_dataset
from clusterfed.engine.robust import MAX_REJECTED_SHARE, RobustRule, check_rejections
from clusterfed.evaluation import rejection_totals
from clusterfed.evaluation.fedcref_plots import plot_association_graph, plot_iterations
from clusterfed.evaluation.fedcref_scores import cluster_category, mean_ci95, score_history, summarize_run
from clusterfed.layout import PlotFiles, RunLayout, UnsupervisedOutputs
from clusterfed.scenarios.unsupervised import CategoryTruth, UnlabelledClients, make_clients
from clusterfed.stages.files import atomic_dir
from clusterfed.tensorfile import save_tensors

METHODS = ("fedcref", "perfect", "local")
CURVE_KEYS = ("communities", "isolated", "wrong_associations", "accuracy", "active_clients")
# plots/unsupervised/iterations.csv: mean and 95% half-width per method and iteration
ITERATIONS_HEADER = ("algorithm", "iteration", *(f"{k}{s}" for k in CURVE_KEYS for s in ("", "_ci")))
SUMMARY_KEYS = ("communities", "wrong_associations", "isolated_start", "isolated_end", "acc_init", "acc_end",
                "iterations", "bytes")


def fedcref_params(section) -> FedCRefParams:
    """The paper's symbols from the params section's ASCII keys (alpha, theta, tau)."""
    return FedCRefParams.from_section(section.fedcref.model_dump())


def build_clients(section, root: str | None, seed: int) -> tuple[UnlabelledClients, CategoryTruth]:
    """The seed's clients (train and test images pooled, as unlabelled data) and
    their initial clustering: dirty uniform, or each client's own k-means on an
    autoencoder embedding / DEC."""
    ds = load_dataset(section.dataset, root, seed=seed)
    x = np.concatenate([ds.x_train, ds.x_test])
    x = x.reshape(len(x), -1)
    y = np.concatenate([ds.y_train, ds.y_test])
    clients, truth = make_clients(
        x, y, n_clients=section.n_clients, samples_per_category=section.samples_per_category,
        overlap=section.overlap, dirtiness=section.dirtiness, seed=seed,
    )
    if section.initial == "kmeans":
        clients = clients.with_initial(local_dec(clients, seed=seed, steps=0))
    elif section.initial in ("dec", "dec_paper"):
        shape = "paper" if section.initial == "dec_paper" else "small"
        clients = clients.with_initial(local_dec(clients, seed=seed, shape=shape))
    return clients, truth


def unsupervised(params: Params, layout: RunLayout, *, progress: bool = True) -> dict:
    """The stage: :func:`run_unsupervised` on ``params.unsupervised`` into the layout's
    folder, screening as params.yaml's ``training`` section says."""
    return run_unsupervised(
        params.unsupervised, params.seeds, params.data.root, layout.unsupervised,
        screening=screening_rule(params), max_rejected_share=params.training.max_rejected_share, progress=progress,
    )


def run_unsupervised(
    section, seeds: list[int], root: str | None, out_dir: Path, *,
    screening: RobustRule = RobustRule(), max_rejected_share: float = MAX_REJECTED_SHARE, progress: bool = False,
) -> dict:
    """Run every method of ``section.methods`` on every seed; write the results, the
    mean curves and the metrics under ``out_dir``; return the metrics. Raises
    ``TooManyRejected`` (writing nothing) when a run rejects more than
    ``max_rejected_share`` of its community FedAvg uploads."""
    params = fedcref_params(section)
    methods: dict[str, dict] = {}
    curves: dict[str, list[dict]] = {}
    with atomic_dir(Path(out_dir)) as tmp:
        out = UnsupervisedOutputs(tmp)
        for method in section.methods:
            summaries, histories = [], []
            for seed in seeds:
                clients, truth = build_clients(section, root, seed)
                associate = {"perfect": perfect_association(truth), "local": no_association}.get(method)
                result = fedcref(clients, params, seed=seed, associate=associate, screening=screening,
                                 progress=progress, name=method)
                rows = score_history(result.history, list(clients.initial), truth)
                summary = summarize_run(rows, truth)
                summary["rejections"] = _rejections(result.history, clients.n_clients)
                check_rejections(summary["rejections"]["rejected_by_device"], summary["rejections"]["uploads"],
                                 max_rejected_share, what=f"unsupervised {method} seed {seed}", unit="client")
                files = out.run(method, seed)
                files.dir.mkdir(parents=True)
                _write_json(files.history, rows)
                _write_json(files.summary, summary)
                _write_json(files.communities, _communities(result, clients))
                _write_json(files.graph, _graph(result, clients, truth))
                save_tensors(result.community_params, files.models,  # sorted metadata: byte-identical reruns
                             metadata={"architecture": "autoencoder", "input_dim": str(result.d)})
                summaries.append(summary)
                histories.append(rows)
                if progress:
                    print(f"seed {seed:>5} {method:<12} ACC {summary['acc_init']:.4f} -> {summary['acc_end']:.4f}"
                          f"  communities {summary['communities']}  iterations {summary['iterations']}", flush=True)
            methods[method] = {**_over_seeds(summaries), **rejection_totals([s["rejections"] for s in summaries])}
            curves[method] = _mean_curve(histories)
        metrics = {"global_k": int(truth.n_categories), "dataset": section.dataset, "methods": methods}
        _write_json(out.metrics, metrics)
        _write_json(out.curves, curves)
    return metrics


def plot_unsupervised(section, seeds: list[int], outputs: UnsupervisedOutputs, plots: PlotFiles) -> None:
    """``iterations.csv`` (mean curves, one row per method and iteration), ``iterations.png`` (Fig. 4) and
    ``association_graph.png`` (first method, first seed) into ``plots.unsupervised``."""
    plots.unsupervised.mkdir(parents=True, exist_ok=True)
    curves = json.loads(outputs.curves.read_text())
    metrics = json.loads(outputs.metrics.read_text())
    with open(plots.iterations_csv, "w", newline="") as f:  # long format, as the other plots
        writer = csv.DictWriter(f, fieldnames=ITERATIONS_HEADER)
        writer.writeheader()
        writer.writerows({"algorithm": method, **row} for method, rows in curves.items() for row in rows)
    where = f"{section.dataset}, N = {section.n_clients}, S = {section.samples_per_category}, dirtiness {section.dirtiness}"
    plot_iterations(curves, plots.iterations_png, title=f"FedCRef over iterations ({where}; seeds {seeds})",
                    global_k=metrics["global_k"])
    method, seed = section.methods[0], seeds[0]
    graph = json.loads(outputs.run(method, seed).graph.read_text())
    plot_association_graph(
        [tuple(n["cluster"]) for n in graph["nodes"]],
        {tuple(n["cluster"]): n["category"] for n in graph["nodes"]},
        [[tuple(m) for m in g] for g in graph["communities"]],
        [[tuple(a), tuple(b)] for a, b in graph["links"]],
        plots.association_graph_png,
        title=f"{method}, seed {seed}: final association graph, colour = true category",
    )


def _rejections(history: list[dict], n_clients: int) -> dict:
    """The run's community FedAvg uploads screened and rejected, per client (index =
    client, as cold start's ``rejected_by_device``)."""
    rejected = [c for h in history for c in h["rejected_clients"]]
    by_client = np.bincount(np.asarray(rejected, dtype=np.int64), minlength=n_clients).tolist()
    return {"uploads": int(sum(h["uploads"] for h in history)), "rejected": len(rejected),
            "rejected_by_device": by_client}


def _communities(result, clients: UnlabelledClients) -> dict:
    """Community p serves local clusters (client, q); the lookup table of the stage."""
    serves = {f"{i}:{q}": result.community_of(i, q) for i in range(clients.n_clients) for q in range(clients.k[i])}
    return {
        "communities": [{"id": p, "local_clusters": [list(m) for m in g], "clients": sorted({m[0] for m in g})}
                        for p, g in enumerate(result.communities)],
        "community_of_local_cluster": serves,
    }


def _graph(result, clients: UnlabelledClients, truth: CategoryTruth) -> dict:
    last = result.history[-1]
    before = last["assignment_at_association"]
    nodes = [
        {"cluster": [i, q], "size": int((before[i] == q).sum()), "category": cluster_category(before[i], truth.y[i], q)}
        for i in range(clients.n_clients) for q in range(clients.k[i])
    ]
    return {"nodes": nodes, "communities": last["groups"], "links": last["links"]}


def _over_seeds(summaries: list[dict]) -> dict:
    out = {}
    for key in SUMMARY_KEYS:
        mean, half = mean_ci95([s[key] for s in summaries])
        out[key] = mean
        out[f"{key}_ci95"] = half
    out["n_seeds"] = len(summaries)
    return out


def _mean_curve(histories: list[list[dict]]) -> list[dict]:
    """Mean ± 95% CI per iteration; a run that stopped early holds its last value."""
    length = max(len(h) for h in histories)
    rows = []
    for t in range(length):
        at = [h[min(t, len(h) - 1)] for h in histories]
        row: dict = {"iteration": t}
        for key in CURVE_KEYS:
            mean, half = mean_ci95([r[key] for r in at])
            row[key] = round(mean, 6)
            row[f"{key}_ci"] = round(half, 6)
        rows.append(row)
    return rows


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=1, default=_plain) + "\n")


def _plain(value: object) -> object:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
