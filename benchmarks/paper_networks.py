"""FLACC's and StoCFL's rotated MNIST with the papers' own networks, in resumable chunks (issue 17, item 4).

On this CPU a full run takes hours (RESULTS.md §11), so the cold-start driver is run a
chunk at a time: each invocation resumes from ``<out>/<experiment>/seed_<s>/checkpoint.pt``
(the method's state, the numpy and torch generators and the rounds done), runs until
``--chunk-rounds`` rounds or ``--max-seconds`` have passed (checked between rounds), saves
the checkpoint and appends the chunk's rounds to ``curve.jsonl`` (round, phase, accuracy,
clusters, seconds since the chunk began) and one line to ``chunks.jsonl`` (wall and CPU
seconds, rounds, load). A resumed run draws the same samples and trains the same models
as an uninterrupted one (``--check``: 2 + 2 rounds against 4 with the thesis MLP).
When the method's own rounds are done, ``final.json`` holds accuracy, clusters and ARI.

Experiments (settings of ``seed_methods_mnist.py``, with ``--model paper``):

- ``flacc_rotated``: FLACC §V-A/B, rotated MNIST, 100 clients, 20 % a round, E = 5,
  B = 32, lr 0.1, the paper's CNN (5×5 convolutions 32/64, FC 512); paper 97.92 %.
- ``stocfl_rotated_4800``: StoCFL Table 1's largest setting, N = 4800, |D| = 50, 10 % a
  round, 100 rounds, the 784-2048-10 MLP, the paper's settings (τ 0.5, λ 0.05, 5
  full-batch local epochs at lr 0.1); paper 97.00 % (62 CPU s a round here).
- ``stocfl_rotated_authors``: StoCFL Table 1, rotated MNIST, N = 1200, |D| = 200, 10 %
  a round, the 784-2048-10 MLP, lr 0.1, no weight decay, with the authors' README
  settings (τ 0.65, λ 0.05, 5 local epochs at batch 50, Ψ = the anchor's movement after
  20 epochs at batch 50); paper 96.71 %.

    nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python \\
        benchmarks/paper_networks.py --experiment flacc_rotated --seed 10 --max-seconds 6600
    .venv/bin/python benchmarks/paper_networks.py --experiment flacc_rotated --seed 10 --summarize
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch

from seed_methods_mnist import EXPERIMENTS, params_for

ALGORITHM = {"flacc_rotated": "flacc", "stocfl_rotated_authors": "stocfl", "stocfl_rotated_authors_e20": "stocfl",
             "stocfl_rotated_4800": "stocfl"}
PAPER = {"flacc_rotated": 97.92, "stocfl_rotated_authors": 96.71, "stocfl_rotated_authors_e20": 96.71,
         "stocfl_rotated_4800": 97.00}
# StoCFL Table 1's largest setting (issue 17 item 3; benchmarks/stocfl_scale.py runs it in one go)
N4800 = {"group_sizes": [1200] * 4, "samples_per_device": 50, "test_samples_per_device": 8}
# The authors' README command for their rotated script (dunzeng/StoCFL), RESULTS.md §5.
STOCFL_AUTHORS = {"tau": 0.65, "lam": 0.05, "local_epochs": 5, "batch_size": 50, "representation": "movement"}


def experiment_params(name: str, seed: int, model: str, device: str = "cpu", sparse_inputs: bool = False):
    from clusterfed.config import parse_params

    base = "stocfl_rotated" if name.startswith("stocfl_rotated") else name
    raw = json.loads(params_for(base, seed, device, model).model_dump_json())
    raw["coldstart"]["algorithms"] = [ALGORITHM[name]]
    if name == "stocfl_rotated_4800":  # the paper's StoCFL settings (τ 0.5, λ 0.05, 5 full-batch epochs)
        raw["scenario"].update(N4800)
        raw["training"].update(batch_size=N4800["samples_per_device"])
    if name.startswith("stocfl_rotated_authors"):
        raw["coldstart"]["stocfl"].update(STOCFL_AUTHORS)
        if name.endswith("_e20"):  # the authors' rotated script: 20 local epochs a round (issue 17 item 4)
            raw["coldstart"]["stocfl"]["local_epochs"] = 20
        raw["training"].update(lr=0.1, l2=0.0)
    raw["training"]["sparse_inputs"] = sparse_inputs
    return parse_params(raw, source=f"benchmark {name}")


def run_chunk(name: str, seed: int, out: Path, *, model: str, chunk_rounds: int, max_seconds: float,
              device: str = "cpu", sparse_inputs: bool = False) -> dict:
    """One chunk of the experiment's cold start, resumed from and saved to ``out``."""
    from sklearn.metrics import adjusted_rand_score

    from clusterfed.build import build_algorithm, build_engine, build_federation

    params = experiment_params(name, seed, model, device, sparse_inputs)
    fed = build_federation(params, seed)
    engine = build_engine(params, fed)
    method = build_algorithm(ALGORITHM[name], params)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint.pt"
    resumed = {"done": 0}
    cls = type(method)
    t0, cpu0 = time.perf_counter(), time.process_time()
    ends: list[float] = []

    def init(engine, ctx):
        resumed["ctx"] = ctx
        if not ckpt.exists():
            return cls.init(method, engine, ctx)
        c = torch.load(ckpt, weights_only=False)
        ctx.rng.bit_generator.state = c["rng"]
        ctx.generator.set_state(c["generator"])
        resumed["done"] = c["done"]
        arrays = {k: np.load(out / f"checkpoint_{k}.npy") for k in c["arrays"]}
        return dataclasses.replace(c["state"], **arrays)

    def initial_round(engine, state):
        return None if resumed["done"] else cls.initial_round(method, engine, state)

    def finished(state, done):
        ends.append(time.perf_counter() - t0)
        total = resumed["done"] + done
        if cls.finished(method, state, total):
            resumed["over"] = True
            return True
        if done >= chunk_rounds or (done and time.perf_counter() - t0 > max_seconds):
            ctx = resumed["ctx"]
            # large arrays (StoCFL's per-cluster sums Σ: K × 1.6M floats with the 2048-unit MLP) go to
            # .npy files, written without a pickled copy
            big = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)
                   if isinstance(getattr(state, f.name), np.ndarray) and getattr(state, f.name).nbytes > 2**26}
            for k, v in big.items():
                with open(out / f"checkpoint_{k}.tmp", "wb") as f:
                    np.save(f, v)
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"state": dataclasses.replace(state, **dict.fromkeys(big)), "arrays": list(big),
                        "rng": ctx.rng.bit_generator.state, "generator": ctx.generator.get_state(),
                        "done": total}, tmp)
            for k in big:
                os.replace(out / f"checkpoint_{k}.tmp", out / f"checkpoint_{k}.npy")
            os.replace(tmp, ckpt)
            return True
        return False

    method.init, method.initial_round, method.finished = init, initial_round, finished
    load_before = os.getloadavg()
    result = method.fit(engine, seed=seed, ground_truth=fed.groups)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    start = resumed["done"]
    with (out / "curve.jsonl").open("a") as f:
        for i, row in enumerate(result.history):
            f.write(json.dumps({"round": start + i + 1, "phase": row["phase"], "accuracy": row["accuracy"],
                                "n_clusters": row["n_clusters"], "t_s": round(ends[i + 1], 1)}) + "\n")
    chunk = {"first_round": start + 1, "rounds": len(result.history), "wall_s": round(wall, 1),
             "cpu_s": round(cpu, 1), "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
             "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
             "threads": torch.get_num_threads(), "finished": bool(resumed.get("over")), "sparse_inputs": sparse_inputs,
             "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    with (out / "chunks.jsonl").open("a") as f:
        f.write(json.dumps(chunk) + "\n")
    if resumed.get("over"):
        (out / "final.json").write_text(json.dumps({
            "accuracy": float(result.device_accuracy.mean()), "clusters": int(result.n_clusters),
            "ari": float(adjusted_rand_score(fed.groups, result.model_of_device)), "rounds": start + len(result.history),
        }))
        for f in out.glob("checkpoint*"):
            f.unlink()
    return chunk


def check(args) -> None:
    """A run resumed after 2 rounds equals an uninterrupted 4-round run (thesis MLP)."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp())
    try:
        for chunks, where in (((4,), "straight"), ((2, 2), "resumed")):
            for k in chunks:
                run_chunk(args.experiment, args.seed, tmp / where, model="mlp", chunk_rounds=k, max_seconds=1e9)
        curves = [[(r["round"], r["accuracy"], r["n_clusters"]) for r in map(json.loads,
                   (tmp / w / "curve.jsonl").read_text().splitlines())][:4] for w in ("straight", "resumed")]
        print(curves[0], curves[1], sep="\n")
        assert curves[0] == curves[1], "the resumed run differs"
        print("resumed == straight")
    finally:
        shutil.rmtree(tmp)


def summarize(args) -> None:
    out = Path(args.out) / args.experiment / f"seed_{args.seed}"
    curve = [json.loads(x) for x in (out / "curve.jsonl").read_text().splitlines()]
    chunks = [json.loads(x) for x in (out / "chunks.jsonl").read_text().splitlines()]
    wall, cpu, rounds = (sum(c[k] for c in chunks) for k in ("wall_s", "cpu_s", "rounds"))
    print(f"{args.experiment} seed {args.seed}: {rounds} rounds in {len(chunks)} chunks, {wall:.0f} s wall, "
          f"{cpu:.0f} CPU s ({wall / rounds:.1f} s/round), peak RSS {max(c['peak_rss_gb'] for c in chunks)} GB, "
          f"loads {[c['load_before'][0] for c in chunks]}; paper {PAPER[args.experiment]}")
    marks = sorted({1, 2, 5, *range(10, len(curve) + 1, 10), len(curve)})
    print("| round | " + " | ".join(str(m) for m in marks) + " |")
    print("|---" * (len(marks) + 1) + "|")
    print("| accuracy % | " + " | ".join(f"{100 * curve[m - 1]['accuracy']:.2f}" for m in marks) + " |")
    print("| clusters | " + " | ".join(str(curve[m - 1]["n_clusters"]) for m in marks) + " |")
    if (out / "final.json").exists():
        print("final:", (out / "final.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", required=True, choices=list(ALGORITHM))
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--model", default="paper", choices=["paper", "mlp"])
    p.add_argument("--chunk-rounds", type=int, default=1000, help="rounds in this invocation at most")
    p.add_argument("--max-seconds", type=float, default=6600, help="stop (and checkpoint) after the round that passes this")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--sparse-inputs", action="store_true",
                   help="training.sparse_inputs: the MLP's sparse-input kernel (keep it the same across a run's chunks)")
    p.add_argument("--out", default="benchmarks/out/paper_networks")
    p.add_argument("--check", action="store_true")
    p.add_argument("--summarize", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.summarize:
        return summarize(args)
    if args.check:
        return check(args)
    out = Path(args.out) / args.experiment / f"seed_{args.seed}"
    if (out / "final.json").exists():
        print("done:", (out / "final.json").read_text())
        return
    print(json.dumps(run_chunk(args.experiment, args.seed, out, model=args.model,
                               chunk_rounds=args.chunk_rounds, max_seconds=args.max_seconds, device=args.device,
                               sparse_inputs=args.sparse_inputs)))


if __name__ == "__main__":
    main()
