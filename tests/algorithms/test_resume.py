"""A cold start interrupted mid-fit resumes from its snapshot and ends exactly as an
uninterrupted fit: every registered method, on digits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from clusterfed import registry
from clusterfed.algorithms import FedAvg
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario
from clusterfed.snapshot import StaleCheckpoint, decode, encode, load_snapshot, read_meta, save_snapshot

ROUNDS = 4
# Short schedules of the methods whose defaults run long before their rounds.
SHORT = {
    "faacl": {"init_epochs": 1, "max_rounds": 3},
    "fedclust": {"init_epochs": 1},
    "fedgroup": {"pretrain_epochs": 1},
    "flhc": {"cluster_round": 1},
    "stocfl": {"local_epochs": 1, "representation_epochs": 1},
    "flacc": {"local_epochs": 1},
    "cfl": {"start_round": 1},
}


class Crash(Exception):
    pass


def _engine(digits) -> Engine:
    fed = build_scenario(digits, "S2", group_sizes=[3, 3], seed=1)
    return Engine(fed, training=TrainingConfig(lr=0.05), device="cpu"), fed


def _method(name: str, **settings):
    cls = registry.get("coldstart", name)
    declared = {p.name for p in cls.declared()}
    return cls(rounds=ROUNDS, **{k: v for k, v in SHORT.get(name, {}).items() if k in declared}, **settings)


def _crash_after(engine: Engine, calls: int, monkeypatch) -> None:
    """Engine training raises from its ``calls``-th call on (a killed process)."""
    count = {"n": 0}
    for attr in ("train", "local_models"):
        honest = getattr(engine, attr)

        def failing(*args, _honest=honest, **kwargs):
            count["n"] += 1
            if count["n"] >= calls:
                raise Crash
            return _honest(*args, **kwargs)

        monkeypatch.setattr(engine, attr, failing)


def _same(a, b) -> None:
    assert a.algorithm == b.algorithm
    assert a.clusters == b.clusters
    assert a.history == b.history
    assert a.uploads == b.uploads and a.rejected_by_device == b.rejected_by_device
    assert np.array_equal(a.model_of_device, b.model_of_device)
    assert a.params.keys() == b.params.keys()
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k]), k


@pytest.mark.parametrize("name", sorted(registry.methods("coldstart", builtin_only=True)))
def test_an_interrupted_fit_resumes_to_the_same_result(name, digits, tmp_path, monkeypatch):
    _interrupt_and_resume(name, {}, digits, tmp_path, monkeypatch)


# What a choice needs beside it to be valid (the constructor refuses it alone).
NEEDS = {("fesem", "assignment"): {"centres": "random"}, ("flhc", "metric"): {"linkage": "single"}}


def _readings() -> list[tuple[str, dict]]:
    """Every non-default value of every method's choice parameter, one at a time."""
    out = []
    for name in sorted(registry.methods("coldstart", builtin_only=True)):
        for p in registry.get("coldstart", name).declared():
            for value in p.choices or ():
                if value != p.default:
                    out.append((name, {**NEEDS.get((name, p.name), {}), p.name: value}))
    return out


@pytest.mark.parametrize(("name", "settings"), _readings(), ids=lambda x: x if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()))
def test_each_reading_resumes_to_the_same_result(name, settings, digits, tmp_path, monkeypatch):
    """The state a non-default reading adds (FAACL's accumulated support sets, FedSoft's
    best-validated clusters, FeSEM's held models...) survives a snapshot: a run that
    crashes hours in resumes instead of failing or diverging."""
    _interrupt_and_resume(name, settings, digits, tmp_path, monkeypatch)


@pytest.mark.parametrize("settings", [{"serve": "local", "start": "own"}, {"K": 2}])
def test_fedsoft_resumes_the_state_of_each_reading(settings, digits, tmp_path, monkeypatch):
    """The state fields FedSoft's combined readings add (local models trained from each
    device's own, the clusters' draws) survive a snapshot."""
    _interrupt_and_resume("fedsoft", settings, digits, tmp_path, monkeypatch)


