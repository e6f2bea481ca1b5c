"""FedSoft on the authors' A2 (issue 14): which model serves the scarce devices.

Runs FedSoft's hooks by hand (all 50 devices every round, seed 10, 10 local epochs,
lr 0.01, L2 0.001, batch 10, MLP 784-128-10, one thread) and prints every 5 rounds, as
one JSON line, the accuracy over all test samples of (a) the cluster model of each
device's largest importance weight (``serve: cluster``) and (b) each device's own local
model w_k after that round (``serve: local``), for all devices, the abundant (group 0)
and the scarce (group 1) ones, and how the groups' largest-u clusters are spread.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsoft_served_vs_local.py 30
"""
import sys, time, json
import numpy as np, torch
from clusterfed.data import load_dataset
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_authors_scenario
from clusterfed.algorithms.fedsoft import FedSoft
from clusterfed.algorithms.protocol import Context
from clusterfed.algorithms.base import generators
from clusterfed.algorithms.grouped import replace_rows
torch.set_num_threads(1)
R = int(sys.argv[1]); seed = 10
ds = load_dataset("mnist", "/work/shared/datasets")
fed = build_authors_scenario(ds, "A2", seed=seed)
eng = Engine(fed, model="mlp", training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10, local_epochs=10), hidden=128, device="cpu")
algo = FedSoft(rounds=R)
rng, gen = generators(seed)
ctx = Context(rng=rng, generator=gen)
state = algo.init(eng, ctx)
n = eng.n_devices
local = None
g = fed.groups
nt = np.array([len(d.y_test) for d in fed.devices])
def allsamples(acc, m): return float((acc[m] * nt[m]).sum() / nt[m].sum())
for r in range(R):
    t = time.time()
    parts = np.arange(n)
    state, plan = algo.configure_round(eng, state, parts, ctx)
    res = eng.local_models(plan.params, plan.models, plan.devices, gen, penalty=plan.penalty)
    trained = res.params
    local = trained if local is None else replace_rows(local, plan.devices, trained, np.ones(len(plan.devices), bool))
    state = algo.aggregate(eng, state, plan, trained, ctx)
    if r % 5 == 4 or r == R - 1:
        served = eng.accuracy(state.c, state.u.argmax(1))
        own = eng.accuracy(local, np.arange(n))
        print(json.dumps({"round": r + 1, "s": round(time.time() - t, 1),
              "served_all": round(allsamples(served, np.ones(n, bool)), 4), "own_all": round(allsamples(own, np.ones(n, bool)), 4),
              "served_scarce": round(allsamples(served, g == 1), 4), "own_scarce": round(allsamples(own, g == 1), 4),
              "served_abund": round(allsamples(served, g == 0), 4), "own_abund": round(allsamples(own, g == 0), 4),
              "argmax_scarce": np.bincount(state.u.argmax(1)[g == 1], minlength=5).tolist(),
              "argmax_abund": np.bincount(state.u.argmax(1)[g == 0], minlength=5).tolist(),
              "u_scarce_max_mean": round(float(state.u[g == 1].max(1).mean()), 3)}), flush=True)
