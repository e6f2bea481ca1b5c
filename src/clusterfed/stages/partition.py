"""Stage ``partition``: one federation per seed, and a readable summary."""

from __future__ import annotations

from clusterfed.build import build_federation
from clusterfed.config import Params
from clusterfed.layout import RunLayout
from clusterfed.stages.files import atomic_dir, write_json


def partition(params: Params, layout: RunLayout) -> None:
    """``seed_<s>.npz`` per seed and ``groups.json`` (groups, newcomers, split sizes)."""
    summary = {}
    with atomic_dir(layout.partitions) as tmp:
        for seed in params.seeds:
            fed = build_federation(params, seed)
            fed.save(tmp / layout.partition(seed).name)
            summary[str(seed)] = {
                "groups": fed.groups.tolist(),
                "newcomers": fed.description.get("newcomers", []),
                "n_train": [d.n_train for d in fed.devices],
                "n_val": [len(d.y_val) for d in fed.devices],
                "n_test": [len(d.y_test) for d in fed.devices],
            }
        write_json(tmp / layout.groups.name, summary)
