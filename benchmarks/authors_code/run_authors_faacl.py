"""Run the thesis authors' own FAACL script on our authors' construction's data.

A differential check of issue 13: does the authors' public code (FAACL/FAACL,
``test-FAACL.py``, a checkout given by ``--checkout``) give the thesis' FAACL clusters
(A1: 4, A2: 5, Tables 3.5–3.6) on the federation we build? ``export_fedprox_json.py``
writes the FedProx users into ``<checkout>/data/mnist/data``; their ``read_data.py``
then groups, relabels and corrupts them and their ``actor.py`` splits off validation,
exactly as in their runs.

Nothing of their algorithm is changed. What is changed, and why:

- **Python 3.11 / NumPy 2 / TensorFlow 2.21.** Their pins (TF 2.6, NumPy 1.19,
  scikit-image 0.15) do not install here. ``tf.keras`` is Keras 2 (``tf_keras``,
  ``TF_USE_LEGACY_KERAS=1``) as in their TF 2.6; ``np.float`` (removed in NumPy 1.24)
  is ``float``.
- **scikit-image 0.15's ``random_noise``** (their pin; 0.26 replaced ``seed`` by a
  ``Generator``): ``mode="gaussian"`` adds ``RandomState(seed).normal(mean, √var)``;
  ``mode="s&p"`` draws ``flipped`` then ``salted`` by ``RandomState(seed).choice``;
  both clip to [−1, 1] when the image has a negative value (pepper −1), else [0, 1].
- **Per-sample validation losses in one pass.** Their support test calls Keras
  ``evaluate`` once per validation sample (``val_locally(list_form=True)``): about
  10⁴ calls per cluster model, days on two cores. The same numbers come from one
  forward pass of the validation set in NumPy: the cross-entropy from the logits (as
  Keras' graph-mode loss takes it from a softmax output) plus the L2 penalty
  0.001·Σ‖kernel‖² that ``evaluate`` adds to every loss, and 0/1 accuracies.
- ``--rounds`` caps the training rounds after clustering (their ``--numround``).

The clustering they print after "Preprocessing finished" is parsed into
``<out>.json`` (clusters with their devices and supporters), beside their log.

    /work/tfenv/bin/python benchmarks/authors_code/run_authors_faacl.py --checkout /work/authors_run \
        --group 6 --epsilon 0.5 --seed 10 --rounds 1 --out benchmarks/out/authors_code/a1_eps0.5_seed10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import runpy
import sys
import time
from pathlib import Path

SCENARIO_OF_GROUP = {2: "S2", 3: "S1", 6: "A1", 8: "A2"}
L2 = 0.001  # their MLP's kernel_regularizer (flearn/model/mnist/mlp.py)


def legacy_tensorflow(threads: int):
    """TensorFlow with Keras 2 (their TF 2.6's ``tf.keras``) on ``threads`` threads; NumPy's ``np.float``."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    np.float = float  # removed in NumPy 1.24; their Cluster.train and FlexCFL's weighted_aggregate use it
    return tf


def skimage015_random_noise(image, mode="gaussian", seed=None, clip=True, **kwargs):
    """scikit-image 0.15's ``util.random_noise`` for the two modes their A1 uses."""
    import numpy as np

    image = np.asarray(image, dtype=np.float64)
    low = -1.0 if image.min() < 0 else 0.0
    rs = np.random.RandomState(seed)
    if mode == "gaussian":
        out = image + rs.normal(kwargs.get("mean", 0.0), kwargs.get("var", 0.01) ** 0.5, image.shape)
    elif mode == "s&p":
        amount, q = kwargs.get("amount", 0.05), kwargs.get("salt_vs_pepper", 0.5)
        out = image.copy()
        flipped = rs.choice([True, False], size=image.shape, p=[amount, 1 - amount])
        salted = rs.choice([True, False], size=image.shape, p=[q, 1 - q])
        out[flipped & salted] = 1.0
        out[flipped & ~salted] = low
    else:
        raise ValueError(f"mode {mode!r} is not used by the authors' MNIST scenarios")
    return np.clip(out, low, 1.0) if clip else out


def batched_val_locally(self, list_form=False):
    """``Actor.val_locally`` with the per-sample losses of one forward pass."""
    import numpy as np

    n = self.val_data["y"].shape[0]
    if n == 0:
        return 0, 0, 0
    if not list_form:
        backup = self.get_params()
        self.set_params(self.latest_params)
        loss, acc = self.model.evaluate(self.val_data["x"], self.val_data["y"], verbose=0)
        self.set_params(backup)
        return n, acc, loss
    w1, b1, w2, b2 = (np.asarray(w, dtype=np.float64) for w in self.latest_params)
    x = np.asarray(self.val_data["x"], dtype=np.float64)
    y = np.asarray(self.val_data["y"], dtype=np.int64)
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    top = logits.max(1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(1))
    penalty = L2 * (float((w1**2).sum()) + float((w2**2).sum()))
    loss = (log_z - logits[np.arange(n), y] + penalty).tolist()
    acc = (logits.argmax(1) == y).astype(float).tolist()
    return n, acc, loss


def parse_clustering(log: str) -> list[dict]:
    """The clusters printed after "Preprocessing finished": devices and supporters."""
    tail = log.split("Preprocessing finished", 1)[1]
    clusters, lines = [], tail.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("Cluster Members:"):
            devices = json.loads(lines[i + 1])
            sup = []
            j = i + 3  # skip the "Supportive Clusters:" header
            while j < len(lines) and lines[j].startswith("["):
                sup.append(sorted(json.loads(lines[j])))
                j += 1
            clusters.append({"devices": sorted(devices), "supporters": sup})
            i = j
        elif lines[i].startswith("Round"):
            break
        else:
            i += 1
    return clusters


class Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", required=True, type=Path, help="a checkout of FAACL/FAACL with data/mnist")
    ap.add_argument("--group", type=int, required=True, choices=sorted(SCENARIO_OF_GROUP),
                    help="their scenario number: 3 S1, 2 S2, 6 A1, 8 A2")
    ap.add_argument("--epsilon", type=float, required=True, help="their --epsilon_wx (Table B.1: A1 0.5, A2 0.4)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=None, help="training rounds after clustering (their 300)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, type=Path, help="prefix of the .log and .json written")
    args = ap.parse_args()

    tf = legacy_tensorflow(args.threads)

    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout))
    import flearn.actor
    import utils.read_data

    utils.read_data.random_noise = skimage015_random_noise
    flearn.actor.Actor.val_locally = batched_val_locally

    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = Path(f"{args.out}.log")  # not with_suffix: "eps0.4" holds a dot
    argv = ["test-FAACL.py", "--dataset", "mnist", "--group", str(args.group), "--epsilon_wx", str(args.epsilon),
            "--seed", str(args.seed)]
    if args.rounds is not None:
        argv += ["--numround", str(args.rounds)]
    # their script saves each device's initial model under this folder without creating it
    model_dir = checkout.parent / "results" / "mnist" / "FAACL" / f"group_{args.group}" / "local_training50"
    (model_dir / f"seed{args.seed}" / "model").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cwd = os.getcwd()
    with open(log_path, "w") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        os.chdir(checkout)
        sys.argv = argv
        try:
            runpy.run_path(str(checkout / "test-FAACL.py"), run_name="__main__")
        finally:
            os.chdir(cwd)
    clusters = parse_clustering(log_path.read_text())
    n = max(max(c["devices"]) for c in clusters) + 1
    noisy = set(range(0, n, 2))  # their changed concept: even devices
    summary = {
        "scenario": SCENARIO_OF_GROUP[args.group], "group": args.group, "epsilon": args.epsilon,
        "seed": args.seed, "rounds": args.rounds, "n_clusters": len(clusters),
        "clusters": [{**c, "changed_devices": sum(d in noisy for d in c["devices"])} for c in clusters],
        "wall_s": round(time.time() - t0, 1), "tensorflow": tf.__version__,
    }
    Path(f"{args.out}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "clusters"}))


if __name__ == "__main__":
    main()
