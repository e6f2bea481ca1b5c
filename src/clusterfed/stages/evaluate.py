"""Stage ``evaluate``: metrics over seeds (``metrics.json``) and the plots."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from clusterfed.config import Params
from clusterfed.evaluation import clustering_scores, mean_stderr, rejection_totals, summarize_runs, traffic_scores
from clusterfed.evaluation.plots import plot_assignments, plot_curves, plot_support_graph
from clusterfed.layout import PlotFiles, RunLayout
from clusterfed.stages.files import atomic_dir, read_json, write_json

CONTINUAL_PLOT_HEADER = ["algorithm", "timestep", "accuracy", "n_clusters"]


def evaluate(params: Params, layout: RunLayout) -> dict:
    """Summarise every algorithm over seeds into ``metrics.json`` (sections
    ``coldstart`` and, when enabled, ``continual``) and plots; returns the metrics."""
    metrics: dict[str, dict] = {}
    curves: dict[str, list[float]] = {}
    sent: dict[str, list[float]] = {}  # cumulative MB per round
    for name in params.coldstart.algorithms:
        runs, histories = [], []
        for seed in params.seeds:
            files = layout.coldstart_run(name, seed)
            clustering, history = read_json(files.clustering), read_json(files.history)
            groups = clustering["ground_truth_groups"]
            run = {
                "device_accuracy": read_json(files.device_accuracy),
                "n_clusters": clustering["n_clusters"],
                **clustering_scores(None if groups is None else np.asarray(groups),
                                    np.asarray(clustering["model_of_device"])),
                **traffic_scores(history, params.evaluate.target_accuracy),
            }
            if files.newcomers.is_file():
                run["newcomer_accuracy"] = float(np.mean(read_json(files.newcomers)["accuracy"]))
            run["rejections"] = read_json(files.rejections)
            runs.append(run)
            histories.append(history)
        metrics[name] = summarize_runs(runs)
        length = min(len(h) for h in histories)
        curves[name] = np.mean([[r["accuracy"] for r in h[:length]] for h in histories], axis=0).tolist()
        sent[name] = np.mean(
            [np.cumsum([(r["bytes_down"] + r["bytes_up"]) / 1e6 for r in h[:length]]) for h in histories], axis=0
        ).tolist()

    with atomic_dir(layout.plots) as tmp:
        plots = layout.plot_files(under=tmp)
        with open(plots.accuracy_csv, "w", newline="") as f:  # long format: one plot, no per-method block
            writer = csv.writer(f)
            writer.writerow(["algorithm", "round", "accuracy", "mb_sent"])
            for name, acc in curves.items():
                writer.writerows(
                    (name, r + 1, round(a, 6), round(mb, 4)) for r, (a, mb) in enumerate(zip(acc, sent[name]))
                )
        plot_curves(
            curves,
            plots.accuracy_png,
            xlabel="communication round",
            ylabel="mean device test accuracy",
            title=f"{params.data.dataset} {params.scenario.name}, mean over seeds {params.seeds}",
            first_x=1,
            ylim=(0, 1),
        )
        plot_curves(
            curves,
            plots.accuracy_vs_traffic_png,
            xlabel="megabytes sent between server and devices (cumulative)",
            ylabel="mean device test accuracy",
            title=f"{params.data.dataset} {params.scenario.name}: accuracy per megabyte",
            ylim=(0, 1),
            x=sent,
        )
        _support_plots(params, layout, plots)
        report = {"coldstart": metrics}
        plots.continual.mkdir()
        if params.continual.enabled:
            report["continual"] = _evaluate_continual(params, layout, plots)
        else:  # the declared plot's file, without rows: `dvc plots show` draws an empty chart
            with open(plots.continual_accuracy_csv, "w", newline="") as f:
                csv.writer(f).writerow(CONTINUAL_PLOT_HEADER)
        from clusterfed.stages.unsupervised import ITERATIONS_HEADER, plot_unsupervised

        plots.unsupervised.mkdir()
        # FedCRef runs as its own stage: evaluated when enabled and that stage has run
        # (``dvc repro`` and the flows always run it first; a cold-start-only call does not).
        fedcref = layout.unsupervised_outputs()
        if params.unsupervised.enabled and fedcref.metrics.is_file():
            report["unsupervised"] = read_json(fedcref.metrics)
            plot_unsupervised(params.unsupervised, params.seeds, fedcref, plots)
        else:  # as for continual: the declared plot's file, without rows
            with open(plots.iterations_csv, "w", newline="") as f:
                csv.writer(f).writerow(ITERATIONS_HEADER)
    write_json(layout.metrics, report)
    return report


def _support_plots(params: Params, layout: RunLayout, plots: PlotFiles) -> None:
    """For every algorithm whose clusters had supporters, or shared devices, in some
    round: the final support graph per seed (``<algorithm>.png``) and the support edges,
    one-way edges and helping memberships (a device in a cluster that does not serve
    it) per round, mean over seeds (``edges.csv``, one row per algorithm and round)."""
    plots.support.mkdir()
    columns = ("support_edges", "one_way_edges", "helping_memberships")
    table = [["algorithm", "round", *columns]]
    for name in params.coldstart.algorithms:
        runs = {seed: layout.coldstart_run(name, seed) for seed in params.seeds}
        histories = {s: read_json(f.history) for s, f in runs.items()}
        if not any(r.get("support_edges", 0) or r.get("helping_memberships", 0) for h in histories.values() for r in h):
            continue
        panels = {f"seed {s}": read_json(f.clustering) for s, f in runs.items()}
        plot_support_graph(
            panels, plots.support_png(name),
            title=f"{name}: final support graph, {params.data.dataset} {params.scenario.name} "
            f"({params.scenario.construction} construction)",
        )
        length = min(len(h) for h in histories.values())
        for r in range(length):
            rows = [h[r] for h in histories.values()]
            table.append([name, r + 1, *(round(float(np.mean([x.get(k, 0) for x in rows])), 3) for k in columns)])
    with open(plots.support_edges_csv, "w", newline="") as f:  # header only when no algorithm had supporters
        csv.writer(f).writerows(table)


def _evaluate_continual(params: Params, layout: RunLayout, plots: PlotFiles) -> dict:
    """Mean accuracy on the current concept per timestep and over t = 1..T (the
    thesis tables' figure), clusters per timestep, concept-reuse rate; plots."""
    out: dict[str, dict] = {}
    accuracy_curves, cluster_curves = {}, {}
    table = [CONTINUAL_PLOT_HEADER]
    for name in params.continual.algorithms:
        runs = [read_json(layout.continual_run(name, seed).timesteps) for seed in params.seeds]
        per_t = np.mean([[r["accuracy"] for r in run["rows"]] for run in runs], axis=0)
        clusters_t = np.mean([[r["n_clusters"] for r in run["rows"]] for run in runs], axis=0)
        mean, stderr = mean_stderr([run["summary"]["accuracy"] for run in runs])
        reuse = [run["summary"]["concept_reuse_rate"] for run in runs]
        out[name] = {
            "accuracy": mean,
            "accuracy_stderr": stderr,
            "accuracy_per_timestep": [round(float(a), 6) for a in per_t],
            "n_clusters_per_timestep": [float(k) for k in clusters_t],
            "concept_reuse_rate": None if reuse[0] is None else float(np.mean(reuse)),
            **rejection_totals([run["summary"] for run in runs]),  # summed over seeds, as for cold start
            "n_seeds": len(runs),
        }
        accuracy_curves[name], cluster_curves[name] = per_t.tolist(), clusters_t.tolist()
        table += [[name, t, round(a, 6), k] for t, (a, k) in enumerate(zip(per_t, clusters_t))]
        first = runs[0]["rows"]
        plot_assignments(
            np.array([r["cluster_of_device"] for r in first]).T,
            np.array([r["concept_of_device"] for r in first]).T,
            plots.continual_assignments_png(name),
            title=f"{name}: cluster of each device over time (seed {params.seeds[0]})",
        )
    with open(plots.continual_accuracy_csv, "w", newline="") as f:
        csv.writer(f).writerows(table)
    title = f"{params.data.dataset} {params.scenario.name} {params.continual.setting}"
    plot_curves(
        accuracy_curves, plots.continual_accuracy_png, xlabel="timestep",
        ylabel="mean accuracy on current concept", title=title, ylim=(0, 1),
    )
    plot_curves(
        cluster_curves, plots.continual_clusters_png, xlabel="timestep",
        ylabel="clusters serving devices", title=title, integer_y=True,
    )
    return out
