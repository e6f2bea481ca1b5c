"""How much of each FedSoft cluster model is each ground-truth group's data.

Reads the last importance weights u_ks that ``thesis_mnist.py`` records in a FedSoft row
and prints, per cluster s, the share of the aggregation weights v_sk ∝ u_ks n_k held by
group 1 (the scarce / shifted / noisy devices), the devices of each group the cluster
serves, and each group's mean u_ks. It explains why no cluster model serves the A2
scarce devices well (benchmarks/RESULTS.md §7, "Session 53").

    .venv/bin/python benchmarks/fedsoft_cluster_shares.py benchmarks/out/authors_a2_fedsoft_val_u.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from clusterfed.algorithms.fedsoft import aggregation_weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", type=Path, help="a thesis_mnist.py output whose FedSoft rows record importance_weights")
    args = ap.parse_args()
    for line in args.rows.read_text().splitlines():
        r = json.loads(line)
        if r.get("algorithm") != "fedsoft":
            continue
        if r.get("importance_weights") is None:
            raise SystemExit(f"{args.rows}: the {r['scenario']} seed {r['seed']} row records no importance_weights")
        u, n, g = np.asarray(r["importance_weights"]), np.asarray(r["n_train"]), np.asarray(r["groups"])
        served = np.full(len(g), -1)  # the cluster s serving each device (a served cluster's id is its s)
        for c in r["clusters"]:
            served[c["devices"]] = c["id"]
        v = aggregation_weights(u, n)
        print(f"{r['scenario']} seed {r['seed']} ({r['construction']}, serve={r['hyperparameters']['serve']}): "
              f"group 1 holds {n[g == 1].sum() / n.sum():.3f} of the training data\n")
        print("| cluster | group-1 share of v | group-1 / group-0 devices served | mean u, group 1 / group 0 |")
        print("|---|---|---|---|")
        for s in range(u.shape[1]):
            print(f"| {s} | {v[s, g == 1].sum():.3f} | {int(((served == s) & (g == 1)).sum())} / "
                  f"{int(((served == s) & (g == 0)).sum())} | {u[g == 1, s].mean():.3f} / {u[g == 0, s].mean():.3f} |")
        print()


if __name__ == "__main__":
    main()
