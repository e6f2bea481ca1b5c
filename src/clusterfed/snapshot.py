"""Snapshots of a running fit: a tree of plain data to safetensors + JSON, no pickle.

A cold-start method keeps what it has learned in its own state dataclass (tensors,
arrays, clusters, frozensets, …), and each method's is different. Rather than ask every
method for a serializer, :func:`encode` walks the tree once: tensors and arrays go to a
safetensors file, the structure to JSON with a type tag per node. :func:`decode`
rebuilds the same tree. Dataclasses are rebuilt only from ``clusterfed`` modules and
nothing is unpickled, so loading a snapshot runs no code from the file. A value of any
other type raises :class:`TypeError` naming where it sits in the tree.

A snapshot directory is written under a temporary name and renamed when complete
(:func:`save_snapshot`); the one it replaces is moved aside first and deleted last, so
a save interrupted at any point leaves the previous snapshot readable.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from clusterfed.tensorfile import save_tensors


class StaleCheckpoint(UserWarning):
    """A checkpoint left by a run of other parameters or code: the run starts over
    without it. Said aloud, because the lost work can be hours (a mistyped option, a
    code change) and the rerun would otherwise look like a resume."""


def warn_stale(directory: Path, what: str, fate: str) -> None:
    """Warn that ``what`` in ``directory`` is stale; ``fate`` says what happens to it."""
    warnings.warn(
        f"{directory}: {what} written with other parameters or code (checkpoint fingerprint differs): "
        f"starting over; {fate}", StaleCheckpoint, stacklevel=3,
    )

TENSORS = "state.safetensors"
META = "state.json"


def encode(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-able structure, tensors by key) of ``tree``."""
    tensors: dict[str, torch.Tensor] = {}
    return _encode(tree, "state", tensors), tensors


def decode(node: Any, tensors: dict[str, torch.Tensor], accelerator: torch.device | str | None = None) -> Any:
    """The tree :func:`encode` was given, from its two parts. ``accelerator``: where
    what was saved on a GPU goes instead (a GPU run resumed on a CPU); what was saved
    on the CPU stays there (random generators, host-side tensors)."""
    if not isinstance(node, dict):
        return node  # None, bool, int, float, str
    tag = node["$"]
    if tag == "tensor":
        return tensors[node["key"]].to(_placed(node["device"], accelerator))
    if tag == "ndarray":
        return tensors[node["key"]].numpy().astype(node["dtype"], copy=False)
    if tag == "np":
        return np.dtype(node["dtype"]).type(node["v"])
    if tag in ("tuple", "list"):
        items = [decode(v, tensors, accelerator) for v in node["items"]]
        return tuple(items) if tag == "tuple" else items
    if tag in ("frozenset", "set"):
        items = [decode(v, tensors, accelerator) for v in node["items"]]
        return frozenset(items) if tag == "frozenset" else set(items)
    if tag == "dict":
        return {decode(k, tensors, accelerator): decode(v, tensors, accelerator) for k, v in node["items"]}
    if tag == "dataclass":
        cls = _clusterfed_type(node["type"])
        obj = object.__new__(cls)
        for name, value in node["fields"].items():
            object.__setattr__(obj, name, decode(value, tensors, accelerator))  # frozen ones too
        return obj
    if tag == "numpy_rng":
        rng = np.random.Generator(getattr(np.random, node["bit_generator"])())
        rng.bit_generator.state = node["state"]
        return rng
    if tag == "torch_rng":
        gen = torch.Generator(device=_placed(node["device"], accelerator))
        gen.set_state(tensors[node["key"]])
        return gen
    raise ValueError(f"unknown snapshot node type {tag!r}")


