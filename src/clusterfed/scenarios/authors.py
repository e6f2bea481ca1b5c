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
  label drawn from all ten classes, an out-of-range test sample is dropped
  (``s1_out_of_range="exclusive"``, the thesis text's §3.3.2, drops the out-of-range
  train samples too: the reading for the continual tables, which have no public code).
  S2: labels + 1 (mod K) on even devices. A1: even devices get the index-seeded
  Gaussian + salt & pepper noise of :func:`indexed_gaussian_and_salt_pepper` on train
  and test. A2: even devices are scarce and relabel 1 and 3 as 2, train and test.
- Noise comes before the validation split; each device then permutes its train
  data and holds out ``25% + 1`` of it as Z_d^val.
- ``test-FAACL.py`` trains only its first ``--samplesize`` devices
  (``first_devices``); thesis Table 3.7's MNIST runs train 20 devices a round.
- Every random choice uses the data seed, ``DATA_SEED`` = 0 by default (the authors
  re-seed every device with 0), so the federation is the same for every run seed; the
  run seed only seeds models and training. FedProx's generator itself is unseeded
  (``np.random.lognormal`` and ``random.shuffle`` without a seed), so the thesis ran on
  one unknown draw of the power law; other data seeds measure how much a figure
  moves with the draw.

Continual runs (their code has none; our assumptions, README "The authors'
construction"): ``concepts`` gives each device its concept at a timestep (the shared
schedules of ``continual/schedules.py``); a device keeps its users, and at timestep
t ≥ 1 every user draws new images of the same digits in the same numbers
(:func:`redrawn_users`, seeded by the data seed and t); t = 0 is the cold start's data.

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
from clusterfed.scenarios.static import S1_OUT_OF_RANGE, NoiseParams

AUTHORS_SCENARIOS: tuple[str, ...] = ("S1", "S2", "A1", "A2")
DATA_SEED = 0
BASE_SAMPLES = 5
USERS_PER_DEVICE = 10
A2_USERS_PER_DEVICE = 20
A2_SCARCE_USERS = 5
A2_RELABEL = {1: 2, 3: 2}
TRAIN_SHARE = 0.9
STANDARDISE_EPS = 0.001


def default_users(dataset: str) -> int:
    """FedProx's 1000 users on the MNIST-size datasets, 100 on digits (1797 images)."""
    return 100 if dataset == "digits" else 1000


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


def authors_devices(name: str, users: int, first_devices: int | None = None) -> int:
    """Devices of scenario ``name`` built from ``users`` FedProx users, or only the
    first ``first_devices`` of them; ValueError naming ``scenario.users`` or
    ``scenario.first_devices`` when they cannot be built."""
    if name not in AUTHORS_SCENARIOS:
        raise ValueError(f"the authors' construction builds {AUTHORS_SCENARIOS}, not {name!r}")
    per_device = A2_USERS_PER_DEVICE if name == "A2" else USERS_PER_DEVICE
    if users < 2 * per_device or users % per_device:
        raise ValueError(
            f"scenario.users: {name} merges {per_device} users per device and needs two devices; "
            f"{users} is not a multiple of {per_device} of at least {2 * per_device}"
        )
    built = users // per_device
    if first_devices is None:
        return built
    if not 2 <= first_devices <= built:
        raise ValueError(
            f"scenario.first_devices: {name} of {users} users has {built} devices; keeping the first "
            f"{first_devices} needs 2 <= first_devices <= {built}"
        )
    return first_devices


def cold_start_concepts(name: str, n_devices: int) -> np.ndarray:
    """The concept of each device in the cold-start scenario: the changed concept on
    the even devices (S1: concept 0 = labels 0–4 there; S2/A1/A2: concept 1)."""
    even = np.arange(n_devices) % 2 == 0
    return (~even if name == "S1" else even).astype(np.int64)


