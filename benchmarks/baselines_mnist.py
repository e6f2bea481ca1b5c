"""The seed papers' baselines (issue 14) on MNIST beside the figures the papers print.

Each run is one (experiment, method, seed): the federation is the one
``seed_methods_mnist.py`` builds for the experiment (same params, same seed, through
``clusterfed.build.build_federation`` / ``build_engine``), the method is a library class
fitted on it (the registered method with the experiment's rounds and
participation unless the method's entry overrides them), and the run writes ``--out/<experiment>/<method>/seed_<s>.json``
(accuracy, clusters, ARI/NMI, traffic, wall time, per-round history). A run whose
JSON exists is skipped, so rerunning resumes. ``--summarize`` prints the tables of
RESULTS.md.

    .venv/bin/python benchmarks/baselines_mnist.py --threads 1 --experiments stocfl_shifted
    .venv/bin/python benchmarks/baselines_mnist.py --summarize

Experiments (settings of the partition and the local SGD: ``seed_methods_mnist.py``):

- ``stocfl_shifted`` (StoCFL Table 2, shifted MNIST, 20 clients): CFL (98.20), IFCA (98.11), and
  IFCA with 4 random starts (``ifca_restarts``, IFCA §5).
- ``flacc_rotated`` (FLACC Table I, rotated MNIST, 100 clients, c = 0.2): CFL (97.56),
  FL+HC d = 0.5 / 0.75 / 1.0 (95.21 / 96.46 / 85.96), pFedMe (96.09), Per-FedAvg (95.55),
  IFCA k = 3 / 5 (96.79 / 97.24).
  IFCA k = 4 (98.24), FedAvg (95.30), NoFed (91.37).
- ``stocfl_rotated`` (StoCFL Table 1, N = 1200, |D| = 200, 10 %): FedProx (77.82),
  Ditto (79.38), IFCA M̃ = 2 / 4 / 6 (86.12 / 91.00 / 92.15), FedAvg (94.96; also as the
  authors' code trains its global model, ``fedavg_sequential``). With
  ``--model paper --sparse-inputs`` they train StoCFL's 784-2048-10 MLP:
  ``--out benchmarks/out/baselines_paper``.
- ``fedclust_label_skew`` (FedClust §5, label skew 20 %, 100 clients): FedProx, FedNova,
  LG-FedAvg, Per-FedAvg, CFL, PACFL, and FedAvg, Local, IFCA on every seed (no MNIST
  column in the paper).

"Rounds to target" / "MB to target" (per seed) are FedClust Tables 4-5's measures: the
first round whose mean device accuracy reaches ``evaluate.target_accuracy`` (90 %) and
the megabytes sent up to it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_methods_mnist import params_for  # noqa: E402  (the same federations and SGD)

# method -> (registered name, hyperparameters, the paper's figure); ``rounds`` and
# ``participation`` come from the experiment's params unless given here.
METHODS: dict[str, dict[str, tuple[str, dict, float]]] = {
    "stocfl_shifted": {
        # the authors' ε (0.4, 1.6, after round 20); 50 rounds as for StoCFL
        "cfl": ("cfl", {"eps1": 0.4, "eps2": 1.6}, 98.20),
        "ifca": ("ifca", {"n_clusters": 4}, 98.11),
        # IFCA §5's "random initialization and multiple restarts": the best of 4 starts
        # after 5 rounds each, by IFCA's objective (RESULTS §7, session 25)
        "ifca_restarts": ("ifca", {"n_clusters": 4, "restarts": 4, "restart_rounds": 5}, 98.11),
        # FedAvg as the authors' code trains its global model (see stocfl_rotated below)
        "fedavg_sequential": ("fedavg", {"visit": "sequential"}, 24.44),
    },
    "flacc_rotated": {
        # CFL needs every client's update: full participation, not FLACC's c = 0.2
        "cfl": ("cfl", {"eps1": 0.4, "eps2": 1.6, "participation": 1.0}, 97.56),
        # FL+HC: 10 FedAvg rounds, the clustering round, 89 rounds per cluster = 100
        "flhc_d0.5": ("flhc", {"d": 0.5, "cluster_round": 10, "rounds": 89}, 95.21),
        "flhc_d0.75": ("flhc", {"d": 0.75, "cluster_round": 10, "rounds": 89}, 96.46),
        "flhc_d1.0": ("flhc", {"d": 1.0, "cluster_round": 10, "rounds": 89}, 85.96),
        # the same d read as cosine distances between updates (scale-free), single / average linkage
        **{f"flhc_cosine_{link}_d{d}": ("flhc", {"d": d, "linkage": link, "metric": "cosine", "cluster_round": 10,
                                                 "rounds": 89}, paper)
           for link in ("single", "average") for d, paper in ((0.5, 95.21), (0.75, 96.46), (1.0, 85.96))},
        "perfedavg": ("perfedavg", {"alpha": 0.01}, 95.55),
        "pfedme": ("pfedme", {"lam": 15.0, "K": 5, "personal_lr": 0.01}, 96.09),  # η = FLACC's lr 0.1: ηλ = 1.5
        "pfedme_paper": ("pfedme", {"lam": 15.0, "K": 5, "personal_lr": 0.1, "eta": 0.005}, 96.09),  # pFedMe §5
        # IFCA: FLACC's c = 0.2, 100 rounds (k = 4 is also seed_methods_mnist.py's seed-10 row)
        "ifca_k3": ("ifca", {"n_clusters": 3}, 96.79),
        "ifca_k4": ("ifca", {"n_clusters": 4}, 98.24),
        "ifca_k5": ("ifca", {"n_clusters": 5}, 97.24),
        "fedavg": ("fedavg", {}, 95.30),
        "nofed": ("local", {}, 91.37),
    },
    "stocfl_rotated": {
        "fedprox": ("fedprox", {"mu": 0.01}, 77.82),
        "ditto": ("ditto", {"lam": 0.1}, 79.38),
        "ifca_m2": ("ifca", {"n_clusters": 2}, 86.12),
        "ifca_m4": ("ifca", {"n_clusters": 4}, 91.00),
        "ifca_m6": ("ifca", {"n_clusters": 6}, 92.15),
        # IFCA §5's restarts, as for stocfl_shifted (not a StoCFL row: its IFCA starts once)
        "ifca_m6_restarts": ("ifca", {"n_clusters": 6, "restarts": 4, "restart_rounds": 5}, 92.15),
        "fedavg": ("fedavg", {}, 94.96),  # the network's effect: seed_methods_mnist.py's FedAvg row, on every seed
        # the authors' global model ω: the round's clients train in turn (dunzeng/StoCFL trainer.py)
        "fedavg_sequential": ("fedavg", {"visit": "sequential"}, 94.96),
    },
    # FedClust §5 (label skew 20 %): Table 1's other rows; the paper prints no MNIST
    # column, so no figure. Its hyperparameters: Per-FedAvg α = 1e-2, CFL ε1 0.4 /
    # ε2 0.6, PACFL p = 3; CFL with every client's update (as for FLACC above).
    "fedclust_label_skew": {
        "fedprox": ("fedprox", {"mu": 0.01}, None),
        "fednova": ("fednova", {}, None),
        "lgfedavg": ("lgfedavg", {}, None),
        "perfedavg": ("perfedavg", {"alpha": 0.01}, None),
        "cfl": ("cfl", {"eps1": 0.4, "eps2": 0.6, "participation": 1.0}, None),
        "pacfl": ("pacfl", {"p": 3}, None),
        # §5's rows (seed_methods_mnist.py runs them on the experiment's first seed only)
        "fedavg": ("fedavg", {}, None),
        "local": ("local", {}, None),
        "ifca": ("ifca", {"n_clusters": 4}, None),
    },
}


def build_method(name: str, kwargs: dict, params):
    from clusterfed import registry

    values = {"rounds": params.coldstart.rounds, "participation": params.training.participation, **kwargs}
    return registry.get("coldstart", name)(**values)


def run(args) -> None:
    import numpy as np

    from clusterfed import build
    from clusterfed.evaluation.metrics import clustering_scores, mean_stderr, traffic_scores

    for experiment in args.experiments:
        for method in args.methods or list(METHODS[experiment]):
            name, kwargs, _ = METHODS[experiment][method]
            for seed in args.seeds:
                out = Path(args.out) / experiment / method / f"seed_{seed}.json"
                if out.is_file():
                    continue
                params = params_for(experiment, seed, args.device, args.model)
                training = {k: v for k, v in (("sparse_inputs", args.sparse_inputs or None),
                                              ("local_epochs", args.local_epochs), ("batch_size", args.batch_size))
                            if v is not None}
                if training:  # e.g. the sparse-input MLP kernel (README "Mostly-constant inputs")
                    from clusterfed.config import parse_params

                    raw = json.loads(params.model_dump_json())
                    raw["training"].update(training)
                    params = parse_params(raw, source=f"benchmark {experiment} training {training}")
                t0, c0 = time.perf_counter(), time.process_time()
                fed = build.build_federation(params, seed)
                engine = build.build_engine(params, fed)
                algo = build_method(name, kwargs, params)
                result = algo.fit(engine, seed=seed, progress=False)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                acc, stderr = mean_stderr(result.device_accuracy)
                record = {
                    "experiment": experiment, "method": method, "seed": seed, "kwargs": kwargs,
                    "training": params.training.model_dump(include={"lr", "batch_size", "local_epochs", "l2",
                                                                     "participation", "sparse_inputs"}),
                    "model": params.model.model_dump(),
                    "accuracy": acc, "accuracy_stderr": stderr, "n_clusters": result.n_clusters,
                    **clustering_scores(fed.groups, result.model_of_device),
                    **traffic_scores(result.history, params.evaluate.target_accuracy),
                    "wall_s": wall, "cpu_s": cpu, "rejected_updates": result.rejected_updates,
                    "history": result.history,
                }
                if getattr(algo, "updates_", None) is not None:  # FL+HC: re-read any d / linkage offline
                    from scipy.spatial.distance import pdist

                    record["update_distances"] = {m: pdist(algo.updates_, m).tolist() for m in ("euclidean", "cosine")}
                if hasattr(algo, "splits_"):
                    record["splits"] = [list(s) for s in algo.splits_]
                    norms = algo.norms_
                    record["norms_last_round"] = [r for r in norms if r["round"] == norms[-1]["round"]]
                    record["norms_min_mean"] = float(np.min([r["mean_norm"] for r in norms]))
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = out.with_suffix(".tmp")
                tmp.write_text(json.dumps(record, default=float))
                tmp.replace(out)
                print(f"{experiment} {method} seed {seed}: {100 * acc:.2f}% {result.n_clusters} clusters "
                      f"{wall:.0f} s", flush=True)


def summarize(args) -> None:
    import numpy as np

    for experiment in args.experiments:
        rows = []
        for method, (_, kwargs, paper) in METHODS[experiment].items():
            runs = [json.loads(p.read_text()) for p in sorted((Path(args.out) / experiment / method).glob("seed_*.json"))]
            printed = "—" if paper is None else f"{paper:.2f}"
            if not runs:
                rows.append(f"| {method} | not run | | | | | | | | {printed} |")
                continue
            acc = np.array([r["accuracy"] for r in runs]) * 100
            sd = f" ± {acc.std(ddof=1):.2f}" if len(acc) > 1 else f" ± {100 * runs[0]['accuracy_stderr']:.2f} (devices)"
            clusters = ",".join(str(r["n_clusters"]) for r in runs)
            ari = "—" if runs[0]["ari"] is None else f"{np.mean([r['ari'] for r in runs]):.2f}"
            mb = np.mean([r["mb_per_round"] for r in runs])
            wall = np.mean([r["wall_s"] for r in runs])
            seeds = ",".join(str(r["seed"]) for r in runs)
            to_target = ",".join("—" if r["rounds_to_target"] is None else str(r["rounds_to_target"]) for r in runs)
            mb_target = ",".join("—" if r["mb_to_target"] is None else f"{r['mb_to_target']:.0f}" for r in runs)
            rows.append(f"| {method} | {acc.mean():.2f}{sd} | {clusters} | {ari} | {mb:.1f} | {to_target} | {mb_target} "
                        f"| {wall:.0f} | {seeds} | {printed} |")
        print(f"### {experiment}\n")
        print("| method | accuracy % | clusters | ARI | MB/round | rounds to target | MB to target | wall s | seeds | paper |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(rows) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--methods", nargs="+", default=None, help="a subset of the experiment's methods")
    p.add_argument("--seeds", nargs="+", type=int, default=[10])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "paper"],
                   help="the network (seed_methods_mnist.py: paper = each paper's own)")
    p.add_argument("--sparse-inputs", action="store_true",
                   help="train MLPs with the sparse-input kernel (same steps up to float rounding, less CPU)")
    p.add_argument("--local-epochs", type=int, default=None, help="replace the experiment's local epochs a round")
    p.add_argument("--batch-size", type=int, default=None, help="replace the experiment's local batch size")
    p.add_argument("--out", default="benchmarks/out/baselines")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 when runs share cores)")
    p.add_argument("--summarize", action="store_true")
    args = p.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    summarize(args) if args.summarize else run(args)


if __name__ == "__main__":
    main()
