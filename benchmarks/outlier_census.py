"""How far honest update norms stray from the round's median: the evidence for the
outlier rule's k (``training.outlier_factor``, ``engine/robust.py``).

Each run is one clean cold start (no faulty device) of one method on one of
``seed_methods_mnist.py``'s MNIST federations, with the rule switched off
(``outlier_factor: null``) so that nothing is rejected and every round is what an
honest federation uploads. For every batch the engine screens with known start rows
(``Engine.train``), each upload's norm is divided by the leave-one-out median of

- the whole batch (what the rule compares with), and
- its peers, the batch's other uploads that began from the same model.

Printed per run: the quantiles (50 %, 99 %, max) of both ratios, and how many uploads
had no peer ("lone": the only one of its model in the round). An attack the
benchmarks use (``poisoned_device.py``: ×100 sign-flipped, 1e30, NaN) sits at a ratio
of about 100 or more; k must sit between the two.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/outlier_census.py \\
        --runs fedclust_label_skew:fedclust fedclust_label_skew:ifca stocfl_shifted:stocfl flacc_rotated:flacc
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_methods_mnist import params_for  # noqa: E402


def _ratios(norms: torch.Tensor, rows: torch.Tensor) -> list[tuple[float, float | None]]:
    """(‖Δ_p‖ / LOO median of the batch, ‖Δ_p‖ / LOO median of p's peers or None) per row."""
    v = norms.double().cpu()
    g = rows.cpu()
    out = []
    for p in range(len(v)):
        others = torch.cat([v[:p], v[p + 1:]])
        peers = g == g[p]
        peers[p] = False
        out.append((float(v[p] / others.median()), float(v[p] / v[peers].median()) if peers.any() else None))
    return out


def census(experiment: str, method: str, seed: int) -> dict:
    import clusterfed.engine.engine as engine_module
    import clusterfed.engine.robust as robust
    from clusterfed.build import build_algorithm, build_engine, build_federation
    from clusterfed.config import parse_params

    seen: list[tuple[float, float | None]] = []
    honest_screen = engine_module.screen

    def screen(trained, start, rule=robust.RobustRule(), *, rows=None, norms=None):
        if norms is None:
            norms = robust.update_norms(trained, start, rows=rows)
        if rows is not None and len(norms) >= 2 and bool(torch.isfinite(norms).all()):
            seen.extend(_ratios(norms, rows))
        return honest_screen(trained, start, rule, rows=rows, norms=norms)

    engine_module.screen = screen
    try:
        raw = json.loads(params_for(experiment, seed, "cpu").model_dump_json())
        raw["coldstart"]["algorithms"] = [method]
        raw["training"]["outlier_factor"] = None
        params = parse_params(raw, source=f"outlier census {experiment}")
        fed = build_federation(params, seed)
        result = build_algorithm(method, params).fit(build_engine(params, fed), seed=seed, ground_truth=fed.groups)
    finally:
        engine_module.screen = honest_screen

    def q(x):
        return np.round(np.quantile(x, [0.5, 0.99, 1.0]), 2).tolist() if len(x) else None

    batch = [a for a, _ in seen]
    peer = [b for _, b in seen if b is not None]
    lone = [a for a, b in seen if b is None]
    return {"experiment": experiment, "method": method, "seed": seed,
            "accuracy": round(100 * float(result.device_accuracy.mean()), 2), "uploads": len(seen),
            "batch_ratio_q50_q99_max": q(batch), "lone_uploads": len(lone), "lone_batch_ratio_q50_q99_max": q(lone),
            "peer_ratio_q50_q99_max": q(peer)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, metavar="EXPERIMENT:METHOD")
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for run in args.runs:
        experiment, method = run.split(":")
        print(json.dumps(census(experiment, method, args.seed)), flush=True)


if __name__ == "__main__":
    main()
