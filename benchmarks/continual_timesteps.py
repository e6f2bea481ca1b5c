"""Per-timestep rows of continual runs: accuracy and each cluster's device count.

    .venv/bin/python benchmarks/continual_timesteps.py <run>/data/continual/cfaacl/seed_10/timesteps.json ...

Prints, per ``timesteps.json`` the continual stage wrote, the mean accuracy over
t = 1..T, the concept-reuse rate, the accuracy % at every t and {cluster id: devices}
at every t (a recurring concept that returns to its old cluster shows its old id).
"""

from __future__ import annotations

import collections
import json
import sys


def main() -> None:
    for path in sys.argv[1:]:
        d = json.load(open(path))
        rows = d["rows"]
        print(f"{path}: mean {100 * d['summary']['accuracy']:.2f}, reuse {d['summary']['concept_reuse_rate']}")
        print("  accuracy %", [round(100 * r["accuracy"], 1) for r in rows])
        print("  clusters  ", [dict(collections.Counter(r["cluster_of_device"])) for r in rows])


if __name__ == "__main__":
    main()
