"""FedDrift's merge distance between the concepts, timestep by timestep, from a finished run.

FedDrift merges two clusters while D_ij = max(L_ij − L_ii, L_ji − L_jj, 0) < δ
(``clusterfed/continual/baselines.py``). This replays each timestep's assignment (the
drift test, ``FedDrift.assign``) from the run's checkpoint of the timestep before, with
the run's own random draws, and prints, before the merge: the clusters with devices,
the devices that drifted (founded a cluster), and D between the cluster holding most of
concept 0's devices and the one holding most of concept 1's. The merge that follows is
checked against the run's own clusters at that timestep before anything is printed.

    .venv/bin/python benchmarks/feddrift_distances.py --construction authors --epochs 100 \\
        --setting multitask --scenario S1 --seeds 10 --set training.sparse_inputs=true \\
        --runs benchmarks/out/authors_continual_s41_r100
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thesis_continual_mnist as tcm  # noqa: E402  (the benchmark whose runs are read)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, metavar="OUT", help="thesis_continual_mnist.py --out folders")
    tcm.cell_arguments(p, construction="thesis")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="the runs' --set options")
    args = p.parse_args()
    from clusterfed.algorithms.base import generators
    from clusterfed.algorithms.protocol import Context
    from clusterfed.build import build_continual_algorithm, build_schedule, timestep_engines
    from clusterfed.continual.checkpoint import load_checkpoint
    from clusterfed.continual.state import timestep_seed
    from clusterfed.layout import RunLayout

    print("| run | seed | t | concepts held | clusters before the merge | drifted | D(concept 0, concept 1) | "
          "δ | merged into one |")
    print("|---|---|---|---|---|---|---|---|---|")
    for out in args.runs:
        for seed in args.seeds:
            files = RunLayout(Path(out) / f"{args.setting}_{args.scenario}").continual_run("feddrift", seed)
            if not files.timesteps.is_file():
                raise SystemExit(f"{files.timesteps}: missing (no finished FedDrift run of seed {seed} under {out})")
            run_args = tcm.run_namespace(args, out=out, algorithm="feddrift", seeds=[seed], settings=args.set)
            params = tcm.params_for(run_args, args.setting, args.scenario)
            algorithm = build_continual_algorithm("feddrift", params)
            engine_at = timestep_engines(params, build_schedule(params), seed)
            rows = json.loads(files.timesteps.read_text())["rows"]
            for t in range(1, args.timesteps + 1):
                state, engine = load_checkpoint(files.checkpoints, t - 1), engine_at(t)
                ctx = Context(*generators(timestep_seed(seed, t)))
                assigned = algorithm.assign(state, engine, ctx)
                merged = algorithm.arrive(state, engine, t, Context(*generators(timestep_seed(seed, t))))
                if merged.clustering.model_of_device(engine.n_devices).tolist() != [
                    [c.id for c in merged.clustering.clusters].index(k) for k in rows[t]["cluster_of_device"]
                ]:
                    raise SystemExit(f"{files.dir}: t = {t} does not reproduce the run's clusters; "
                                     "are --set, --construction and --epochs the run's?")
                concept = np.asarray(rows[t]["concept_of_device"])
                active, d = algorithm.distances(engine, assigned)
                held = sorted(set(concept.tolist()))
                founded = sum(c.id >= state.clustering.next_id() for c in assigned.clusters)
                if len(held) == 2:
                    # the cluster (row) holding most devices of each concept
                    top = [int(np.argmax([sum(concept[x] == k for x in c.devices) for c in assigned.clusters]))
                           for k in held]
                    pos = [active.index(r) for r in top]
                    dist = "same cluster" if pos[0] == pos[1] else f"{d[pos[0], pos[1]]:.3f}"
                else:
                    dist = "one concept"
                one = len({c.id for c in merged.clustering.clusters if c.devices}) == 1
                print(f"| {out} | {seed} | {t} | {held} | {len(active)} | {founded} | {dist} | "
                      f"{algorithm.delta:g} | {'yes' if one else 'no'} |", flush=True)


if __name__ == "__main__":
    main()