def test_fesem_as_flexcfl_runs_it_resumes(digits, tmp_path, monkeypatch):
    """FlexCFL's FeSEM holds one participant's local model as a centre and as what that
    participant holds: the state shares tensors, and its snapshot must still save."""
    flexcfl = {"centres": "random", "assignment": "previous", "m_step": "first", "serve": "received"}
    _interrupt_and_resume("fesem", flexcfl, digits, tmp_path, monkeypatch)


def _interrupt_and_resume(name: str, settings: dict, digits, tmp_path, monkeypatch) -> None:
    engine, fed = _engine(digits)
    kw = {"seed": 3, "ground_truth": fed.groups, "oracle_pools": fed.oracle_pools}
    whole = _method(name, **settings).fit(engine, **kw)

    # Run until some snapshot exists and crash a few engine calls later.
    crashed, ckpt = _engine(digits)[0], tmp_path / "ckpt"
    calls = {"n": 0}
    count_calls = crashed.train, crashed.local_models

    def counting(f):
        def wrapped(*args, **kwargs):
            calls["n"] += 1
            return f(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(crashed, "train", counting(count_calls[0]))
    monkeypatch.setattr(crashed, "local_models", counting(count_calls[1]))
    _method(name, **settings).fit(crashed, checkpoint=tmp_path / "probe", checkpoint_every=2, **kw)
    total = calls["n"]
    _crash_after(crashed, total, monkeypatch)  # dies in the last engine call
    with pytest.raises(Crash):
        _method(name, **settings).fit(crashed, checkpoint=ckpt, checkpoint_every=2, **kw)
    saved = read_meta(ckpt)
    assert saved is not None and 1 <= saved["round"] < len(whole.history)

    resumed = _method(name, **settings).fit(_engine(digits)[0], checkpoint=ckpt, checkpoint_every=2, **kw)
    _same(resumed, whole)


def test_a_fit_killed_after_init_resumes_without_redoing_it(digits, tmp_path, monkeypatch):
    """FAACL's initial training (Alg. 1) is snapshotted as round 0."""
    from clusterfed.algorithms import FAACL

    engine, fed = _engine(digits)
    whole = _method("faacl").fit(engine, seed=3)
    honest = FAACL.configure_round

    def crash(*args, **kwargs):
        raise Crash

    monkeypatch.setattr(FAACL, "configure_round", crash)
    with pytest.raises(Crash):
        _method("faacl").fit(_engine(digits)[0], seed=3, checkpoint=tmp_path / "ckpt")
    assert read_meta(tmp_path / "ckpt")["round"] == 0
    monkeypatch.setattr(FAACL, "configure_round", honest)
    monkeypatch.setattr(FAACL, "init", crash)  # resuming must not run it again
    resumed = _method("faacl").fit(_engine(digits)[0], seed=3, checkpoint=tmp_path / "ckpt")
    assert resumed.resumed_from_round == 0
    _same(resumed, whole)


def test_a_snapshot_of_other_settings_is_not_resumed(digits, tmp_path):
    engine, _ = _engine(digits)
    ckpt = tmp_path / "ckpt"
    FedAvg(rounds=3).fit(engine, seed=3, checkpoint=ckpt, checkpoint_every=1, fingerprint="data A")
    first = read_meta(ckpt)
    assert first["round"] == 3
    same = FedAvg(rounds=3).fit(engine, seed=3, checkpoint=ckpt, fingerprint="data A")
    assert same.resumed_from_round == 3  # finished: nothing left to train
    # Another caller fingerprint (other data): trained from scratch, snapshot replaced.
    with pytest.warns(StaleCheckpoint, match="snapshot written with other parameters or code.*the next snapshot overwrites it"):
        other = FedAvg(rounds=3).fit(engine, seed=3, checkpoint=ckpt, checkpoint_every=1, fingerprint="data B")
    assert other.resumed_from_round is None and read_meta(ckpt)["fingerprint"] != first["fingerprint"]
    whole = FedAvg(rounds=3).fit(_engine(digits)[0], seed=3)
    _same(same, whole)
    _same(other, whole)
    with pytest.raises(ValueError, match="checkpoint_every must be >= 1, got 0"):
        FedAvg(rounds=3).fit(engine, seed=3, checkpoint=ckpt, checkpoint_every=0)


def test_encode_decode_round_trips_a_state_tree():
    rng = np.random.default_rng(5)
    rng.random(3)
    gen = torch.Generator().manual_seed(7)
    torch.rand(2, generator=gen)
    tree = {
        "ints": (1, -2, 2**70), "floats": [0.1, float("inf")], "none": None, "text": "α",
        "array": np.arange(6, dtype=np.int32).reshape(2, 3), "flags": np.array([True, False]),
        "scalar": np.float32(1.5), "tensor": torch.linspace(0, 1, 5, dtype=torch.float64),
        "sets": frozenset({frozenset({1, 2}), frozenset()}), 3: {4, 5},
        "rng": rng, "gen": gen,
    }
    structure, tensors = encode(tree)
    back = decode(structure, tensors)
    assert back["ints"] == (1, -2, 2**70) and back["floats"] == [0.1, float("inf")] and back["none"] is None
    assert back["text"] == "α" and back[3] == {4, 5} and back["sets"] == tree["sets"]
    assert back["array"].dtype == np.int32 and np.array_equal(back["array"], tree["array"])
    assert back["flags"].dtype == np.bool_ and back["flags"].tolist() == [True, False]
    assert type(back["scalar"]) is np.float32 and back["scalar"] == 1.5
    assert back["tensor"].dtype == torch.float64 and torch.equal(back["tensor"], tree["tensor"])
    assert back["rng"].random() == rng.random()
    assert torch.equal(torch.rand(3, generator=back["gen"]), torch.rand(3, generator=gen))


def test_a_save_interrupted_between_its_renames_leaves_the_previous_snapshot(tmp_path, monkeypatch):
    where = tmp_path / "ckpt"
    save_snapshot(where, {"round": 1}, {"round": 1})
    real_rename = Path.rename

    def rename(self, target):
        if self.name == "ckpt.tmp":  # killed after the old one was moved aside
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        save_snapshot(where, {"round": 2}, {"round": 2})
    monkeypatch.setattr(Path, "rename", real_rename)
    assert not where.exists()
    assert read_meta(where) == {"round": 1} and load_snapshot(where) == ({"round": 1}, {"round": 1})
    save_snapshot(where, {"round": 3}, {"round": 3})
    assert read_meta(where) == {"round": 3} and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_encode_names_what_it_cannot_snapshot():
    with pytest.raises(TypeError, match=r"state\['x'\]\[1\]: cannot snapshot a value of type function"):
        encode({"x": [1, lambda: 0]})
    with pytest.raises(TypeError, match="state: cannot snapshot an array of dtype object"):
        encode(np.array([None]))


def test_decode_places_gpu_tensors_on_the_given_device_and_keeps_host_ones():
    """A snapshot taken on a GPU resumes on a CPU: what was on the GPU follows the
    engine, what was on the host (generators, host tensors) stays there."""
    gpu = {"$": "tensor", "key": "w", "device": "cuda:0"}
    host = {"$": "tensor", "key": "n", "device": "cpu"}
    tree = {"$": "dict", "items": [["w", gpu], ["n", host]]}
    tensors = {"w": torch.arange(3.0), "n": torch.arange(2)}
    out = decode(tree, tensors, accelerator="cpu")
    assert out["w"].device.type == "cpu" and out["w"].tolist() == [0.0, 1.0, 2.0]
    assert out["n"].device.type == "cpu" and out["n"].tolist() == [0, 1]
