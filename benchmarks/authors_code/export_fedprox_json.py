"""Write the FedProx MNIST users of our authors' construction as FedProx's JSON files.

The thesis authors' public script (FAACL/FAACL, ``test-FAACL.py``) reads MNIST from
``data/mnist/data/{train,test}/*.json``, the files FedProx's generator writes: keys
``users`` and ``user_data`` (``{"x": [[784 floats]], "y": [ints]}`` a user), pixels
standardised per pixel over all 70k images. This writes the same 1000 users that
``clusterfed.scenarios.authors`` builds (same standardisation, same power-law draw,
``--data-seed`` 0 by default), so their script and ours run on one federation and
their grouping, noise and validation split (their ``read_data.py`` / ``actor.py``) are
applied by their own code. Used by ``run_authors_faacl.py``.

    .venv/bin/python benchmarks/authors_code/export_fedprox_json.py --out /tmp/authors_run/data/mnist/data
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from clusterfed.data.datasets import load_dataset
from clusterfed.scenarios.authors import DATA_SEED, default_users, fedprox_users, standardise


def export(root: str, out: Path, data_seed: int = DATA_SEED, decimals: int = 6) -> dict:
    """Write ``out/train/train.json`` and ``out/test/test.json``; returns their sizes."""
    ds = load_dataset("mnist", root=root)
    x_all = np.concatenate([ds.x_train, ds.x_test])
    y_all = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    x_all = standardise(x_all).reshape(len(x_all), -1).round(decimals)
    users = fedprox_users(y_all, default_users("mnist"), ds.n_classes, np.random.default_rng(data_seed))
    sizes = {}
    for split, part in (("train", 0), ("test", 1)):
        names = [f"f_{u:05d}" for u in range(len(users))]
        data = {
            name: {"x": x_all[idx[part]].tolist(), "y": y_all[idx[part]].tolist()}
            for name, idx in zip(names, users)
        }
        path = out / split / f"{split}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump({"users": names, "num_samples": [len(idx[part]) for idx in users], "user_data": data}, f)
        tmp.replace(path)
        sizes[split] = int(sum(len(idx[part]) for idx in users))
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets", help="folder holding MNIST's IDX files")
    ap.add_argument("--out", required=True, type=Path, help="the checkout's data/mnist/data folder")
    ap.add_argument("--data-seed", type=int, default=DATA_SEED)
    args = ap.parse_args()
    print(export(args.root, args.out, args.data_seed))


if __name__ == "__main__":
    main()
