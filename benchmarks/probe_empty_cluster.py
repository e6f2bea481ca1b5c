"""Trace of the empty-cluster support bug (RESULTS §8, session 26): reruns t = 2's C-FAACL
``arrive`` of the authors' sequential S2 run (20 rounds a timestep, seed 10) from its t = 1
checkpoint, printing after each settle round which clusters list the empty concept-0
cluster 198 and whether it survived the merge. Needs the run of RESULTS §8 session 23 in
``benchmarks/out/authors_continual_r20``; run with the code before the fix to see the merge.

    PYTHONPATH=src .venv/bin/python benchmarks/probe_empty_cluster.py
"""
import sys, json, numpy as np, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from types import SimpleNamespace
import thesis_continual_mnist as T
from clusterfed.build import build_continual_algorithm, build_schedule, timestep_engines
from clusterfed.continual.checkpoint import _load_state
from clusterfed.layout import checkpoint_files
from clusterfed.algorithms import faacl as F
from clusterfed.algorithms.protocol import Context
torch.set_num_threads(1)
args = SimpleNamespace(construction="authors", seeds=[10], root=str(__import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "datasets"), device="cpu", timesteps=10,
    samples_per_device=1000, test_samples_per_device=200, algorithms=["cfaacl"], epochs=20, init_epochs=5,
    set=["training.sparse_inputs=true"])
params = T.params_for(args, "sequential", "S2")
schedule = build_schedule(params)
engine_at = timestep_engines(params, schedule, 10)
d = "benchmarks/out/authors_continual_r20/sequential_S2/data/continual/cfaacl/seed_10/checkpoints"
files = checkpoint_files(__import__("pathlib").Path(d), 1)
meta = json.loads(files.meta.read_text())
state = _load_state(files, meta)
algo = build_continual_algorithm("cfaacl", params)
print("t=1 clusters", [(c.id, len(c.devices)) for c in state.clustering.clusters])
eng = engine_at(2)
orig_settle = F.settle_clusters
import clusterfed.continual.cfaacl as CF
def traced(engine, clustering, **kw):
    print("before settle", [(c.id, len(c.devices)) for c in clustering.clusters][:5], "...", len(clustering.clusters))
    for r in range(kw["max_rounds"]):
        before = clustering.partition()
        clustering = F.cluster_train(engine, clustering, kw["generator"])
        clustering = F.cluster_support(engine, clustering, alpha=kw["alpha"], epsilon=kw["epsilon"])
        e = [c for c in clustering.clusters if not c.devices]
        print(f"round {r}: empty clusters {[(c.id, sorted(c.sup)[:5]) for c in e]}; who lists them: "
              f"{[(c.id) for c in clustering.clusters if any(x.id in c.sup for x in e)][:10]}")
        clustering = F.cluster_merge(clustering, kw["rng"])
        print(f"   after merge: {len(clustering.clusters)} clusters; 198 present: {any(c.id == 198 for c in clustering.clusters)}")
        if clustering.partition() == before:
            break
    return clustering
CF.settle_clusters = traced
rng = np.random.default_rng(0); gen = torch.Generator().manual_seed(0)
ctx = Context(rng=rng, generator=gen)
st = algo.arrive(state, eng, 2, ctx)
