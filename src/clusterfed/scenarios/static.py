"""The cold-start partitions S0, S1, S2, A1, A2 of thesis §3.3.2–3.3.3.

Every device draws disjoint samples from the dataset's train pool (split into
Z_d^train and Z_d^val) and test pool (Z_d^test); then the group's concept is applied:

- ``S0``: natural IID data, one concept.
- ``S1``: label ranges (two groups: labels 0–4 and 5–9). ``s1_out_of_range``:
  ``relabel`` (default, the authors' cold-start code): out-of-range train /
  validation samples get a random in-range label and out-of-range test samples are
  dropped; ``exclusive`` (the thesis text, §3.3.2: devices "exclusively receive data
  corresponding to labels 0-4"): each device draws its samples from its range only.
- ``S2``: predictor shift, group g maps y -> (y + g) mod K.
- ``A1``: group 0 clean, the other groups get Gaussian + salt & pepper noise
  (Table B.3) on all splits, or with ``noise.on_test: false`` on train and validation
  only (scored on clean test images).
- ``A2``: group 0 has abundant data; the other groups are scarce (``scarce_fraction``
  of the samples) with a slightly different predictor: ``changed_class`` is
  labelled ``changed_class + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from clusterfed.data import ArrayDataset
from clusterfed.hyperparams import Section
from clusterfed.scenarios.federation import DeviceSplits, Federation
from clusterfed.scenarios.noise import gaussian_and_salt_pepper

SCENARIOS: tuple[str, ...] = ("S0", "S1", "S2", "A1", "A2")
S1_OUT_OF_RANGE: tuple[str, ...] = ("relabel", "exclusive")


class NoiseParams(Section):
    """A1's noise, thesis Table B.3 (MNIST column by default); also ``scenario.noise``."""

    gaussian_mean: float = 0.0
    gaussian_variance: Annotated[float, Field(ge=0.0)] = 0.4
    salt_pepper_density: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7
    on_test: bool = True
    """The noisy devices' test images carry the noise too, as in the authors' cold-start
    code; false scores them on clean images, a reading the thesis text leaves open for
    the continual tables, which have no public code (benchmarks/RESULTS.md §8, session 42)."""


class ScarcityParams(Section):
    """A2: share of the per-device samples a scarce device gets, and its changed class
    (also ``scenario.scarcity``)."""

    scarce_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    changed_class: Annotated[int, Field(ge=0)] = 0


