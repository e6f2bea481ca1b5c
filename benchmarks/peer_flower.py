"""The same FedAvg job in Flower's simulation engine and in clusterfed (issue 17 item 6).

Job: MNIST (real, ``../shared/datasets/MNIST/raw``), the 60 000 training images split
IID into ``n`` equal clients (n = 20: 3000 each; n = 100: 600 each), MLP 784-128-10,
plain SGD lr 0.01 (no L2), batch 10, one local epoch, every client every round,
sample-weighted averaging, the global model's accuracy on the 10 000 test images
evaluated every round on the server. Both start from the same initial model.

- Flower: ``flwr[simulation]`` 1.41 (Ray backend), Message API (``ClientApp`` with a
  ``@train`` function, ``ServerApp`` with ``flwr.serverapp.strategy.FedAvg`` and a
  server-side ``evaluate_fn``); one Ray actor per core (``num_cpus: 1`` per client),
  one torch thread per actor; each client caches the data set once per actor.
  It runs in its own venv (``--flower-python``, default /work/flwr-venv/bin/python;
  flwr is NOT a clusterfed dependency): ``python -m venv /work/flwr-venv &&
  /work/flwr-venv/bin/pip install "flwr[simulation]" torch==2.13.0``.
- clusterfed: ``FedAvg(rounds=R).fit(engine)`` (the registered method, the driver's
  per-round test accuracy included), torch with ``--threads`` threads, once per
  ``--kernels`` entry: ``dense`` (the default engine) and ``sparse``
  (``Engine(sparse_inputs=True)``, params.yaml ``training.sparse_inputs: true``).

Both run R + 1 rounds; round time = wall time between two server-side evaluations
(Flower) / two rounds' ends (clusterfed: history row, i.e. its test accuracy, included);
round 1 is dropped for both (Flower's includes Ray's start); accuracy after R + 1 rounds.
Each repetition runs Flower then clusterfed back to back, for each n;
medians over repetitions; ``/proc/loadavg`` before and after each run.

    .venv/bin/python benchmarks/peer_flower.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

LR, BATCH, HIDDEN = 0.01, 10, 128
OUT = Path(__file__).parent / "out"


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --------------------------------------------------------------------------- Flower side
def flower_main(args) -> None:
    """Runs inside the Flower venv: no clusterfed import."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    data_path, n_clients = args.data, args.clients

    def net() -> nn.Module:
        return nn.Sequential(nn.Linear(784, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))

    cache: dict = {}

    def partition(i: int):
        if "x" not in cache:
            z = np.load(data_path)
            cache["x"], cache["y"] = torch.as_tensor(z["x_train"]), torch.as_tensor(z["y_train"])
            torch.set_num_threads(1)
        size = len(cache["y"]) // n_clients
        return cache["x"][i * size : (i + 1) * size], cache["y"][i * size : (i + 1) * size]

    client = ClientApp()

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        x, y = partition(int(context.node_config["partition-id"]))
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        order = torch.randperm(len(y))
        for s in range(0, len(y), BATCH):
            idx = order[s : s + BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        return Message(
            RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(y)})}),
            reply_to=msg,
        )

    z = dict(np.load(data_path))
    x_test, y_test = torch.as_tensor(z["x_test"]), torch.as_tensor(z["y_test"])
    init = {k: torch.as_tensor(z[f"init_{k}"]) for k in ("0.weight", "0.bias", "2.weight", "2.bias")}
    stamps, accuracy = [], []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = net()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            acc = float((model(x_test).argmax(1) == y_test).float().mean())
        stamps.append(time.perf_counter())
        accuracy.append(acc)
        return MetricRecord({"accuracy": acc})

    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n_clients,
                          min_available_nodes=n_clients)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(init), num_rounds=args.rounds, evaluate_fn=evaluate)

    t0 = time.perf_counter()
    run_simulation(
        server_app=server, client_app=client, num_supernodes=n_clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": args.threads}},
    )
    rounds = np.diff(stamps).tolist()  # stamps[0]: before round 1
    print(json.dumps({"round_s": rounds, "accuracy": accuracy[-1], "total_s": time.perf_counter() - t0}))