def redrawn_users(
    users: list[tuple[np.ndarray, np.ndarray]], y: np.ndarray, n_classes: int, rng: np.random.Generator
) -> list[tuple[np.ndarray, np.ndarray]]:
    """New samples for the same users: each user keeps how many images of each digit
    it holds and its train / test sizes, the images are drawn afresh (disjoint
    between users, as in the generator) from the whole dataset."""
    counts = np.stack([np.bincount(y[np.concatenate(u)], minlength=n_classes) for u in users])
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(n_classes)]
    starts = np.vstack([np.zeros(n_classes, dtype=np.int64), np.cumsum(counts, 0)[:-1]])
    out = []
    for u, (train, _) in enumerate(users):
        parts = [pools[c][starts[u, c] : starts[u, c] + counts[u, c]] for c in np.flatnonzero(counts[u])]
        idx = rng.permutation(np.concatenate(parts))
        out.append((idx[: len(train)], idx[len(train) :]))
    return out


def build_authors_scenario(
    dataset: ArrayDataset,
    name: str,
    *,
    seed: int,
    users: int | None = None,
    concepts: np.ndarray | None = None,
    timestep: int = 0,
    data_seed: int = DATA_SEED,
    noise: NoiseParams = NoiseParams(),
    first_devices: int | None = None,
    s1_out_of_range: str = "relabel",
) -> Federation:
    """The federation of scenario ``name`` under the authors' construction.

    ``users`` FedProx users (default :func:`default_users`) give ``users / 10``
    devices (A2: ``users / 20``). ``seed`` is recorded but does not change the data:
    every choice uses ``data_seed`` (the authors' 0 by default; their generator's
    own draw is unseeded, see the module docstring).

    ``concepts`` (default :func:`cold_start_concepts`) gives each device's concept:
    S1 concept c = the c-th half of the labels, S2 the label shift c, A1 / A2 concept
    1 = noisy / scarce. ``timestep`` t ≥ 1 gives every user new samples
    (:func:`redrawn_users`, seeded by ``(data_seed, t)``); t = 0 is the cold start's
    data, so the cold-start concepts at t = 0 give exactly the cold-start federation.
    ``noise`` is A1's noise (its ``salt_pepper_density`` is skimage's ``amount``);
    ``noise.on_test=False`` leaves the noisy devices' test images clean.
    ``first_devices`` keeps only the first devices of that federation, unchanged (the
    authors' FAACL ``--samplesize``: ``self.clients[:samplesize]``; thesis Table 3.7's
    MNIST runs train 20 devices a round); ``concepts`` then has that many entries.
    ``s1_out_of_range`` (S1 only): ``"relabel"`` gives an out-of-range train sample a
    label from all K classes (their code); ``"exclusive"`` drops it, so a device holds
    only its own range, as the thesis text describes S1.
    """
    if s1_out_of_range not in S1_OUT_OF_RANGE:
        raise ValueError(f"s1_out_of_range must be one of {S1_OUT_OF_RANGE}, got {s1_out_of_range!r}")
    k = dataset.n_classes
    n_users = default_users(dataset.name) if users is None else int(users)
    per_device = n_users // authors_devices(name, n_users)
    n_devices = authors_devices(name, n_users, first_devices)
    concepts = cold_start_concepts(name, n_devices) if concepts is None else np.asarray(concepts, dtype=np.int64)
    if concepts.shape != (n_devices,) or not set(concepts.tolist()) <= {0, 1}:
        raise ValueError(f"concepts: expected {n_devices} concepts 0 or 1, got {concepts.tolist()}")
    rng = np.random.default_rng(data_seed)
    x_all = np.concatenate([dataset.x_train, dataset.x_test])
    y_all = np.concatenate([dataset.y_train, dataset.y_test]).astype(np.int64)
    x_all = standardise(x_all)
    user_idx = fedprox_users(y_all, n_users, k, rng)
    if timestep:
        rng = np.random.default_rng([data_seed, timestep])
        user_idx = redrawn_users(user_idx, y_all, k, rng)
    halves = (np.arange(k) < (k + 1) // 2, np.arange(k) >= (k + 1) // 2)  # S1: labels 0..4, 5..9 for K = 10

    devices = []
    for d in range(n_devices):
        c = int(concepts[d])
        members = range(d * per_device, d * per_device + (A2_SCARCE_USERS if name == "A2" and c else per_device))
        tr = np.concatenate([user_idx[u][0] for u in members])
        te = np.concatenate([user_idx[u][1] for u in members])
        x, y = x_all[tr], y_all[tr].copy()
        x_test, y_test = x_all[te], y_all[te].copy()
        if name == "S1":
            in_range = np.flatnonzero(halves[c])
            out = ~np.isin(y, in_range)
            if s1_out_of_range == "exclusive":
                x, y = x[~out], y[~out]
            else:
                y[out] = rng.integers(0, k, size=int(out.sum()))
            keep = np.isin(y_test, in_range)
            x_test, y_test = x_test[keep], y_test[keep]
        elif name == "S2" and c:
            y, y_test = (y + 1) % k, (y_test + 1) % k
        elif name == "A1" and c:
            kw = dict(mean=noise.gaussian_mean, variance=noise.gaussian_variance, amount=noise.salt_pepper_density)
            x = indexed_gaussian_and_salt_pepper(x, **kw)
            if noise.on_test:
                x_test = indexed_gaussian_and_salt_pepper(x_test, **kw)
        elif name == "A2" and c:
            for a, b in A2_RELABEL.items():
                y[y == a], y_test[y_test == a] = b, b
        devices.append(_actor_splits(x, y, x_test, y_test, data_seed))
    description = {
        "construction": "authors",
        "users": n_users,
        "users_per_device": per_device,
        "data_seed": data_seed,
        "timestep": timestep,
        "first_devices": first_devices,
        **({"s1_out_of_range": s1_out_of_range} if name == "S1" and s1_out_of_range != "relabel" else {}),
        "samples_per_device": [d.n_train + len(d.y_val) for d in devices],
        "test_samples_per_device": [len(d.y_test) for d in devices],
        "val_fraction": "25% + 1",
    }
    pools = oracle_pools(name, concepts)
    if pools is not None:
        description["oracle_pools"] = pools
    return Federation(
        devices=tuple(devices),
        groups=concepts,
        n_classes=k,
        input_shape=tuple(dataset.x_train.shape[1:]),
        scenario=name,
        dataset=dataset.name,
        seed=seed,
        description=description,
    )


def oracle_pools(name: str, concepts: np.ndarray) -> list[list[int]] | None:
    """The devices the authors' Centralize pools for the clean / abundant (concept 0)
    and the noisy / scarce (concept 1) model of A1 and A2: A1's noisy model every
    device, A2's scarce model the scarce devices and the first abundant one (device 1
    in the cold start); None for S1 and S2 (each concept's own devices) and for a
    federation of one concept."""
    clean, changed = (np.flatnonzero(concepts == c).tolist() for c in (0, 1))
    if name not in ("A1", "A2") or not clean or not changed:
        return None
    if name == "A1":
        return [clean, list(range(len(concepts)))]
    return [clean, sorted([*changed, clean[0]])]


def _actor_splits(
    x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, data_seed: int
) -> DeviceSplits:
    """Permute the device's train data with the data seed (the authors' 0: every device
    the same seed) and hold out ``25% + 1`` of it."""
    order = np.random.default_rng(data_seed).permutation(len(y))
    n_val = min(len(y) - 1, int(len(y) * 0.25) + 1)
    val, train = order[:n_val], order[n_val:]
    f32 = np.float32
    return DeviceSplits(
        x_train=x[train].astype(f32), y_train=y[train], x_val=x[val].astype(f32), y_val=y[val],
        x_test=x_test.astype(f32), y_test=y_test,
    )
