"""``clusterfed models …``: register stage outputs, list, look up and run cluster models.

Lookups default to the experiment of ``params.yaml``, its continual stage when enabled
(else cold start), that stage's first algorithm and the first seed; with
``--experiment`` given, ``--stage``/``--algorithm``/``--seed`` may be left out only
when the experiment holds one of each. Anything the registry does not hold exits with status 1
and a message saying what it does hold.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def add_parser(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="model registry: register, list, lookup, predict")
    cmds = models.add_subparsers(dest="models_command", required=True)
    cmds.add_parser("register", help="log the finished stages as one MLflow run and register every cluster model")
    ls = cmds.add_parser("list", help="registered cluster models and the version each has in service")
    ls.add_argument("--experiment", help="only this experiment (default: all)")
    ls.add_argument("--all", action="store_true", help="every version, not only those in service")
    for name, text in (("lookup", "the model serving a device"), ("predict", "run a device's model on an input file")):
        p = cmds.add_parser(name, help=text)
        p.add_argument("--device", type=int, required=True)
        p.add_argument("--timestep", type=int, help="continual timestep (default: the model in service now)")
        p.add_argument("--experiment", help="MLflow experiment (default: that of params.yaml)")
        p.add_argument("--stage", choices=["coldstart", "continual", "unsupervised"],
                       help="default: continual when enabled in params.yaml (unsupervised with --local-cluster)")
        p.add_argument("--algorithm", help="default: the stage's first in params.yaml")
        p.add_argument("--seed", type=int, help="default: the first in params.yaml")
        if name == "lookup":
            p.add_argument("--local-cluster", type=int,
                           help="FedCRef: the community model serving this local cluster q of client --device")
        if name == "predict":
            p.add_argument("input", type=Path, help=".npy array of images [N, C, H, W] scaled as the dataset loader does")
            p.add_argument("--output", type=Path, help="write labels to this .npy or .csv (default: print them)")


def run(args: argparse.Namespace, params_path: str) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from clusterfed import tracking  # MLflow is imported only for these commands
    from clusterfed.tracking import registry

    params = _params_or_none(params_path)
    client = tracking.get_client(".")
    if args.models_command == "register":
        if params is None:
            return _fail(f"{params_path}: needed to register the stage outputs")
        from clusterfed.cli import LAYOUT

        tracker = tracking.track_outputs(params, LAYOUT, tags={"clusterfed.runner": "cli"})
        print(f"logged run {tracker.run_id} in experiment {tracker.experiment!r} ({tracker.tracking_uri})")
        return 0
    if args.models_command == "list":
        rows = registry.in_experiment(client, args.experiment)
        rows = rows if args.all else [m for m in rows if m.aliases]
        if not rows:
            return _fail(f"no registered models{f' in {args.experiment!r}' if args.experiment else ''}")
        _print_models(rows)
        return 0

    experiment, stage, algorithm, seed = args.experiment, args.stage, args.algorithm, args.seed
    if getattr(args, "local_cluster", None) is not None:
        return _lookup_local_cluster(client, args, params, params_path)
    if experiment is None:
        if params is None:
            return _fail(f"{params_path} not usable; pass --experiment")
        experiment = tracking.experiment_name(params)
        stage = stage or ("continual" if params.continual.enabled else "coldstart")
        stage_params = params.continual if stage == "continual" else params.coldstart
        algorithm = algorithm or stage_params.algorithms[0]
        seed = params.seeds[0] if seed is None else seed
    try:
        served = tracking.lookup(
            client, args.device, experiment=experiment, stage=stage, algorithm=algorithm, seed=seed,
            timestep=args.timestep,
        )
    except tracking.LookupFailed as exc:
        return _fail(str(exc))
    if args.models_command == "lookup":
        when = "now" if args.timestep is None else f"timestep {args.timestep}"
        print(f"device {args.device} ({when}) is served by")
        print(f"  model     {served.name}")
        print(f"  version   {served.version}  (aliases: {', '.join(served.aliases)})")
        print(f"  cluster   {served.cluster}: devices {served.devices}, supportive clusters {served.supportive_clusters}")
        print(f"  accuracy  {served.accuracy}")
        print(f"  uri       models:/{served.name}/{served.version}")
        return 0

    if not args.input.is_file():
        return _fail(f"{args.input}: file not found")
    try:
        x = np.load(args.input, allow_pickle=False)
        labels = tracking.load_model(client, served).predict(x)
    except ValueError as exc:
        return _fail(f"{args.input}: {exc}")
    print(f"{served.name} version {served.version} (cluster {served.cluster}): {len(labels)} predictions", file=sys.stderr)
    if args.output is None:
        print("\n".join(map(str, labels.tolist())))
    elif args.output.suffix == ".csv":
        args.output.write_text("label\n" + "".join(f"{v}\n" for v in labels.tolist()))
    else:
        np.save(args.output, labels)
    return 0


def _lookup_local_cluster(client, args: argparse.Namespace, params: Params | None, params_path: str) -> int:
    """``models lookup --device i --local-cluster q``: FedCRef's community model of (i, q)."""
    from clusterfed import tracking
    from clusterfed.tracking.communities import lookup_local_cluster

    experiment, algorithm, seed = args.experiment, args.algorithm, args.seed
    if experiment is None:
        if params is None:
            return _fail(f"{params_path} not usable; pass --experiment")
        experiment = tracking.experiment_name(params)
        algorithm = algorithm or params.unsupervised.methods[0]
        seed = params.seeds[0] if seed is None else seed
    try:
        served = lookup_local_cluster(client, args.device, args.local_cluster, experiment=experiment,
                                      algorithm=algorithm, seed=seed)
    except tracking.LookupFailed as exc:
        return _fail(str(exc))
    print(f"local cluster {args.local_cluster} of client {args.device} is served by")
    print(f"  model     {served.name}")
    print(f"  version   {served.version}  (aliases: {', '.join(served.aliases)})")
    print(f"  community {served.cluster}: clients {served.devices}")
    print(f"  uri       models:/{served.name}/{served.version}")
    return 0


def _print_models(rows: list) -> None:
    print(f"{'model':<48} {'version':>7} {'timestep':>8} {'cluster':>7} {'accuracy':>8}  {'aliases':<12} devices | supportive")
    for m in rows:
        acc = "-" if m.accuracy is None else f"{m.accuracy:.4f}"
        print(
            f"{m.name:<48} {m.version:>7} {m.timestep:>8} {m.cluster:>7} {acc:>8}  {','.join(m.aliases) or '-':<12} "
            f"{m.devices} | {m.supportive_clusters}"
        )


def _params_or_none(path: str):
    from clusterfed.config import ParamsError, load_params

    try:
        return load_params(path)
    except ParamsError:
        return None


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
