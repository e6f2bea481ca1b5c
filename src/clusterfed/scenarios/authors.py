"""S1, S2, A1 and A2 as the thesis authors' public code builds them.

The thesis text (§3.3.2–3.3.3, Table B.3) leaves the construction open; the
authors' repository (FAACL/FAACL, ``utils/read_data.py`` and ``flearn/actor.py``)
fixes it, and this module follows those facts (DESIGN.md §9) in our own code:

- Pixels are standardised per pixel over *all* images of the dataset, train and
  test pooled (FedProx's MNIST generator): ``(v − μ) / (σ + 0.001)`` on the 0–255
  scale. They are never scaled back to [0, 1].
- FedProx users: user u holds digits ``u mod K`` and ``(u + 1) mod K``; each gets
  ``BASE_SAMPLES`` of each digit, then a power-law share (log-normal(0, 2) weights,
  one per digit, block of K users and slot) of the digit's remaining samples. Each
  user's samples are shuffled and split 90/10 into train / test.
- A device merges ``USERS_PER_DEVICE`` consecutive users (A2: ``A2_USERS_PER_DEVICE``,
  a scarce device only the first ``A2_SCARCE_USERS``, so digits 0–5 only).
  The changed concept is on the even-indexed devices:
  S1: even devices keep labels 0–4, odd 5–9; an out-of-range train sample gets a
  label drawn from all ten classes, an out-of-range test sample is dropped.
  S2: labels + 1 (mod K) on even devices. A1: even devices get the index-seeded
  Gaussian + salt & pepper noise of :func:`indexed_gaussian_and_salt_pepper` on train
  and test. A2: even devices are scarce and relabel 1 and 3 as 2, train and test.
- Noise comes before the validation split; each device then permutes its train
  data and holds out ``25% + 1`` of it as Z_d^val.
- Every random choice uses ``DATA_SEED`` (the authors re-seed every device with 0),
  so the federation is the same for every run seed; the run seed only seeds models
  and training.

Ground-truth groups: the concept index (S1: 0 = labels 0–4; S2/A1/A2: 1 = the
changed, noisy or scarce devices).

The oracle "Centralize" (``test-centralize.py`` with ``read_data(central=True)``)
trains one model per concept on pooled data and tests it on that concept's devices;
what it pools is set here (``Federation.oracle_pools``): S1 and S2 each concept's own
devices, A1 the noisy concept's model on *every* device's data, clean and noisy, and
A2 the scarce concept's model on the scarce devices plus device 1, the first abundant
device (their loop appends device 1's train data before keeping even devices only).
Their S2 oracle splits the users, not the devices, by parity; we pool the devices
of each concept, the same two concepts on about half of the images each.
"""

from __future__ import annotations

import numpy as np

from clusterfed.data import ArrayDataset
from clusterfed.scenarios.federation import DeviceSplits, Federation
from clusterfed.scenarios.noise import indexed_gaussian_and_salt_pepper

AUTHORS_SCENARIOS: tuple[str, ...] = ("S1", "S2", "A1", "A2")
DATA_SEED = 0
BASE_SAMPLES = 5
USERS_PER_DEVICE = 10
A2_USERS_PER_DEVICE = 20
A2_SCARCE_USERS = 5
A2_RELABEL = {1: 2, 3: 2}
TRAIN_SHARE = 0.9
STANDARDISE_EPS = 0.001


def default_users(dataset: ArrayDataset) -> int:
    """FedProx's 1000 users on MNIST-size data (≥ 20 000 images), 100 on smaller sets."""
    n = len(dataset.y_train) + len(dataset.y_test)
    return 1000 if n >= 20_000 else 100


def standardise(x: np.ndarray) -> np.ndarray:
    """Per-pixel standardisation over all rows, on the 0–255 scale (FedProx)."""
    v = x.reshape(len(x), -1).astype(np.float64) * 255.0
    mu, sigma = v.mean(0), v.std(0)
    return ((v - mu) / (sigma + STANDARDISE_EPS)).reshape(x.shape)


