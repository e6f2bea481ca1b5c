"""Where FedClust's threshold λ must sit for MNIST label skew 20% (RESULTS.md §5).

FedClust's λ is a Euclidean distance between the final layers θ̂ that devices upload
after ``init_epochs`` of local training from one θ⁰ (Alg. 1 lines 3–5), so its scale
depends on the model, lr and local steps rather than on the data alone. This script
rebuilds exactly the θ̂ that ``FedClust.fit`` computes for the ``fedclust_label_skew``
experiment of ``seed_methods_mnist.py`` (same partition, engine, seed and generator)
and prints the range of pairwise distances by how many labels two devices share: a λ
between the "share both" maximum and the "share one" minimum groups devices by label set.

    .venv/bin/python benchmarks/fedclust_lambda.py --threads 1
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from clusterfed.algorithms.base import generators
from clusterfed.algorithms.fedclust import local_final_layers, proximity_matrix
from clusterfed.build import build_engine, build_federation
from seed_methods_mnist import EXPERIMENTS, params_for


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=EXPERIMENTS["fedclust_label_skew"]["seeds"][0])
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = params_for("fedclust_label_skew", args.seed, "auto")
    fed = build_federation(params, args.seed)
    engine = build_engine(params, fed)
    _, gen = generators(args.seed)  # as FedClust.fit draws θ⁰ and the local epochs
    theta0 = engine.init_params(1, gen, distinct=False)
    theta_hat = local_final_layers(
        engine, theta0, gen, local_epochs=params.coldstart.fedclust.init_epochs, training=engine.training
    )
    distance = proximity_matrix(theta_hat)
    labels = [frozenset(np.unique(d.y_train).tolist()) for d in fed.devices]
    i, j = np.triu_indices(fed.n_devices, k=1)
    shared = np.array([len(labels[a] & labels[b]) for a, b in zip(i, j)])
    print(f"FedClust label skew 20%, seed {args.seed}: distances ‖θ̂_p − θ̂_q‖ between {len(i)} pairs\n")
    print("| labels shared | pairs | min | median | max |\n|---|---|---|---|---|")
    for k in sorted(set(shared.tolist()), reverse=True):
        d = distance[i, j][shared == k]
        print(f"| {k} | {len(d)} | {d.min():.3f} | {np.median(d):.3f} | {d.max():.3f} |")
    print(f"\nparams.coldstart.fedclust.lam of the experiment: {params.coldstart.fedclust.lam}")


if __name__ == "__main__":
    main()
