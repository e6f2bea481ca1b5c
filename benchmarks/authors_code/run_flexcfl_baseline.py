"""Run FlexCFL's own baseline trainers, as the thesis' ``test-baseline.py`` calls them, on our data.

A differential check of issue 14, the way ``run_authors_faacl.py`` checks FAACL: does
the public code behind the thesis' baseline rows (Tables 3.3–3.6) give their figures on
the federation our authors' construction builds? The thesis' ``test-baseline.py``
(FAACL/FAACL) imports ``flearn.trainer.{fedavg,fesem,fedgroup,ifca,fedsoft}``, which the
FAACL repository does not ship. FlexCFL (morningD/FlexCFL, the code FAACL's ``flearn``
comes from) ships every one of them but FedSoft; its group trainers (FeSEM, FedGroup,
IFCA) run here. This script runs ``test-baseline.py``'s
``main`` from a FAACL checkout (``--checkout``: their ``read_data.py`` groups, relabels and
corrupts our users, their ``flearn`` actors) with the trainer modules of a FlexCFL
checkout (``--flexcfl``) put under ``flearn.trainer``. Nothing is copied from either.

What is changed, and why, and nothing else:

- the Python 3.11 / NumPy 2 / TensorFlow 2.21 shims of ``run_authors_faacl.py`` (Keras 2
  through ``tf_keras``, ``np.float``, scikit-image 0.15's ``random_noise``);
- FlexCFL's ``GroupBase`` reads data with ``read_federated_data(dataset)``, FlexCFL's
  signature; FAACL's reader takes the scenario as ``group=``, so the call is given
  ``--group`` (the thesis' trainers, unpublished, must do the same);
- **Their MLP's ``fit`` and ``evaluate`` in NumPy** (``--keras`` keeps Keras'): Keras steps
  one batch of 10 in about 2.5 ms here, 40 s a round, 3.3 hours for the 300 rounds. The
  NumPy version takes the same steps: plain SGD at their rate on batches of 10 drawn
  from a fresh shuffle every epoch (Keras' ``shuffle=True``; the order comes from NumPy's
  seeded global generator, not TensorFlow's), the loss being the mean cross-entropy of
  the softmax plus their 0.001·Σ‖kernel‖², in float32. ``--check-fit`` compares the two
  on one client without shuffling (same order, so the same weights up to rounding);
- FAACL's ``ResultWriter.write_row`` adds a ``time`` list that FlexCFL's trainers do not
  pass (``result + None`` raises), so the per-round summaries are recorded here instead
  of in their Excel file.

The figure is their "Test(Complete) ACC": test accuracy over all test samples of the
clients in the groups (each group's model on its clients), the thesis' figure. Written
to ``<out>.json`` with every round's figure, the final groups (devices, and how many
of them carry the changed concept), and ARI against the ground truth; their log beside it.

    /work/tfenv/bin/python benchmarks/authors_code/run_flexcfl_baseline.py --checkout /work/authors_run \
        --flexcfl /tmp/flexcfl --trainer fesem --group 8 --cluster 5 --seed 10 \
        --out benchmarks/out/authors_code/a2_fesem_k5_seed10
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_authors_faacl import SCENARIO_OF_GROUP, Tee, legacy_tensorflow, skimage015_random_noise  # noqa: E402

# FlexCFL's group trainers (GroupBase). Its fedavg.py reads data and writes results on its own
# and tests only the round's sampled clients, so it is not run here.
TRAINERS = ("fesem", "fedgroup", "ifca")


class Recorder:
    """Stands in for FAACL's ``ResultWriter``: keeps each round's summary in memory."""

    rows: list[dict] = []

    def __init__(self, *args, **kwargs):
        Recorder.rows = []

    def write_summary(self, round, train_summary, test_summary, diffs, schedule_results=None, **kwargs):
        _, test_acc, _ = test_summary["Total"]
        groups = {k: {"test_acc": v[0], "test_samples": v[2]} for k, v in test_summary.items() if k != "Total"}
        Recorder.rows.append({"round": round, "test_acc": test_acc, "groups": groups})


L2 = 0.001  # their MLP's kernel_regularizer (flearn/model/mnist/mlp.py)


class _History:
    def __init__(self, history: dict):
        self.history = history


def numpy_mlp(model) -> None:
    """Give their Keras MLP (784-128-10, ReLU, softmax) a NumPy ``fit`` and ``evaluate``."""
    import numpy as np

    lr = np.float32(float(model.optimizer.learning_rate.numpy()))

    def forward(w, x):
        h = np.maximum(x @ w[0] + w[1], 0)
        z = h @ w[2] + w[3]
        z = z - z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        return h, p

    def penalty(w):
        return L2 * (float((w[0].astype(np.float64) ** 2).sum()) + float((w[2].astype(np.float64) ** 2).sum()))

    def fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=True, **kwargs):
        w = [np.array(v, dtype=np.float32) for v in model.get_weights()]
        x = np.asarray(x, dtype=np.float32)
        y = np.asarray(y, dtype=np.int64)
        n = len(y)
        losses, accs = [], []
        for _ in range(epochs):
            order = np.random.permutation(n) if shuffle else np.arange(n)
            loss_sum, correct = 0.0, 0
            for s in range(0, n, batch_size):
                idx = order[s:s + batch_size]
                xb, yb = x[idx], y[idx]
                h, p = forward(w, xb)
                rows = np.arange(len(idx))
                loss_sum += float(-np.log(np.maximum(p[rows, yb], 1e-7)).sum())
                correct += int((p.argmax(1) == yb).sum())
                g = p
                g[rows, yb] -= 1
                g /= np.float32(len(idx))
                gw2 = h.T @ g + np.float32(2 * L2) * w[2]
                gb2 = g.sum(0)
                gh = (g @ w[2].T) * (h > 0)
                gw1 = xb.T @ gh + np.float32(2 * L2) * w[0]
                gb1 = gh.sum(0)
                for v, gv in zip(w, (gw1, gb1, gw2, gb2)):
                    v -= lr * gv
            losses.append(loss_sum / n + penalty(w))  # reported only: the penalty at the epoch's end
            accs.append(correct / n)
        model.set_weights(w)
        return _History({"loss": losses, "accuracy": accs})

    def evaluate(x, y, verbose=0, **kwargs):
        w = [np.asarray(v, dtype=np.float32) for v in model.get_weights()]
        y = np.asarray(y, dtype=np.int64)
        _, p = forward(w, np.asarray(x, dtype=np.float32))
        loss = float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-7)).mean()) + penalty(w)
        return [loss, float((p.argmax(1) == y).mean())]

    model.fit, model.evaluate = fit, evaluate


def check_fit(construct_model, x, y) -> dict:
    """Keras' ``fit`` against ``numpy_mlp``'s from the same weights, same batch order."""
    import numpy as np

    keras_model = construct_model("fesem", 0.01)
    numpy_model = construct_model("fesem", 0.01)
    numpy_model.set_weights(keras_model.get_weights())
    numpy_mlp(numpy_model)
    keras_model.fit(x, y, 10, 10, verbose=0, shuffle=False)
    numpy_model.fit(x, y, 10, 10, shuffle=False)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(keras_model.get_weights(), numpy_model.get_weights()))
    scale = max(float(np.abs(a).max()) for a in keras_model.get_weights())
    k_eval, n_eval = keras_model.evaluate(x, y, verbose=0), numpy_model.evaluate(x, y)
    return {"samples": len(y), "max_abs_weight_diff": diff, "max_abs_weight": scale,
            "keras_evaluate": k_eval, "numpy_evaluate": n_eval}


def adjusted_rand(labels_true: list[int], labels_pred: list[int]) -> float:
    """ARI without scikit-learn (not in the TF venv)."""
    from collections import Counter
    from math import comb

    n = len(labels_true)
    pairs = Counter(zip(labels_true, labels_pred))
    index = sum(comb(v, 2) for v in pairs.values())
    a = sum(comb(v, 2) for v in Counter(labels_true).values())
    b = sum(comb(v, 2) for v in Counter(labels_pred).values())
    expected = a * b / comb(n, 2)
    top = (a + b) / 2
    return 1.0 if top == expected else (index - expected) / (top - expected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", required=True, type=Path, help="a checkout of FAACL/FAACL with data/mnist")
    ap.add_argument("--flexcfl", required=True, type=Path, help="a checkout of morningD/FlexCFL")
    ap.add_argument("--trainer", required=True, choices=TRAINERS)
    ap.add_argument("--group", type=int, required=True, choices=sorted(SCENARIO_OF_GROUP),
                    help="their scenario number: 3 S1, 2 S2, 6 A1, 8 A2")
    ap.add_argument("--cluster", type=int, default=2, help="test-baseline.py's --cluster (their default 2)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=None, help="cap on rounds (their TrainConfig: 300)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keras", action="store_true", help="train and test with Keras, not the NumPy MLP")
    ap.add_argument("--check-fit", action="store_true", help="compare Keras' fit with the NumPy one and stop")
    ap.add_argument("--out", required=True, type=Path, help="prefix of the .log and .json written")
    args = ap.parse_args()

    tf = legacy_tensorflow(args.threads)
    import numpy as np

    checkout, flexcfl = args.checkout.resolve(), args.flexcfl.resolve()
    if not (flexcfl / "flearn" / "trainer" / f"{args.trainer}.py").is_file():
        sys.exit(f"--flexcfl {flexcfl}: no flearn/trainer/{args.trainer}.py there")
    sys.path.insert(0, str(checkout))
    import flearn  # FAACL's actors (a namespace package: no __init__.py)
    import utils.read_data
    import utils.trainer_utils

    if (checkout / "flearn" / "trainer").exists():
        sys.exit(f"--checkout {checkout} has its own flearn/trainer; this check takes FlexCFL's")
    flearn.__path__.append(str(flexcfl / "flearn"))  # flearn.trainer.* from FlexCFL
    utils.read_data.random_noise = skimage015_random_noise
    import flearn.trainer.groupbase as groupbase

    groupbase.read_federated_data = functools.partial(utils.read_data.read_federated_data, group=args.group)
    import flearn.model.mnist.mlp as mlp

    if args.check_fit:
        _, train, _ = utils.read_data.read_federated_data("mnist", group=args.group)
        first = train[min(train)]
        print(json.dumps(check_fit(mlp.construct_model, first["x"], first["y"])))
        return
    if not args.keras:
        keras_construct = mlp.construct_model

        def construct(*a, **k):
            model = keras_construct(*a, **k)
            numpy_mlp(model)
            return model

        mlp.construct_model = construct
    groupbase.ResultWriter = Recorder
    if args.rounds is not None:
        init = utils.trainer_utils.TrainConfig.__init__

        def capped(self, *a, **k):
            init(self, *a, **k)
            self.trainer_config["num_rounds"] = args.rounds

        utils.trainer_utils.TrainConfig.__init__ = capped

    # test-baseline.py imports flearn.trainer.fedsoft, which FlexCFL does not ship: run its main alone
    source = (checkout / "test-baseline.py").read_text().replace("from flearn.trainer.fedsoft import FedSoft\n", "")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log_path = Path(f"{args.out}.log")
    t0 = time.time()
    cwd = os.getcwd()
    namespace: dict = {"__name__": "test_baseline"}
    with open(log_path, "w") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        os.chdir(checkout)
        try:
            exec(compile(source, str(checkout / "test-baseline.py"), "exec"), namespace)
            trainer_box: dict = {}
            cls = {"fesem": "FeSEM", "fedgroup": "FedGroup", "ifca": "IFCA"}[args.trainer]
            original = namespace[cls].train

            def keep(self):  # keep the trainer to read its groups afterwards
                trainer_box["t"] = self
                return original(self)

            namespace[cls].train = keep
            namespace["main"](dataset="mnist", model="mlp", trainer=args.trainer, glr=0, dynamic=False, swap_p=0,
                              shift_type=None, RAC=False, RCC=False, group=args.group, swap_label=0,
                              seed=args.seed, cluster=args.cluster)
        finally:
            os.chdir(cwd)
    trainer = trainer_box["t"]
    n = len(trainer.clients)
    changed = set(range(0, n, 2))  # their changed concept: even devices (as in run_authors_faacl.py)
    summary: dict = {
        "trainer": args.trainer, "scenario": SCENARIO_OF_GROUP[args.group], "group": args.group,
        "cluster": args.cluster, "seed": args.seed, "rounds": len(Recorder.rows),
        "mlp": "keras" if args.keras else "numpy",
    }
    assigned = [c.uplink[0].id if c.has_uplink() else -1 for c in trainer.clients]
    ids = sorted(set(assigned))
    summary["clusters"] = [
        {"group": g, "devices": [i for i, a in enumerate(assigned) if a == g],
         "changed_devices": sum(1 for i, a in enumerate(assigned) if a == g and i in changed)} for g in ids]
    summary["n_clusters"] = len(ids)
    summary["ari"] = round(adjusted_rand([int(i in changed) for i in range(n)], assigned), 4)
    complete = [r for r in Recorder.rows if r["round"] >= n / min(trainer.clients_per_round, n)]
    summary["final_test_acc"] = complete[-1]["test_acc"] if complete else None
    summary["max_test_acc"] = max(r["test_acc"] for r in complete) if complete else None
    summary["mean_last10_test_acc"] = float(np.mean([r["test_acc"] for r in complete[-10:]])) if complete else None
    summary["wall_s"] = round(time.time() - t0, 1)
    summary["tensorflow"] = tf.__version__
    summary["per_round"] = [{"round": r["round"], "test_acc": r["test_acc"]} for r in Recorder.rows]
    Path(f"{args.out}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("clusters", "per_round")}))


if __name__ == "__main__":
    main()
