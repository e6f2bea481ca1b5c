"""FeSEM under one poisoned device: which local models seed the centres, and what the
centres end up holding (the mechanism behind RESULTS §9's FeSEM rows on 50 digits devices).

For one seed of the 25 + 25-device digits S2 federation (params.yaml otherwise), FeSEM
(K = 5) runs clean, with device 0's training data NaN (its every upload rejected) and
without device 0 (``absent``); printed: the devices whose first-round local models
k-means++ picked as centres (``seed_centres``; device ids), then per final centre its
devices of each ground-truth group and their mean test accuracy, and the honest-device
(all but device 0) mean test accuracy.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fesem_poisoned_seeding.py --seed 10

``--reseed SEED ...`` instead appends to ``--out`` (jsonl), per seed, the honest-device
accuracy of the *clean* run with k-means++ drawing from another random stream
(``default_rng([seed, 1])``): the seeding perturbed without any device removed, to set
beside ``poisoned_device.py``'s rows of the same seeds.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fesem_poisoned_seeding.py --reseed 1 2 3 \
        --out benchmarks/out/fesem_reseeded.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import poisoned_device  # noqa: E402

from clusterfed import build  # noqa: E402
from clusterfed.algorithms import fesem  # noqa: E402
from clusterfed.config import parse_params  # noqa: E402


def _params(seed: int):
    return parse_params(poisoned_device._raw(seed, {"scenario.group_sizes": [25, 25]}, continual=False))


def reseeded(seeds: list[int], out: Path) -> None:
    """The clean run of each seed with k-means++ keys drawn from ``default_rng([seed, 1])``."""
    honest_seeding = fesem.seed_centres
    for seed in seeds:
        params = _params(seed)
        fed = build.build_federation(params, seed)
        fesem.seed_centres = lambda local, K, keys, s=seed: honest_seeding(
            local, K, np.random.default_rng([s, 1]).exponential(size=keys.shape))
        try:
            result = build.build_algorithm("fesem", params).fit(build.build_engine(params, fed), seed=seed)
        finally:
            fesem.seed_centres = honest_seeding
        row = {"seed": seed, "method": "fesem", "attack": "reseeded",
               "honest_accuracy": float(np.delete(result.device_accuracy, 0).mean())}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--reseed", type=int, nargs="+", default=None, metavar="SEED")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/fesem_reseeded.jsonl"))
    args = parser.parse_args()
    if args.reseed:
        reseeded(args.reseed, args.out)
        return
    params = _params(args.seed)
    fed = build.build_federation(params, args.seed)
    picked: list[np.ndarray] = []
    honest_seeding = fesem.seed_centres

    def traced(local, K, keys):
        idx = honest_seeding(local, K, keys)
        picked.append(idx)
        return idx

    fesem.seed_centres = traced
    try:
        for attack in ("clean", "nan", "absent"):
            if attack == "absent":
                ids = np.arange(1, fed.n_devices)
                engine = build.build_engine(params, fed.subset(ids))
            else:
                ids = np.arange(fed.n_devices)
                engine = (build.build_engine(params, fed) if attack == "clean"
                          else poisoned_device._poisoned_engine(params, fed, 0, attack))
            method = build.build_algorithm("fesem", params)
            result = method.fit(engine, seed=args.seed)
            accepted = ids if attack == "clean" else ids[ids != 0]  # the rows seed_centres saw
            honest = ids != 0
            print(f"{attack}: honest accuracy {100 * result.device_accuracy[honest].mean():.2f} %, "
                  f"centres seeded on devices {accepted[picked[-1]].tolist()}")
            groups = fed.groups[ids]
            for k in np.unique(method.labels_):
                members = (method.labels_ == k) & honest
                print(f"  centre {k}: group 0 {int((members & (groups == 0)).sum())}, "
                      f"group 1 {int((members & (groups == 1)).sum())} honest devices, "
                      f"accuracy {100 * result.device_accuracy[members].mean():.1f} %")
    finally:
        fesem.seed_centres = honest_seeding


if __name__ == "__main__":
    main()