def build_scenario(
    dataset: ArrayDataset,
    name: str,
    *,
    group_sizes: tuple[int, ...] | list[int],
    seed: int,
    samples_per_device: int | None = None,
    test_samples_per_device: int | None = None,
    val_fraction: float = 0.25,
    noise: NoiseParams = NoiseParams(),
    scarcity: ScarcityParams = ScarcityParams(),
    s1_out_of_range: str = "relabel",
) -> Federation:
    """Build a federation of ``sum(group_sizes)`` devices for scenario ``name``.

    Parameters
    ----------
    dataset : ArrayDataset
        Source images; train and test pools are kept apart.
    name : {"S0", "S1", "S2", "A1", "A2"}
    group_sizes : list of int
        Devices per ground-truth group, in order (devices 0..g0-1 form group 0, ...).
        ``S0`` has a single concept, so all its devices are in group 0.
    seed : int
        Seeds every random choice; the same seed gives the same federation.
    samples_per_device : int, optional
        Train + validation samples of a (non-scarce) device. Default: the train pool
        split evenly over the devices.
    test_samples_per_device : int, optional
        Default: the test pool split evenly over the devices.
    val_fraction : float, default=0.25
        Share of a device's samples held out as Z_d^val (the authors' fixed 25%).
    s1_out_of_range : {"relabel", "exclusive"}, default="relabel"
        S1 only: what a device does with samples outside its label range (module docstring).
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; expected one of {SCENARIOS}")
    sizes = [int(s) for s in group_sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"group_sizes must be positive integers, got {group_sizes}")
    if name != "S0" and len(sizes) < 2:
        raise ValueError(f"scenario {name} needs at least two groups, got group_sizes={sizes}")
    groups = np.repeat(np.arange(len(sizes)), sizes)
    if name == "S0":
        groups = np.zeros(len(groups), dtype=np.int64)
    fed = federation_from_concepts(
        dataset,
        name,
        groups,
        n_concepts=len(sizes),
        seed=seed,
        samples_per_device=samples_per_device,
        test_samples_per_device=test_samples_per_device,
        val_fraction=val_fraction,
        noise=noise,
        scarcity=scarcity,
        s1_out_of_range=s1_out_of_range,
    )
    fed.description["group_sizes"] = sizes
    return fed


def federation_from_concepts(
    dataset: ArrayDataset,
    name: str,
    concepts: np.ndarray,
    *,
    n_concepts: int,
    seed: int,
    samples_per_device: int | None = None,
    test_samples_per_device: int | None = None,
    val_fraction: float = 0.25,
    noise: NoiseParams = NoiseParams(),
    scarcity: ScarcityParams = ScarcityParams(),
    s1_out_of_range: str = "relabel",
) -> Federation:
    """A federation where device d holds data of concept ``concepts[d]`` of scenario ``name``.

    Concept c of S1 is the c-th of ``n_concepts`` label ranges, of S2 the label shift
    c; concept 0 of A1/A2 is the clean/abundant one, any other the noisy/scarce one.
    Static scenarios use the ground-truth groups as concepts; continual schedules
    call this once per timestep with that timestep's column.
    """
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; expected one of {SCENARIOS}")
    if name == "S1" and n_concepts > dataset.n_classes:
        raise ValueError(f"S1 needs at most {dataset.n_classes} groups, got {n_concepts}")
    if s1_out_of_range not in S1_OUT_OF_RANGE:
        raise ValueError(f"s1_out_of_range must be one of {S1_OUT_OF_RANGE}, got {s1_out_of_range!r}")
    exclusive = name == "S1" and s1_out_of_range == "exclusive"
    concepts = np.asarray(concepts, dtype=np.int64)
    n_devices = len(concepts)
    rng = np.random.default_rng(seed)

    per_device = samples_per_device or len(dataset.y_train) // n_devices
    per_device_test = test_samples_per_device or len(dataset.y_test) // n_devices
    train_counts = np.full(n_devices, per_device)
    if name == "A2":
        scarce = max(2, int(round(per_device * scarcity.scarce_fraction)))
        train_counts[concepts > 0] = scarce
    test_counts = np.full(n_devices, per_device_test)
    label_ranges = np.array_split(np.arange(dataset.n_classes), n_concepts)
    pools = label_ranges if exclusive else None
    pool_of = concepts if exclusive else np.zeros(n_devices, dtype=np.int64)
    train_order = rng.permutation(len(dataset.y_train))
    test_order = rng.permutation(len(dataset.y_test))
    train_slices = _draws(train_order, dataset.y_train, pools, pool_of, train_counts, "samples_per_device")
    test_slices = _draws(test_order, dataset.y_test, pools, pool_of, test_counts, "test_samples_per_device")

    devices = []
    for d in range(n_devices):
        g = int(concepts[d])
        idx, test_idx = train_slices[d], test_slices[d]
        x, y = dataset.x_train[idx], dataset.y_train[idx].copy()
        x_test, y_test = dataset.x_test[test_idx], dataset.y_test[test_idx].copy()

        if name == "S1" and not exclusive:
            in_range = label_ranges[g]
            out = ~np.isin(y, in_range)
            y[out] = rng.choice(in_range, size=int(out.sum()))
            keep = np.isin(y_test, in_range)
            x_test, y_test = x_test[keep], y_test[keep]
        elif name == "S2":
            y = (y + g) % dataset.n_classes
            y_test = (y_test + g) % dataset.n_classes
        elif name == "A1" and g > 0:
            kw = dict(
                mean=noise.gaussian_mean,
                variance=noise.gaussian_variance,
                density=noise.salt_pepper_density,
                rng=rng,
            )
            x = gaussian_and_salt_pepper(x, **kw)
            if noise.on_test:
                x_test = gaussian_and_salt_pepper(x_test, **kw)
        elif name == "A2" and g > 0:
            c = scarcity.changed_class
            y[y == c] = (c + 1) % dataset.n_classes
            y_test[y_test == c] = (c + 1) % dataset.n_classes

        n_val = max(1, int(round(len(y) * val_fraction)))
        devices.append(
            DeviceSplits(
                x_train=x[n_val:],
                y_train=y[n_val:],
                x_val=x[:n_val],
                y_val=y[:n_val],
                x_test=x_test,
                y_test=y_test,
            )
        )
    return Federation(
        devices=tuple(devices),
        groups=concepts,
        n_classes=dataset.n_classes,
        input_shape=tuple(dataset.x_train.shape[1:]),
        scenario=name,
        dataset=dataset.name,
        seed=seed,
        description={
            "samples_per_device": per_device,
            "test_samples_per_device": per_device_test,
            "val_fraction": val_fraction,
        },
    )


def _draws(order: np.ndarray, y: np.ndarray, pools: list[np.ndarray] | None, pool_of: np.ndarray,
           counts: np.ndarray, key: str) -> list[np.ndarray]:
    """Each device's sample indices: consecutive, disjoint slices of ``order``, restricted
    to the labels of its pool ``pools[pool_of[d]]`` (``pools`` None: every label)."""
    restricted = [order] if pools is None else [order[np.isin(y[order], p)] for p in pools]
    for k, pool in enumerate(restricted):
        scope = "" if pools is None else f" (labels {pools[k].tolist()})"
        _check_pool(key + scope, int(counts[pool_of == k].sum()), len(pool))
    taken = np.zeros(len(restricted), dtype=np.int64)
    out = []
    for d, k in enumerate(pool_of.tolist()):
        out.append(restricted[k][taken[k] : taken[k] + counts[d]])
        taken[k] += counts[d]
    return out


def _check_pool(key: str, needed: int, available: int) -> None:
    if needed > available:
        raise ValueError(
            f"{key}: the devices need {needed} samples but the dataset pool has {available}"
        )