# ----------------------------------------------------------------------- clusterfed side
def clusterfed_run(data_path: str, n_clients: int, rounds: int, threads: int, workers: int | None = None,
                   sparse: bool = False) -> dict:
    import torch

    from clusterfed.algorithms.baselines import FedAvg
    from clusterfed.engine import Engine, TrainingConfig
    from clusterfed.scenarios.federation import DeviceSplits, Federation

    torch.set_num_threads(threads)
    z = dict(np.load(data_path))  # read each array once
    tr, te = len(z["y_train"]) // n_clients, len(z["y_test"]) // n_clients
    empty = np.zeros((0, 784), np.float32)
    devices = tuple(
        DeviceSplits(z["x_train"][i * tr : (i + 1) * tr], z["y_train"][i * tr : (i + 1) * tr], empty,
                     np.zeros(0, np.int64), z["x_test"][i * te : (i + 1) * te], z["y_test"][i * te : (i + 1) * te])
        for i in range(n_clients)
    )
    fed = Federation(devices, np.zeros(n_clients, np.int64), 10, (784,), "iid", "mnist", 0)
    engine = Engine(fed, hidden=HIDDEN, device="cpu", training=TrainingConfig(lr=LR, l2=0.0, batch_size=BATCH),
                    workers=workers, sparse_inputs=sparse)
    init = {"hidden.weight": "0.weight", "hidden.bias": "0.bias", "output.weight": "2.weight", "output.bias": "2.bias"}
    θ0 = {k: torch.as_tensor(z[f"init_{v}"])[None] for k, v in init.items()}

    stamps: list[float] = []

    class Timed(FedAvg):  # the same initial model as Flower's; a time stamp per round
        def init(self, engine, ctx):
            stamps.append(time.perf_counter())
            return super().init(engine, ctx).with_params(θ0)

        def recluster(self, engine, state, ctx):  # called once per round, after the history row
            stamps.append(time.perf_counter())
            return state

    t0 = time.perf_counter()
    result = Timed(rounds=rounds).fit(engine, seed=1)
    wall = time.perf_counter() - t0
    return {"round_s": np.diff(stamps).tolist(), "accuracy": float(result.history[-1]["accuracy"]), "total_s": wall,
            "params": result.params}


# ---------------------------------------------------------------------------- driver
def prepare(root: str, seed: int) -> Path:
    import torch

    from clusterfed.data import load_dataset
    from clusterfed.models import build_model

    ds = load_dataset("mnist", root)
    rng = np.random.default_rng(seed)
    tr, te = rng.permutation(len(ds.y_train)), rng.permutation(len(ds.y_test))
    torch.manual_seed(seed)  # before the model is drawn: the same initial model in every process
    net = build_model("mlp", (784,), 10, hidden=HIDDEN)
    init = {f"init_{a}": p.detach().numpy() for a, p in zip(("0.weight", "0.bias", "2.weight", "2.bias"), net.parameters())}
    path = OUT / "peer_flower_data.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=ds.x_train[tr].reshape(len(tr), -1), y_train=ds.y_train[tr].astype(np.int64),
             x_test=ds.x_test[te].reshape(len(te), -1), y_test=ds.y_test[te].astype(np.int64), **init)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--clients", type=int, nargs="+", default=[20, 100])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, help="clusterfed's Engine(workers=): chunks trained at once "
                    "(default: --threads; 1 = the former chunk-after-chunk loop on --threads intra-op threads)")
    ap.add_argument("--kernels", nargs="+", choices=["dense", "sparse"], default=["dense", "sparse"],
                    help="clusterfed's MLP kernels, run back to back after Flower in each repetition")
    ap.add_argument("--flower-python", default="/work/flwr-venv/bin/python")
    ap.add_argument("--flower", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(OUT / "peer_flower.json"))
    args = ap.parse_args()
    if args.flower:
        args.clients = args.clients[0]
        flower_main(args)
        return

    data = prepare(args.root, seed=10)
    runs = []
    for rep in range(args.reps):
        for n in args.clients:
            load = loadavg()
            cmd = [args.flower_python, __file__, "--flower", "--data", str(data), "--clients", str(n),
                   "--rounds", str(args.rounds + 1), "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
            if proc.returncode:
                sys.exit(f"Flower run failed:\n{proc.stderr[-4000:]}")
            flower = json.loads(proc.stdout.strip().splitlines()[-1])
            flower["round_s"] = flower["round_s"][1:]  # round 1 includes Ray's start
            row = {"rep": rep, "clients": n, "load_before": load, "flower": flower}
            for kernel in args.kernels:
                ours = clusterfed_run(str(data), n, args.rounds + 1, args.threads, args.workers, kernel == "sparse")
                ours.pop("params")
                ours["round_s"] = ours["round_s"][1:]  # round 1: the sparse kernel's compile, data layout
                row["clusterfed" if kernel == "dense" else f"clusterfed_{kernel}"] = ours
            row["load_after"] = loadavg()
            runs.append(row)
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for n in args.clients:
        mine = [r for r in runs if r["clients"] == n]
        f = statistics.median(statistics.median(r["flower"]["round_s"]) for r in mine)
        summary[n] = {"flower_round_s": f, "flower_accuracy": [r["flower"]["accuracy"] for r in mine],
                      "loads": [(r["load_before"], r["load_after"]) for r in mine]}
        for key in [k for k in mine[0] if k.startswith("clusterfed")]:
            c = statistics.median(statistics.median(r[key]["round_s"]) for r in mine)
            summary[n].update({f"{key}_round_s": c, f"{key}_ratio": f / c,
                               f"{key}_accuracy": [r[key]["accuracy"] for r in mine]})
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rounds": args.rounds,
              "threads": args.threads, "runs": runs, "summary": summary}
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
