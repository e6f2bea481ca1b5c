"""The federation: every device's train / validation / test splits (thesis §2.2)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from clusterfed.atomic_write import write_atomically


@dataclass(frozen=True)
class DeviceSplits:
    """One device's data: Z_d^train, Z_d^val and Z_d^test of thesis §2.2."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def n_train(self) -> int:
        return len(self.y_train)


SPLITS: tuple[str, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class Federation:
    """A simulated federation of devices and the ground truth used only for scoring.

    ``groups[d]`` is the ground-truth concept of device ``d``; algorithms never see it
    (only the ``centralized`` oracle baseline and the scoring do).
    ``description["oracle_pools"]``, when a construction sets it, lists per group the
    devices whose training data the oracle trains that group's model on
    (:attr:`oracle_pools`).
    """

    devices: tuple[DeviceSplits, ...]
    groups: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]
    scenario: str
    dataset: str
    seed: int
    description: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ValueError("invalid federation: " + "; ".join(problems))

    @property
    def n_devices(self) -> int:
        return len(self.devices)

    @property
    def oracle_pools(self) -> tuple[np.ndarray, ...]:
        """The devices whose training data the oracle (``centralized``) pools into the
        model of each ground-truth group, groups in increasing order: each group's own
        devices, unless the construction says otherwise (the authors' A1 and A2,
        ``scenarios/authors.py``)."""
        pools = self.description.get("oracle_pools")
        if pools is None:
            return tuple(np.flatnonzero(self.groups == g) for g in np.unique(self.groups))
        return tuple(np.asarray(p, dtype=np.int64) for p in pools)

    def subset(self, devices: "np.ndarray | list[int]") -> "Federation":
        """The federation of ``devices`` only, renumbered 0..len-1 in the given order
        (e.g. newcomers that join after the others have federated)."""
        devices = [int(d) for d in devices]
        bad = [d for d in devices if not 0 <= d < self.n_devices]
        if bad:
            raise ValueError(f"devices {bad} are not in this federation of {self.n_devices}")
        description = {**self.description, "subset_of_devices": devices}
        if "oracle_pools" in description:  # renumbered; a group keeps only the devices taken
            position = {d: i for i, d in enumerate(devices)}
            kept = np.unique(self.groups[devices])
            description["oracle_pools"] = [
                [position[d] for d in pool.tolist() if d in position]
                for g, pool in zip(np.unique(self.groups), self.oracle_pools) if g in kept
            ]
        return replace(
            self,
            devices=tuple(self.devices[d] for d in devices),
            groups=self.groups[devices],
            description=description,
        )

    def save(self, path: str | Path) -> None:
        """Write the federation to one ``.npz`` file (arrays only, no pickle)."""
        arrays: dict[str, np.ndarray] = {"groups": self.groups}
        for d, dev in enumerate(self.devices):
            for split in ("train", "val", "test"):
                arrays[f"d{d}_x_{split}"] = getattr(dev, f"x_{split}")
                arrays[f"d{d}_y_{split}"] = getattr(dev, f"y_{split}")
        meta = {
            "n_classes": self.n_classes,
            "input_shape": list(self.input_shape),
            "scenario": self.scenario,
            "dataset": self.dataset,
            "seed": self.seed,
            "n_devices": self.n_devices,
            "description": self.description,
        }
        arrays["meta_json"] = np.frombuffer(_json_dumps(meta).encode(), dtype=np.uint8)
        write_atomically(path, lambda tmp: np.savez_compressed(tmp, **arrays), suffix=".tmp.npz")

    @classmethod
    def load(cls, path: str | Path) -> "Federation":
        import json

        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(f["meta_json"].tobytes().decode())
            devices = tuple(
                DeviceSplits(
                    **{
                        f"{xy}_{split}": f[f"d{d}_{xy}_{split}"]
                        for split in ("train", "val", "test")
                        for xy in ("x", "y")
                    }
                )
                for d in range(meta["n_devices"])
            )
            groups = f["groups"]
        return cls(
            devices=devices,
            groups=groups,
            n_classes=meta["n_classes"],
            input_shape=tuple(meta["input_shape"]),
            scenario=meta["scenario"],
            dataset=meta["dataset"],
            seed=meta["seed"],
            description=meta["description"],
        )


def _problems(fed: Federation) -> list[str]:
    """What is wrong with ``fed``'s arrays, each naming the field (first problem per device)."""
    if not isinstance(fed.n_classes, (int, np.integer)) or isinstance(fed.n_classes, bool) or fed.n_classes < 2:
        return [f"n_classes: expected an integer >= 2, got {fed.n_classes!r}"]
    if len(fed.devices) == 0:
        return ["devices: no devices"]
    groups = np.asarray(fed.groups)
    if groups.shape != (len(fed.devices),) or not np.issubdtype(groups.dtype, np.integer):
        return [f"groups: expected {len(fed.devices)} integers (one per device), got shape {groups.shape} {groups.dtype}"]
    out = []
    pools = fed.description.get("oracle_pools")
    if pools is not None:
        n_groups, n = len(np.unique(groups)), len(fed.devices)
        if len(pools) != n_groups or any(not p or not all(0 <= int(d) < n for d in p) for p in pools):
            out.append(f"description.oracle_pools: expected {n_groups} non-empty lists of devices 0..{n - 1}")
    for d, dev in enumerate(fed.devices):
        problem = _device_problem(dev, fed.input_shape, fed.n_classes)
        if problem:
            out.append(f"devices[{d}].{problem}")
    return out


def _device_problem(dev: DeviceSplits, input_shape: tuple[int, ...], n_classes: int) -> str | None:
    for split in SPLITS:
        x, y = getattr(dev, f"x_{split}"), getattr(dev, f"y_{split}")
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            return f"x_{split}: expected a float32 array, got {getattr(x, 'dtype', type(x).__name__)}"
        if not isinstance(y, np.ndarray) or not np.issubdtype(y.dtype, np.integer) or y.ndim != 1:
            return f"y_{split}: expected a 1-d integer array, got {getattr(y, 'dtype', type(y).__name__)} {getattr(y, 'shape', '')}"
        if x.shape[1:] != tuple(input_shape):
            return f"x_{split}: samples of shape {x.shape[1:]}, expected input_shape {tuple(input_shape)}"
        if len(x) != len(y):
            return f"y_{split}: {len(y)} labels for {len(x)} samples in x_{split}"
        if split != "val" and len(y) == 0:
            return f"x_{split}: no samples"
        if len(y) and (y.min() < 0 or y.max() >= n_classes):
            bad = y[(y < 0) | (y >= n_classes)][0]
            return f"y_{split}: label {bad} outside 0..{n_classes - 1} (n_classes {n_classes})"
        if not np.isfinite(x).all():
            return f"x_{split}: {int((~np.isfinite(x)).sum())} non-finite values (NaN or inf)"
    return None


def _json_dumps(obj: object) -> str:
    import json

    return json.dumps(obj, sort_keys=True)