def save_snapshot(directory: Path, tree: Any, meta: dict) -> None:
    """Write ``tree`` and the JSON-able ``meta`` to ``directory``, atomically."""
    directory = Path(directory)
    structure, tensors = encode(tree)
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_tensors(tensors, tmp / TENSORS)
    (tmp / META).write_text(json.dumps({"meta": meta, "tree": structure}))
    previous = _previous(directory)
    shutil.rmtree(previous, ignore_errors=True)
    if directory.exists():
        directory.rename(previous)  # until the new one is in place, the old one stays readable
    tmp.rename(directory)
    shutil.rmtree(previous, ignore_errors=True)


def _placed(saved_on: str, accelerator: torch.device | str | None) -> str:
    return saved_on if accelerator is None or saved_on == "cpu" else str(accelerator)


def load_snapshot(directory: Path, accelerator: torch.device | str | None = None) -> tuple[Any, dict]:
    """(tree, meta) of the snapshot :func:`save_snapshot` last finished writing;
    ``accelerator`` as in :func:`decode`."""
    found = _complete(Path(directory))
    if found is None:
        raise FileNotFoundError(f"no complete snapshot in {directory}")
    blob = json.loads((found / META).read_text())
    tensors = load_file(str(found / TENSORS))
    return decode(blob["tree"], tensors, accelerator), blob["meta"]


def read_meta(directory: Path) -> dict | None:
    """The ``meta`` of the last complete snapshot, None when there is none."""
    found = _complete(Path(directory))
    return None if found is None else json.loads((found / META).read_text())["meta"]


def _previous(directory: Path) -> Path:
    return directory.with_name(directory.name + ".previous")


def _complete(directory: Path) -> Path | None:
    """``directory``, or the snapshot it replaced when a save was interrupted between
    moving the old one aside and moving the new one in."""
    for candidate in (directory, _previous(directory)):
        if (candidate / META).is_file() and (candidate / TENSORS).is_file():
            return candidate
    return None


def _encode(value: Any, where: str, tensors: dict[str, torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise TypeError(f"{where}: cannot snapshot a {value.layout} tensor")
        key = f"t{len(tensors)}"
        tensors[key] = value.detach()
        return {"$": "tensor", "key": key, "device": str(value.device)}
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"{where}: cannot snapshot an array of dtype {value.dtype}")
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value))
        return {"$": "ndarray", "key": key, "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return {"$": "np", "dtype": value.dtype.str, "v": value.item()}
    if isinstance(value, (tuple, list)):
        tag = "tuple" if isinstance(value, tuple) else "list"
        return {"$": tag, "items": [_encode(v, f"{where}[{i}]", tensors) for i, v in enumerate(value)]}
    if isinstance(value, (frozenset, set)):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        # in iteration order: rebuilt in that order, the set iterates as it did
        return {"$": tag, "items": [_encode(v, f"{where}{{}}", tensors) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "items": [
            [_encode(k, f"{where}<key>", tensors), _encode(v, f"{where}[{k!r}]", tensors)] for k, v in value.items()
        ]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = f"{type(value).__module__}:{type(value).__qualname__}"
        _clusterfed_type(name)  # refuse at save what load would refuse
        fields = {f.name: _encode(getattr(value, f.name), f"{where}.{f.name}", tensors) for f in dataclasses.fields(value)}
        return {"$": "dataclass", "type": name, "fields": fields}
    if isinstance(value, np.random.Generator):
        return {"$": "numpy_rng", "bit_generator": type(value.bit_generator).__name__,
                "state": value.bit_generator.state}
    if isinstance(value, torch.Generator):
        key = f"t{len(tensors)}"
        tensors[key] = value.get_state()
        return {"$": "torch_rng", "key": key, "device": str(value.device)}
    raise TypeError(f"{where}: cannot snapshot a value of type {type(value).__name__}")


def _clusterfed_type(name: str) -> type:
    module, _, qualname = name.partition(":")
    if not (module == "clusterfed" or module.startswith("clusterfed.")):
        raise TypeError(f"snapshot: dataclass {name} is not a clusterfed type")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not dataclasses.is_dataclass(obj):
        raise TypeError(f"snapshot: {name} is not a dataclass")
    return obj
