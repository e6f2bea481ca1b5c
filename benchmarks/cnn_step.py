"""CPU speed of the stacked CNN step against the CPU's measured convolution throughput
(issue 17 item 4).

One SGD step (CE + L2, autograd) of M models, each on its own batch of B MNIST images,
for FLACC's MNIST CNN (5×5 convs 32/64, FC 512; ``--flacc``) or the default CNN
(3×3, 16/32, FC 128). Variants of the stacked forward, all checked against the
device-by-device reference (one ``nn.Module`` per model) before timing:

- ``engine``: the engine's ``CNN.stacked_forward`` (one grouped conv, groups = M,
  channels-last since this benchmark);
- ``grouped_nchw``: the same grouped convs in the NCHW layout (the engine before);
- ``loop``: one ordinary conv per model inside one autograd graph (then cat);
- ``im2col``: each conv as ``unfold`` + one batched matmul over the M models;
- ``compiled``: ``torch.compile`` of the grouped step (``--compile``; compile time excluded).

The **limit** is the same FLOPs done the best way the CPU knows: ONE model through
the same network on a batch of M·B images (dense convs, no groups), forward and
backward, timed the same way, in NCHW and in channels-last: the faster of the two. "within 1.5× of the limit" = variant time ≤ 1.5 ×
limit time. FLOPs per image are counted analytically. Two warm-up calls each, then ``--reps``
repetitions that time every variant once in turn (interleaved), medians;
``/proc/loadavg`` before and after. Writes ``benchmarks/out/cnn_step[_flacc].json``.

    .venv/bin/python benchmarks/cnn_step.py --flacc --models 20 --batch 10
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from clusterfed.data import load_dataset
from clusterfed.engine.local_sgd import autograd_sgd_step
from clusterfed.models import CNN, _stacked_linear, is_regularized

LR, L2 = 0.01, 0.001


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def flops_per_image(c1: int, c2: int, k: int, hidden: int) -> float:
    fwd = 2 * 28 * 28 * 1 * c1 * k * k + 2 * 14 * 14 * c1 * c2 * k * k + 2 * c2 * 49 * hidden + 2 * hidden * 10
    grad_input = 2 * 14 * 14 * c1 * c2 * k * k + 2 * c2 * 49 * hidden + 2 * hidden * 10  # none for the image
    return 2 * fwd + grad_input  # forward + weight gradients + input gradients


def loop_forward(params, x):
    """One ordinary conv per model (x: [M, B, 1, H, W])."""
    pad = params["conv1.weight"].shape[-1] // 2
    out = []
    for m in range(x.shape[0]):
        h = F.max_pool2d(F.conv2d(x[m], params["conv1.weight"][m], params["conv1.bias"][m], padding=pad).relu(), 2)
        h = F.max_pool2d(F.conv2d(h, params["conv2.weight"][m], params["conv2.bias"][m], padding=pad).relu(), 2)
        out.append(h.flatten(1))
    h = _stacked_linear(params["hidden.weight"], params["hidden.bias"], torch.stack(out), False)
    return _stacked_linear(params["output.weight"], params["output.bias"], h.relu(), False)


def _conv_bmm(x, weight, bias):
    """Same-padded conv of M models as im2col + one batched matmul: x [M, B, C, H, W]."""
    m, b, c, h, w = x.shape
    k = weight.shape[-1]
    cols = F.unfold(x.flatten(0, 1), k, padding=k // 2)  # [M·B, C·k², H·W]
    cols = cols.view(m, b, c * k * k, h * w).transpose(2, 3).reshape(m, b * h * w, c * k * k)
    out = torch.baddbmm(bias[:, None, :], cols, weight.flatten(2).transpose(1, 2))  # [M, B·H·W, O]
    return out.view(m, b, h, w, -1).permute(0, 1, 4, 2, 3)


def im2col_forward(params, x):
    m, b = x.shape[:2]
    h = _conv_bmm(x, params["conv1.weight"], params["conv1.bias"]).relu()
    h = F.max_pool2d(h.flatten(0, 1), 2)
    h = _conv_bmm(h.reshape(m, b, *h.shape[1:]), params["conv2.weight"], params["conv2.bias"]).relu()
    h = F.max_pool2d(h.flatten(0, 1), 2).reshape(m, b, -1)
    h = _stacked_linear(params["hidden.weight"], params["hidden.bias"], h, False)
    return _stacked_linear(params["output.weight"], params["output.bias"], h.relu(), False)


def grouped_nchw_forward(params, x):
    m, n = x.shape[:2]
    pad = params["conv1.weight"].shape[-1] // 2
    xs = x.transpose(0, 1).reshape(n, -1, *x.shape[-2:])
    w1 = params["conv1.weight"].flatten(0, 1)
    h = F.max_pool2d(F.conv2d(xs, w1, params["conv1.bias"].flatten(), padding=pad, groups=m).relu(), 2)
    w2 = params["conv2.weight"].flatten(0, 1)
    h = F.max_pool2d(F.conv2d(h, w2, params["conv2.bias"].flatten(), padding=pad, groups=m).relu(), 2)
    h = h.view(n, m, -1).transpose(0, 1)
    h = _stacked_linear(params["hidden.weight"], params["hidden.bias"], h, False)
    return _stacked_linear(params["output.weight"], params["output.bias"], h.relu(), False)


def step_with(forward, params, x, y, w):
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    logits = forward(leaves, x)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)
    grads = torch.autograd.grad((ce * w).sum(), list(leaves.values()))
    with torch.no_grad():
        for (k, p), g in zip(params.items(), grads):
            if is_regularized(k):
                p.mul_(1.0 - 2.0 * LR * L2)
            p.add_(g, alpha=-LR)


def reference(template, params, x, y):
    """Each model alone: nn.Module, batch-mean CE + L2·Σ‖W‖², one SGD step."""
    out = []
    for m in range(x.shape[0]):
        net = copy.deepcopy(template)
        net.load_state_dict({k: v[m].clone() for k, v in params.items()})
        loss = F.cross_entropy(net(x[m]), y[m])
        loss = loss + L2 * sum(p.pow(2).sum() for k, p in net.named_parameters() if is_regularized(k))
        loss.backward()
        with torch.no_grad():
            out.append({k: p - LR * p.grad for k, p in net.named_parameters()})
    return {k: torch.stack([o[k] for o in out]) for k in out[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/work/shared/datasets")
    ap.add_argument("--flacc", action="store_true", help="FLACC's CNN (5x5, 32/64, FC 512)")
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    c1, c2, k, hidden = (32, 64, 5, 512) if args.flacc else (16, 32, 3, 128)
    template = CNN((1, 28, 28), 10, hidden=hidden, conv_channels=(c1, c2), kernel_size=k)
    ds = load_dataset("mnist", args.root)
    g = torch.Generator().manual_seed(0)
    M, B = args.models, args.batch
    idx = torch.randint(0, len(ds.y_train), (M, B), generator=g)
    x = torch.as_tensor(ds.x_train)[idx]  # [M, B, 1, 28, 28]
    y = torch.as_tensor(ds.y_train)[idx]
    w = torch.full((M, B), 1.0 / B)
    params = {}
    for name, p in template.named_parameters():
        params[name] = torch.stack([torch.nn.init.uniform_(torch.empty_like(p), -0.1, 0.1, generator=g) for _ in range(M)])

    variants = {
        "engine": lambda p: autograd_sgd_step(template, p, x, y, w, lr=LR, l2=L2),
        "grouped_nchw": lambda p: step_with(grouped_nchw_forward, p, x, y, w),
        "loop": lambda p: step_with(loop_forward, p, x, y, w),
        "im2col": lambda p: step_with(im2col_forward, p, x, y, w),
    }
    if args.compile:
        compiled = torch.compile(lambda p, xx, yy, ww: step_with(
            lambda q, z: CNN.stacked_forward(q, z, shared_input=False), p, xx, yy, ww))
        variants["compiled"] = lambda p: compiled(p, x, y, w)

    ref = reference(template, params, x, y)
    equal = {}
    for name, fn in variants.items():
        p = {kk: v.clone() for kk, v in params.items()}
        fn(p)
        equal[name] = all(torch.allclose(p[kk], ref[kk], rtol=1e-4, atol=1e-5) for kk in p)

    one = copy.deepcopy(template)
    one_cl = copy.deepcopy(template).to(memory_format=torch.channels_last)
    xb, yb = x.flatten(0, 1), y.flatten()
    xb_cl = xb.contiguous(memory_format=torch.channels_last)

    def dense(net, images):
        net.zero_grad()
        F.cross_entropy(net(images), yb).backward()

    load_before = loadavg()
    runs = {"limit nchw": lambda: dense(one, xb), "limit channels_last": lambda: dense(one_cl, xb_cl)}
    state = {name: {kk: v.clone() for kk, v in params.items()} for name in variants}
    runs.update({name: (lambda fn=fn, p=state[name]: fn(p)) for name, fn in variants.items()})
    for fn in runs.values():  # two warm-up calls each (oneDNN primitives, allocator)
        fn()
        fn()
    raw = {name: [] for name in runs}
    for _ in range(args.reps):  # interleaved: every repetition times each variant once
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            raw[name].append(time.perf_counter() - t0)
    dense_times = {"nchw": raw.pop("limit nchw"), "channels_last": raw.pop("limit channels_last")}
    best = min(dense_times, key=lambda k: statistics.median(dense_times[k]))
    times = {"limit (one model, M·B images)": dense_times[best], **raw}
    load_after = loadavg()
    gflop = flops_per_image(c1, c2, k, hidden) * M * B / 1e9
    med = {name: statistics.median(t) for name, t in times.items()}
    lim = med["limit (one model, M·B images)"]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
        "threads": args.threads, "load_before": load_before, "load_after": load_after,
        "network": f"CNN {k}x{k} {c1}/{c2}, FC {hidden}", "models": M, "batch": B, "gflop_per_step": gflop,
        "median_ms": {n: 1000 * t for n, t in med.items()},
        "gflops": {n: gflop / t for n, t in med.items()},
        "over_limit": {n: t / lim for n, t in med.items()},
        "equals_reference": equal, "seconds": times, "limit_layout": best,
        "limit_ms_by_layout": {k: 1000 * statistics.median(t) for k, t in dense_times.items()},
    }
    out = Path(args.out or Path(__file__).parent / "out" / f"cnn_step{'_flacc' if args.flacc else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=2))


if __name__ == "__main__":
    main()
