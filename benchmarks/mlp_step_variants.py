"""Variants of the MLP's batch-10 SGD step, timed against the engine's (issue 17 item 6).

One chunk of M = 10 MNIST MLPs (784-128-10) through 300 SGD steps of batch 10 on real
MNIST images (no weight decay, as the Flower comparison), one thread, CPU time of this
thread (``time.thread_time``: less sensitive than wall time to a loaded machine),
variants interleaved, medians. Every variant's final models are compared with the
engine's (``MLP._sgd_step``).

- ``engine``: ``MLP._sgd_step`` (dense fp32 baddbmm forward, baddbmm_ update).
- ``pruned_union``: per step, only the pixels non-zero in some image of the chunk's
  batches (x·W1ᵀ and W1's gradient are zero elsewhere): index_select / index_copy_.
- ``pruned_model``: per step and model, its batch's non-zero pixels (padded with zero
  pixels to the chunk's largest count): gather / scatter.
- ``sparse_forward``: x·W1ᵀ as ``F.embedding_bag`` over each image's non-zero pixels
  (at most 351 in MNIST), dense update.
- ``bf16_forward``: x·W1ᵀ in bf16 (a bf16 copy of W1 refreshed after each update;
  fp32 master weights, fp32 update); not exact.
- ``deferred_<k>``: W1 updated once per k steps, exactly: step j's hidden layer is
  x_j·W1ᵀ − lr Σ_{i<j} (x_j x_iᵀ) dh_i, from one [M, kB, 784] × [M, 784, 128] product and
  the batches' Gram matrix per window (larger GEMMs, ~20% more FLOPs at k = 5).
- ``narrow_<k>``: the engine's step on the first k pixels only: the most that dropping
  pixels zero on every sample of a chunk's devices could save (the printed counts).

Also printed: the share of the engine step's CPU time per aten op (``torch.profiler``),
and the CPU time of one step's batch gather from 20 devices' padded data ``[20, 3000, 784]``
(``local_sgd``'s layout) by advanced indexing ``x[rows, idx]`` against ``index_select``
on the samples flattened over devices (what ``local_sgd`` does now).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mlp_step_variants.py --reps 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from clusterfed.data import load_dataset
from clusterfed.models import MLP

M, B, H, STEPS, LR = 10, 10, 128, 300, 0.01


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "mlp_step_variants.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    ds = load_dataset("mnist", args.root)
    X = torch.as_tensor(ds.x_train.reshape(len(ds.x_train), -1))
    Y = torch.as_tensor(ds.y_train.astype(np.int64))
    perm = torch.as_tensor(np.random.default_rng(10).permutation(len(Y)))
    X, Y = X[perm], Y[perm]
    nz = X != 0
    counts = {f"{n} clients": int(nz[: M * (len(Y) // n)].any(0).sum()) for n in (20, 100)}
    K = int(nz.sum(1).max())
    NZI = (~nz).to(torch.uint8).argsort(dim=1, stable=True)[:, :K].to(torch.int32).contiguous()
    NZV = X.gather(1, NZI.long()).contiguous()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(Y), (STEPS, M, B), generator=g)
    w = torch.full((M, B), 1.0 / B)
    off = (torch.arange(M, dtype=torch.int32) * 784)[:, None, None]

    def tail(p, x, y, h, update_w1):
        b1, w2, b2 = p["hidden.bias"], p["output.weight"], p["output.bias"]
        d = torch.baddbmm(b2[:, None, :], h, w2.mT).softmax(-1)
        d.scatter_add_(-1, y[..., None], -torch.ones_like(y[..., None], dtype=x.dtype))
        d.mul_(w[..., None])
        dh = torch.bmm(d, w2).mul_(h > 0)
        w2.baddbmm_(d.mT, h, alpha=-LR)
        update_w1(dh)
        b2.sub_(d.sum(1), alpha=LR)
        b1.sub_(dh.sum(1), alpha=LR)

    def deferred(p, k):
        w1, b1, w2, b2 = (p[n] for n in ("hidden.weight", "hidden.bias", "output.weight", "output.bias"))
        dh_all = torch.empty(M, k * B, H)
        for s0 in range(0, STEPS, k):
            kk = min(k, STEPS - s0)
            r = idx[s0 : s0 + kk].transpose(0, 1).reshape(M, kk * B)
            xw, yw = X[r], Y[r]
            a, gram, dh_w = torch.bmm(xw, w1.mT), torch.bmm(xw, xw.mT), dh_all[:, : kk * B]
            for j in range(kk):
                rows = slice(j * B, (j + 1) * B)
                h = a[:, rows] if not j else torch.baddbmm(a[:, rows], gram[:, rows, : j * B], dh_w[:, : j * B], alpha=-LR)
                h = (h + b1[:, None, :]).relu_()
                y = yw[:, rows]
                d = torch.baddbmm(b2[:, None, :], h, w2.mT).softmax(-1)
                d.scatter_add_(-1, y[..., None], -torch.ones_like(y[..., None], dtype=h.dtype))
                d.mul_(w[..., None])
                dh = torch.bmm(d, w2).mul_(h > 0)
                dh_w[:, rows] = dh
                w2.baddbmm_(d.mT, h, alpha=-LR)
                b2.sub_(d.sum(1), alpha=LR)
                b1.sub_(dh.sum(1), alpha=LR)
            w1.baddbmm_(dh_w.mT, xw, alpha=-LR)

    narrow = sorted(set(counts.values()))
    narrow_x = {784: X, **{k: X[:, :k].contiguous() for k in narrow}}  # copied once, outside the timings

    def engine(p, cols=784):
        Xc = narrow_x[cols]
        for s in range(STEPS):
            MLP._sgd_step(p, Xc[idx[s]], Y[idx[s]], w, lr=LR, l2=0.0)

    def transposed(fn):
        def run(p):
            w1t = p["hidden.weight"].transpose(1, 2).contiguous()
            fn(p, w1t)
            p["hidden.weight"].copy_(w1t.transpose(1, 2))
        return run

    def pregathered(p, keep=None):
        # the chunk's batches of the whole epoch in one gather, then a view per step
        xs = X[idx.transpose(0, 1).reshape(M, STEPS * B)]
        if keep is not None:  # only the pixels non-zero somewhere in the chunk's data
            xs = xs[:, :, keep]
            p["hidden.weight"] = p["hidden.weight"][:, :, keep].contiguous()
        ys = Y[idx.transpose(0, 1).reshape(M, STEPS * B)]
        for s in range(STEPS):
            MLP._sgd_step(p, xs[:, s * B : (s + 1) * B], ys[:, s * B : (s + 1) * B], w, lr=LR, l2=0.0)

    chunk_keep = nz[idx.flatten()].any(0).nonzero().squeeze(1)

    @transposed
    def pruned_union(p, w1t):
        for s in range(STEPS):
            x, y = X[idx[s]], Y[idx[s]]
            cols = (x != 0).flatten(0, 1).any(0).nonzero().squeeze(1)
            xk, wk = x.index_select(2, cols), w1t.index_select(1, cols)
            h = torch.baddbmm(p["hidden.bias"][:, None, :], xk, wk).relu_()
            tail(p, x, y, h, lambda dh: (wk.baddbmm_(xk.mT, dh, alpha=-LR), w1t.index_copy_(1, cols, wk)))

    @transposed
    def pruned_model(p, w1t):
        for s in range(STEPS):
            x, y = X[idx[s]], Y[idx[s]]
            zero = (x == 0).all(1)
            k = int((~zero).sum(1).max())
            order = zero.to(torch.uint8).argsort(dim=1, stable=True)[:, :k]
            xk = x.gather(2, order[:, None, :].expand(M, B, k))
            gi = order[:, :, None].expand(M, k, H)
            wk = w1t.gather(1, gi)
            h = torch.baddbmm(p["hidden.bias"][:, None, :], xk, wk).relu_()
            tail(p, x, y, h, lambda dh: (wk.baddbmm_(xk.mT, dh, alpha=-LR), w1t.scatter_(1, gi, wk)))

    @transposed
    def sparse_forward(p, w1t):
        table = w1t.view(M * 784, H)
        for s in range(STEPS):
            r = idx[s]
            x, y = X[r], Y[r]
            h = F.embedding_bag((NZI[r] + off).view(M * B, K), table, per_sample_weights=NZV[r].view(M * B, K),
                                mode="sum").view(M, B, H)
            h.add_(p["hidden.bias"][:, None, :]).relu_()
            tail(p, x, y, h, lambda dh: w1t.baddbmm_(x.mT, dh, alpha=-LR))

    def bf16_forward(p):
        w1 = p["hidden.weight"]
        w1b = w1.bfloat16()
        for s in range(STEPS):
            x, y = X[idx[s]], Y[idx[s]]
            h = torch.bmm(x.bfloat16(), w1b.mT).float().add_(p["hidden.bias"][:, None, :]).relu_()
            tail(p, x, y, h, lambda dh: (w1.baddbmm_(dh.mT, x, alpha=-LR), w1b.copy_(w1)))

    variants = {"engine": engine, "pruned_union": pruned_union, "pruned_model": pruned_model,
                "sparse_forward": sparse_forward, "bf16_forward": bf16_forward, "pregathered": pregathered,
                "pregathered_pruned": lambda p: pregathered(p, chunk_keep),
                "deferred_4": lambda p: deferred(p, 4), "deferred_10": lambda p: deferred(p, 10)}
    variants.update({f"narrow_{k}": (lambda p, k=k: engine(p, k)) for k in narrow})

    def init(cols=784):
        gi = torch.Generator().manual_seed(1)
        return {"hidden.weight": torch.randn(M, H, cols, generator=gi) * 0.05, "hidden.bias": torch.zeros(M, H),
                "output.weight": torch.randn(M, 10, H, generator=gi) * 0.1, "output.bias": torch.zeros(M, 10)}

    ref = init()
    engine(ref)
    result = {"nonzero_pixels_of_a_chunk_of_10_devices": counts, "nonzero_pixels_of_the_timed_batches": len(chunk_keep), "load_before": open("/proc/loadavg").read().split()[:3]}
    diffs = {}
    for name, fn in variants.items():
        if name.startswith("narrow"):
            continue
        p = init()
        fn(p)
        if name == "pregathered_pruned":  # the pruned columns never change: compare the kept ones
            ref_kept = {**ref, "hidden.weight": ref["hidden.weight"][:, :, chunk_keep]}
            diffs[name] = max(float((p[k] - ref_kept[k]).abs().max()) for k in p)
            continue
        diffs[name] = max(float((p[k] - ref[k]).abs().max()) for k in p)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.reps):
        for name, fn in variants.items():
            p = init(int(name.split("_")[1]) if name.startswith("narrow") else 784)
            t = time.thread_time()
            fn(p)
            times[name].append(time.thread_time() - t)
    base = float(np.median(times["engine"]))
    result["variants"] = {name: {"cpu_ms": round(float(np.median(v)) * 1e3, 1), "speedup": round(base / float(np.median(v)), 3),
                                 "max_abs_diff_vs_engine": diffs.get(name)} for name, v in times.items()}
    from torch.profiler import ProfilerActivity, profile
    p = init()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine(p)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    result["engine_op_share"] = {e.key: round(e.self_cpu_time_total / total, 3)
                                 for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]}
    padded_x = X[: 20 * 3000].view(20, 3000, 784)
    rows, base = torch.arange(M)[:, None], (torch.arange(M) * 3000)[:, None]
    picks = torch.randint(0, 3000, (STEPS, M, B), generator=g)
    gathers = {"advanced_indexing": lambda i: padded_x[rows, i],
               "index_select": lambda i: padded_x.flatten(0, 1).index_select(0, (base + i).view(-1)).view(M, B, 784)}
    assert torch.equal(gathers["advanced_indexing"](picks[0]), gathers["index_select"](picks[0]))
    gather_times: dict[str, list[float]] = {k: [] for k in gathers}
    for _ in range(args.reps):
        for name, fn in gathers.items():
            t = time.thread_time()
            for i in picks:
                fn(i)
            gather_times[name].append((time.thread_time() - t) / STEPS * 1e6)
    result["gather_us_per_step"] = {k: round(float(np.median(v)), 1) for k, v in gather_times.items()}
    result["load_after"] = open("/proc/loadavg").read().split()[:3]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
