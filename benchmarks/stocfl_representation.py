"""StoCFL's two client representations on shifted MNIST (issue 17 item 4).

``gradient`` is the paper's Ψ(D_i) = ∂ℓ(ψ; D_i)/∂ψ (§2.1); ``movement`` is the
authors' code's ψ − ψ_i after ``representation_epochs`` of local SGD at batch
``representation_batch_size`` (20 at 50 in their README). Both run StoCFL alone on
``seed_methods_mnist.py``'s ``stocfl_shifted`` setting (20 clients, 4 label shifts,
all clients every round, so every client is represented and clustered in round 1),
with fewer rounds; one line per variant: clusters, ARI, accuracy, wall time.

    nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \\
        .venv/bin/python benchmarks/stocfl_representation.py --rounds 5 --seed 10
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = {
    "gradient tau 0.5": {"representation": "gradient", "tau": 0.5},
    "movement 20x50 tau 0.5": {"representation": "movement", "tau": 0.5},
    "movement 20x50 tau 0.65": {"representation": "movement", "tau": 0.65},
}


def main() -> None:
    import torch

    from clusterfed import stages
    from clusterfed.config import parse_params
    from clusterfed.layout import RunLayout
    from seed_methods_mnist import EXPERIMENTS, ROOT

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", default="benchmarks/out/stocfl_representation")
    args = p.parse_args()
    torch.set_num_threads(1)
    for name in args.variants:
        raw = json.loads(json.dumps(EXPERIMENTS["stocfl_shifted"]["params"]))
        raw["coldstart"]["algorithms"] = ["stocfl"]
        raw["coldstart"]["rounds"] = args.rounds
        raw["coldstart"]["stocfl"].update(VARIANTS[name])
        raw.update(seeds=[args.seed], data={"dataset": "mnist", "root": ROOT}, model={"name": "mlp"},
                   continual={"enabled": False})
        raw["training"]["device"] = "cpu"
        params = parse_params(raw, source=f"stocfl_representation {name}")
        layout = RunLayout(Path(args.out) / name.replace(" ", "_") / f"seed_{args.seed}")
        t0 = time.perf_counter()
        stages.partition(params, layout)
        stages.coldstart(params, layout)
        stages.evaluate(params, layout)
        m = json.loads(layout.metrics.read_text())["coldstart"]["stocfl"]
        print(f"| {name} | {m['n_clusters']:g} | {m['ari']:.2f} | {100 * m['accuracy']:.2f} | "
              f"{time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
