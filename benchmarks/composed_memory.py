"""Peak RSS of one ``composed_sgd`` call over P pairs of the thesis MLP (issue 17 item 3).

Synthetic MNIST-shaped data (784 inputs, 10 classes), P pairs on P devices whose
sample counts alternate 10 / 20 so that ``pair_order`` is not the identity (the case
in which the pairs were trained on a permuted copy). Prints the peak RSS before the
call (data, starting variables) and after it, in GB; run the script against two
source trees to compare them:

    OMP_NUM_THREADS=1 PYTHONPATH=<tree>/src .venv/bin/python benchmarks/composed_memory.py --pairs 4000
"""

from __future__ import annotations

import argparse
import json
import resource

import torch

from clusterfed.engine.composed import Identity, composed_sgd
from clusterfed.engine.tensors import PaddedSplit
from clusterfed.models import MLP


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=4000)
    p.add_argument("--hidden", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the MLP's initial weights
    g = torch.Generator().manual_seed(0)
    counts = torch.tensor([10, 20] * (args.pairs // 2), dtype=torch.long)
    data = PaddedSplit(x=torch.rand(args.pairs, 20, 784, generator=g), y=torch.randint(0, 10, (args.pairs, 20), generator=g),
                       counts=counts)
    model = MLP((784,), 10, hidden=args.hidden)
    variables = {k: v.detach().unsqueeze(0).repeat(args.pairs, *[1] * v.dim()) for k, v in model.named_parameters()}
    floats = sum(v[0].numel() for v in variables.values())
    before = peak_gb()
    out = composed_sgd(model, variables, Identity(), data, torch.arange(args.pairs), epochs=1, lr=0.01, l2=0.001,
                       batch_size=10, generator=g)
    print(json.dumps({"pairs": args.pairs, "floats_per_pair": floats, "gb_per_copy": round(args.pairs * floats * 4 / 1e9, 3),
                      "peak_rss_gb_before_call": round(before, 3), "peak_rss_gb_after_call": round(peak_gb(), 3),
                      "check": float(sum(v.double().sum() for v in out.values()))}))


if __name__ == "__main__":
    main()