def fedprox_users(
    y: np.ndarray, n_users: int, n_classes: int, rng: np.random.Generator
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Indices (train, test) into ``y`` of each FedProx user.

    ``BASE_SAMPLES`` per user and digit (fewer on a small dataset, at least one),
    then the power-law shares; a share that would overrun its digit's pool is skipped,
    as in the generator.
    """
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(n_classes)]
    slots = np.zeros(n_classes, dtype=np.int64)
    for u in range(n_users):
        for j in range(2):
            slots[(u + j) % n_classes] += 1
    base = min(BASE_SAMPLES, int(min(len(p) // max(s, 1) for p, s in zip(pools, slots))))
    if base < 1:
        raise ValueError(
            f"scenario.users: {n_users} users need at least {int(slots.max())} samples of every "
            f"class, the smallest class has {min(len(p) for p in pools)}"
        )
    taken = np.zeros(n_classes, dtype=np.int64)
    parts: list[list[np.ndarray]] = [[] for _ in range(n_users)]
    for u in range(n_users):
        for j in range(2):
            c = (u + j) % n_classes
            parts[u].append(pools[c][taken[c] : taken[c] + base])
            taken[c] += base
    blocks = -(-n_users // n_classes)
    props = rng.lognormal(0.0, 2.0, (n_classes, blocks, 2))
    remaining = np.array([len(p) for p in pools]) - taken
    props = remaining[:, None, None] * props / props.sum((1, 2), keepdims=True)
    for u in range(n_users):
        for j in range(2):
            c = (u + j) % n_classes
            k = int(props[c, u // n_classes, j])
            if taken[c] + k < len(pools[c]):
                parts[u].append(pools[c][taken[c] : taken[c] + k])
                taken[c] += k
    users = []
    for u in range(n_users):
        idx = rng.permutation(np.concatenate(parts[u]))
        n_train = int(TRAIN_SHARE * len(idx))
        users.append((idx[:n_train], idx[n_train:]))
    return users


def build_authors_scenario(
    dataset: ArrayDataset,
    name: str,
    *,
    seed: int,
    users: int | None = None,
    gaussian_mean: float = 0.0,
    gaussian_variance: float = 0.4,
    salt_pepper_amount: float = 0.7,
) -> Federation:
    """The federation of scenario ``name`` under the authors' construction.

    ``users`` FedProx users (default :func:`default_users`) give ``users / 10``
    devices (A2: ``users / 20``). ``seed`` is recorded but does not change the data
    (every choice uses ``DATA_SEED``).
    """
    if name not in AUTHORS_SCENARIOS:
        raise ValueError(f"the authors' construction builds {AUTHORS_SCENARIOS}, not {name!r}")
    k = dataset.n_classes
    n_users = default_users(dataset) if users is None else int(users)
    per_device = A2_USERS_PER_DEVICE if name == "A2" else USERS_PER_DEVICE
    if n_users < 2 * per_device or n_users % per_device:
        raise ValueError(
            f"scenario.users: {name} merges {per_device} users per device and needs two devices; "
            f"{n_users} is not a multiple of {per_device} of at least {2 * per_device}"
        )
    rng = np.random.default_rng(DATA_SEED)
    x_all = np.concatenate([dataset.x_train, dataset.x_test])
    y_all = np.concatenate([dataset.y_train, dataset.y_test]).astype(np.int64)
    x_all = standardise(x_all)
    user_idx = fedprox_users(y_all, n_users, k, rng)
    n_devices = n_users // per_device
    half = np.arange(k) < (k + 1) // 2  # S1: labels 0..4 for K = 10

    devices, groups = [], []
    for d in range(n_devices):
        changed = d % 2 == 0
        members = range(d * per_device, d * per_device + (A2_SCARCE_USERS if name == "A2" and changed else per_device))
        tr = np.concatenate([user_idx[u][0] for u in members])
        te = np.concatenate([user_idx[u][1] for u in members])
        x, y = x_all[tr], y_all[tr].copy()
        x_test, y_test = x_all[te], y_all[te].copy()
        if name == "S1":
            in_range = np.flatnonzero(half if changed else ~half)
            out = ~np.isin(y, in_range)
            y[out] = rng.integers(0, k, size=int(out.sum()))
            keep = np.isin(y_test, in_range)
            x_test, y_test = x_test[keep], y_test[keep]
            groups.append(0 if changed else 1)
        elif name == "S2":
            if changed:
                y, y_test = (y + 1) % k, (y_test + 1) % k
            groups.append(int(changed))
        elif name == "A1":
            if changed:
                kw = dict(mean=gaussian_mean, variance=gaussian_variance, amount=salt_pepper_amount)
                x = indexed_gaussian_and_salt_pepper(x, **kw)
                x_test = indexed_gaussian_and_salt_pepper(x_test, **kw)
            groups.append(int(changed))
        else:  # A2
            if changed:
                for a, b in A2_RELABEL.items():
                    y[y == a], y_test[y_test == a] = b, b
            groups.append(int(changed))
        devices.append(_actor_splits(x, y, x_test, y_test))
    description = {
        "construction": "authors",
        "users": n_users,
        "users_per_device": per_device,
        "data_seed": DATA_SEED,
        "samples_per_device": [d.n_train + len(d.y_val) for d in devices],
        "test_samples_per_device": [len(d.y_test) for d in devices],
        "val_fraction": "25% + 1",
    }
    pools = oracle_pools(name, n_devices)
    if pools is not None:
        description["oracle_pools"] = pools
    return Federation(
        devices=tuple(devices),
        groups=np.asarray(groups, dtype=np.int64),
        n_classes=k,
        input_shape=tuple(dataset.x_train.shape[1:]),
        scenario=name,
        dataset=dataset.name,
        seed=seed,
        description=description,
    )


def oracle_pools(name: str, n_devices: int) -> list[list[int]] | None:
    """The devices the authors' Centralize pools for the clean / abundant (group 0,
    odd devices) and the noisy / scarce (group 1) model of A1 and A2; None for S1 and
    S2, whose oracle pools each group's own devices."""
    odd = list(range(1, n_devices, 2))
    if name == "A1":
        return [odd, list(range(n_devices))]
    if name == "A2":
        return [odd, sorted([*range(0, n_devices, 2), 1])]
    return None


def _actor_splits(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> DeviceSplits:
    """Permute the device's train data with seed 0 and hold out ``25% + 1`` of it."""
    order = np.random.default_rng(DATA_SEED).permutation(len(y))
    n_val = min(len(y) - 1, int(len(y) * 0.25) + 1)
    val, train = order[:n_val], order[n_val:]
    f32 = np.float32
    return DeviceSplits(
        x_train=x[train].astype(f32), y_train=y[train], x_val=x[val].astype(f32), y_val=y[val],
        x_test=x_test.astype(f32), y_test=y_test,
    )
