"""The continual scenario under the authors' construction (scenarios/authors.py,
README "The authors' construction"): the shared schedules, each device's FedProx
users at every timestep, new images per timestep, the authors' concepts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clusterfed import stages
from clusterfed.build import build_schedule, timestep_engines
from clusterfed.config import ParamsError, continual_devices, load_params, parse_params
from clusterfed.continual.schedules import multitask_schedule
from clusterfed.layout import RunLayout
from clusterfed.scenarios import build_authors_scenario
from clusterfed.scenarios.authors import cold_start_concepts, fedprox_users, redrawn_users


def _authors(name, **continual):
    return parse_params({
        "seeds": [10],
        "scenario": {"name": name, "construction": "authors"},
        "training": {"device": "cpu"},
        "continual": continual,
        "unsupervised": {"enabled": False},
    })


def _equal(a, b):
    return all(
        np.array_equal(getattr(da, f), getattr(db, f))
        for da, db in zip(a.devices, b.devices)
        for f in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")
    ) and np.array_equal(a.groups, b.groups)


def _labels(dev):
    return np.concatenate([dev.y_train, dev.y_val, dev.y_test])


def test_params_accept_the_authors_continual_grid():
    for name, n in (("S1", 10), ("S2", 10), ("A1", 10), ("A2", 5)):
        params = _authors(name, timesteps=4)
        assert continual_devices(params) == n
        assert build_schedule(params).tolist() == multitask_schedule(n, 4).tolist()
    mnist = parse_params({"data": {"dataset": "mnist", "root": "x"}, "scenario": {"name": "A2", "construction": "authors"}})
    assert continual_devices(mnist) == 50  # 1000 FedProx users, 20 per device
    assert build_schedule(_authors("A1", setting="sequential", timesteps=2)).tolist() == [[0, 0, 1]] * 10
    # the repository's params.yaml with dvc-style overrides (its continual.samples_per_device
    # is the thesis reading's: the authors' users size the devices)
    dvc = load_params(Path(__file__).parents[2] / "params.yaml", overrides={"scenario.construction": "authors", "scenario.name": "A2"})
    assert dvc.continual.enabled and build_schedule(dvc).shape == (5, dvc.continual.timesteps + 1)
    with pytest.raises(ParamsError, match=r"continual.schedule: shape \(6, 3\), expected \(10, 3\)"):
        _authors("A1", timesteps=2, schedule=[[0, 1, 0]] * 6)
    with pytest.raises(ParamsError, match="scenario.users: A2 merges 20 users"):
        parse_params({"scenario": {"name": "A2", "construction": "authors", "users": 30}})
    first = parse_params({"seeds": [10], "scenario": {"name": "A1", "construction": "authors", "first_devices": 6},
                          "training": {"device": "cpu"}, "continual": {"timesteps": 2}})
    assert continual_devices(first) == 6 and build_schedule(first).shape == (6, 3)
    assert timestep_engines(first, build_schedule(first), 10)(1).n_devices == 6


def test_users_keep_their_digits_and_sizes_with_new_disjoint_images(digits):
    y = np.concatenate([digits.y_train, digits.y_test])
    users = fedprox_users(y, 100, 10, np.random.default_rng(0))
    new = redrawn_users(users, y, 10, np.random.default_rng([0, 1]))
    for (tr, te), (ntr, nte) in zip(users, new):
        assert (len(ntr), len(nte)) == (len(tr), len(te))
        assert np.bincount(y[np.concatenate([ntr, nte])], minlength=10).tolist() == np.bincount(
            y[np.concatenate([tr, te])], minlength=10).tolist()
    drawn = np.concatenate([np.concatenate(u) for u in new])
    used = sum(len(tr) + len(te) for tr, te in users)
    assert len(np.unique(drawn)) == len(drawn) == used == 1725  # disjoint, as many images as at t = 0
    assert sum(not np.array_equal(a[0], b[0]) for a, b in zip(users, new)) == 100


def test_timesteps_are_determined_by_t_alone_and_t0_is_the_cold_start(digits):
    concepts = cold_start_concepts("A1", 10)
    cold = build_authors_scenario(digits, "A1", seed=10)
    assert _equal(build_authors_scenario(digits, "A1", seed=10, concepts=concepts, timestep=0), cold)
    t1 = build_authors_scenario(digits, "A1", seed=10, concepts=concepts, timestep=1)
    assert _equal(build_authors_scenario(digits, "A1", seed=55, concepts=concepts, timestep=1), t1)
    assert not _equal(t1, cold)
    assert not _equal(build_authors_scenario(digits, "A1", seed=10, concepts=concepts, timestep=2), t1)
    for a, b in zip(cold.devices, t1.devices):  # a device keeps its size and label counts
        assert (a.n_train, len(a.y_val), len(a.y_test)) == (b.n_train, len(b.y_val), len(b.y_test))
        assert np.bincount(_labels(a), minlength=10).tolist() == np.bincount(_labels(b), minlength=10).tolist()


def test_each_timestep_builds_the_schedules_concepts(digits):
    schedule = multitask_schedule(10, 3)  # devices 0-4 / 5-9 swap concepts every 2 timesteps
    for t in range(4):
        c = schedule[:, t]
        a1 = build_authors_scenario(digits, "A1", seed=10, concepts=c, timestep=t)
        assert a1.groups.tolist() == c.tolist()
        for d, dev in enumerate(a1.devices):
            x = np.concatenate([dev.x_train, dev.x_val, dev.x_test])
            assert (x.min() == -1.0 and x.max() == 1.0) if c[d] else x.max() > 1.0  # noisy iff concept 1
        assert [p.tolist() for p in a1.oracle_pools] == [np.flatnonzero(c == 0).tolist(), list(range(10))]
        s1 = build_authors_scenario(digits, "S1", seed=10, concepts=c, timestep=t)
        for d, dev in enumerate(s1.devices):
            assert set(dev.y_test.tolist()) <= (set(range(5, 10)) if c[d] else set(range(5)))
        zero, one = (build_authors_scenario(digits, "S2", seed=10, concepts=np.full(10, k), timestep=t) for k in (0, 1))
        for a, b in zip(zero.devices, one.devices):
            np.testing.assert_array_equal((a.y_train + 1) % 10, b.y_train)
    a2 = multitask_schedule(5, 2)  # 5 devices: 0-1 / 2-4
    for t in range(3):
        fed = build_authors_scenario(digits, "A2", seed=10, concepts=a2[:, t], timestep=t)
        rich = build_authors_scenario(digits, "A2", seed=10, concepts=np.zeros(5, dtype=int), timestep=t)
        for d in range(5):
            if a2[d, t]:  # scarce: its first 5 of 20 users, digits 0-5 with 1 and 3 labelled 2
                assert set(_labels(fed.devices[d]).tolist()) == {0, 2, 4, 5}
                assert fed.devices[d].n_train < rich.devices[d].n_train
            else:
                assert _equal(fed.subset([d]), rich.subset([d]))
        first_rich = int(np.flatnonzero(a2[:, t] == 0)[0])
        assert fed.oracle_pools[1].tolist() == sorted([*np.flatnonzero(a2[:, t] == 1), first_rich])


def test_the_continual_stage_runs_on_the_authors_construction(digits, tmp_path):
    params = _authors("A2", algorithms=["fedavg"], timesteps=2, rounds=1)
    layout = RunLayout(tmp_path)
    engine_at = timestep_engines(params, build_schedule(params), 10)
    assert [engine_at(t).n_devices for t in range(3)] == [5, 5, 5]
    stages.continual(params, layout, progress=False)
    run = json.loads(layout.continual_run("fedavg", 10).timesteps.read_text())
    assert [r["t"] for r in run["rows"]] == [0, 1, 2]
    assert [r["concept_of_device"] for r in run["rows"]] == multitask_schedule(5, 2).T.tolist()
    assert all(0.0 < r["accuracy"] <= 1.0 for r in run["rows"])
