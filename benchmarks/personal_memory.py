"""Peak RSS of a personalised method's fit, in copies of the per-device models (issue 14).

Ditto, Per-FedAvg, pFedMe and LG-FedAvg hold one model per device. On StoCFL's rotated
MNIST (N = 1200 devices, ``seed_methods_mnist.py``'s ``stocfl_rotated``) with StoCFL's
784-2048-10 MLP, one copy of those models is 7.8 GB, so how many copies a round makes
decides whether the method runs on a 24 GiB machine at all. Prints, per method, the
peak RSS before the fit (data, engine) and after ``--rounds`` rounds, and the growth in
copies of the per-device models (``gb_per_copy``). Run it against two source trees to
compare them (one method per process, so peaks do not mix):

    OMP_NUM_THREADS=1 PYTHONPATH=<tree>/src .venv/bin/python benchmarks/personal_memory.py --method ditto
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_methods_mnist import params_for  # noqa: E402  (the same federation as the baselines)


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, choices=["ditto", "perfedavg", "pfedme", "lgfedavg"])
    p.add_argument("--model", default="mlp", choices=["mlp", "paper"], help="mlp: 784-128-10; paper: 784-2048-10")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import torch

    from clusterfed import build, registry

    torch.set_num_threads(1)
    params = params_for("stocfl_rotated", 10, "cpu", args.model)
    fed = build.build_federation(params, 10)
    engine = build.build_engine(params, fed)
    w = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    copy_gb = engine.n_devices * sum(v[0].numel() * v.element_size() for v in w.values()) / 1e9
    del w
    before = peak_gb()
    algo = registry.get("coldstart", args.method)(rounds=args.rounds, participation=params.training.participation)
    result = algo.fit(engine, seed=10)
    after = peak_gb()
    print(json.dumps({"method": args.method, "model": args.model, "devices": engine.n_devices, "rounds": args.rounds,
                      "gb_per_copy": round(copy_gb, 3), "peak_rss_gb_before_fit": round(before, 3),
                      "peak_rss_gb_after_fit": round(after, 3), "growth_in_copies": round((after - before) / copy_gb, 2),
                      "accuracy": round(float(result.device_accuracy.mean()), 6)}))


if __name__ == "__main__":
    main()
