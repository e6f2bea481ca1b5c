"""The rejection rule: non-finite updates and norm outliers (k × leave-one-out median)."""

import math

import pytest
import torch

from clusterfed.engine.robust import RobustRule, accepted, clip_updates, screen, update_norms


def _stack(*rows):
    return {"w": torch.tensor(rows, dtype=torch.float32)}


def test_norms_are_of_the_update_and_nan_when_not_finite():
    start = _stack([1.0, 1.0], [1.0, 1.0], [0.0, 0.0])
    trained = _stack([4.0, 5.0], [1.0, float("inf")], [float("nan"), 0.0])
    norms = update_norms(trained, start)
    assert norms[0].item() == 5.0 and math.isnan(norms[1]) and math.isnan(norms[2])
    assert update_norms(_stack([3.0, 4.0])).tolist() == [5.0]


@pytest.mark.parametrize(
    "norms, k, expected",
    [
        ([1.0, 1.2, 0.9, 1.1], 10.0, [True, True, True, True]),
        ([1.0, 1.2, 0.9, 1e30], 10.0, [True, True, True, False]),       # 1e30 (finite) update
        ([1.0, 1.2, 0.9, 100.0], 10.0, [True, True, True, False]),      # sign-flipped x100
        ([1.0, 1.2, 0.9, 100.0], 200.0, [True, True, True, True]),
        ([1.0, float("nan"), 0.9, float("inf")], 10.0, [True, False, True, False]),
        ([1.0, 1e30], 10.0, [True, False]),                              # two devices: leave-one-out
        ([1.0, 5.0], 10.0, [True, True]),
        ([7.0], 10.0, [True]),                                           # nothing to compare with
        ([1.0, 1e30, 1e30], 10.0, [True, False, False]),                 # lower median: the small norm is the yardstick
        ([1.0, 1e30, 1.0, float("nan")], None, [True, True, True, False]),  # k=None: finite check only
    ],
)
def test_accepted_rows_follow_the_documented_rule(norms, k, expected):
    assert accepted(torch.tensor(norms, dtype=torch.float64), k).tolist() == expected


def test_screen_marks_rejected_rows_nan_and_clips_accepted_ones():
    start = _stack([0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0])
    trained = _stack([3.0, 4.0], [0.0, 4.0], [300.0, -400.0], [float("nan"), 1.0])
    rejected, rows = screen(trained, start, RobustRule(k=10.0))
    assert rejected.tolist() == [False, False, True, True]
    assert rows["w"][:2].tolist() == [[3.0, 4.0], [0.0, 4.0]] and bool(rows["w"][2:].isnan().all())
    rejected, rows = screen(trained, start, RobustRule(k=10.0, clip_norm=2.0))
    assert torch.allclose(rows["w"][:2], torch.tensor([[1.2, 1.6], [0.0, 2.0]]))
    assert clip_updates(trained, start, update_norms(trained, start), 1e9)["w"][0].tolist() == [3.0, 4.0]


# --- the engine's one rejection point, on digits --------------------------------------

import numpy as np  # noqa: E402

import clusterfed.engine.engine as engine_module  # noqa: E402
from clusterfed.algorithms import FedAvg  # noqa: E402
from clusterfed.engine import Engine, TrainingConfig  # noqa: E402
from clusterfed.engine.robust import RepeatedRejections, RobustRule, TooManyRejected, check_rejections  # noqa: E402
from clusterfed.scenarios import build_scenario  # noqa: E402


@pytest.mark.parametrize(
    "attack",
    [lambda s, v: torch.full_like(v, 1e30), lambda s, v: s - 100.0 * (v - s)],
    ids=["1e30", "sign-flipped-x100"],
)
def test_a_poisoned_device_is_rejected_every_round_and_fedavg_keeps_its_accuracy(digits, poison_uploads, attack):
    fed = build_scenario(digits, "S0", group_sizes=[5], seed=3)
    clean = FedAvg(rounds=8).fit(Engine(fed, training=TrainingConfig(lr=0.05), device="cpu"), seed=3)
    poison_uploads(2, attack)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    result = FedAvg(rounds=8).fit(engine, seed=3)
    honest = [d for d in range(5) if d != 2]
    assert abs(result.device_accuracy[honest].mean() - clean.device_accuracy[honest].mean()) < 0.01
    assert result.rejected_by_device == (0, 0, 8, 0, 0) and result.uploads == 40 and result.rejected_updates == 8
    assert [r["rejected_devices"] for r in result.history] == [[2]] * 8
    # without the outlier rule the same attack wrecks the model
    poison_uploads(2, attack)
    open_engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu", screening=RobustRule(k=None))
    assert FedAvg(rounds=8).fit(open_engine, seed=3).device_accuracy[honest].mean() < 0.5


def test_fisher_of_a_device_with_nan_data_is_left_out(digits):
    fed = build_scenario(digits, "S0", group_sizes=[4], seed=1)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    params = engine.init_params(1, torch.Generator().manual_seed(0), distinct=False)
    clean = engine.fisher(params, np.zeros(3, dtype=int), np.array([0, 1, 2]))
    engine.data.train.x[3] = float("nan")
    with engine.tally() as screened:
        fisher = engine.fisher(params, np.zeros(4, dtype=int), np.arange(4))
    assert all(torch.isfinite(v).all() for v in fisher.params.values())
    assert all(torch.allclose(fisher.params[k], clean.params[k]) for k in clean.params)  # device 3 weighs nothing
    assert fisher.rejected.tolist() == [3] and fisher.rejected_devices.tolist() == [3]
    assert screened.rejected_by_device.tolist() == [0, 0, 0, 1] and screened.uploads == 4


def test_too_many_rejections_fail_naming_the_devices():
    with pytest.warns(RepeatedRejections, match=r"^fedavg seed 10: uploads rejected 3 times or more: device 1 \(3\)\. "):
        check_rejections([0, 3, 0, 1], uploads=40, max_share=0.1, what="fedavg seed 10")  # 10%: fine
    with pytest.raises(TooManyRejected, match=r"fedavg seed 10: 9 of 40 uploads rejected \(22.5% > training.max_rejected_share 10%\): device 1 \(8\), device 3 \(1\)"):
        check_rejections([0, 8, 0, 1], uploads=40, max_share=0.1, what="fedavg seed 10")


def test_rejections_of_engine_calls_inside_hooks_reach_the_result(digits):
    """FedClust's init trains every device in its own engine call (a hook, not the
    driver's round): the device with NaN data is rejected there and in every round."""
    from clusterfed.algorithms import FedClust

    fed = build_scenario(digits, "S0", group_sizes=[4], seed=2)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    engine.data.train.x[2] = float("nan")
    result = FedClust(rounds=3, init_epochs=1).fit(engine, seed=0)
    assert result.rejected_by_device == (0, 0, 4, 0) and result.uploads == 4 + 3 * 4
    assert [r["rejected_devices"] for r in result.history] == [[2], [2], [2], [2]]  # init's round first


def test_tallies_nest_and_see_only_their_own_calls(digits):
    fed = build_scenario(digits, "S0", group_sizes=[3], seed=2)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    engine.data.train.x[1] = float("nan")
    gen = torch.Generator().manual_seed(0)
    params = engine.init_params(1, gen, distinct=False)
    pairs = np.zeros(3, dtype=int), np.arange(3)
    engine.train(params, *pairs, gen)  # no tally open: nothing counted anywhere
    with engine.tally() as outer:
        first = engine.train(params, *pairs, gen)
        with engine.tally() as inner:
            second = engine.local_models(params, *pairs, gen)
    assert first.rejected.tolist() == second.rejected.tolist() == [1] and first.uploads == 3
    assert inner.rejected_by_device.tolist() == [0, 1, 0] and inner.uploads == 3
    assert outer.rejected_by_device.tolist() == [0, 2, 0] and outer.uploads == 6
    assert outer.rejected_devices() == [1, 1]


def test_a_rejected_pooled_group_counts_against_no_device(digits):
    # The oracle trains on pooled groups, rows 0..G-1: a rejected row must not be
    # charged to the real devices 0..G-1 (they did not upload it).
    fed = build_scenario(digits, "S0", group_sizes=[3], seed=2)
    engine = Engine(fed, training=TrainingConfig(lr=0.05), device="cpu")
    data = engine.pooled([np.array([0]), np.array([1, 2])])
    data.x[1] = float("nan")  # group 1's pooled data
    gen = torch.Generator().manual_seed(0)
    params = engine.init_params(2, gen, distinct=False)
    with engine.tally() as tally:
        round_ = engine.train(params, np.arange(2), np.arange(2), gen, data=data)
    assert round_.rejected.tolist() == [1] and round_.devices.tolist() == [3, 4]
    assert tally.uploads == 2 and tally.rejected_by_device.tolist() == [0, 0, 0]
    assert all(torch.isfinite(v).all() for v in round_.params.values())  # group 1's model kept


def test_the_screening_defaults_have_one_home():
    from clusterfed.config import parse_params
    from clusterfed.engine.robust import CLIP_NORM, MAX_REJECTED_SHARE, OUTLIER_FACTOR

    training = parse_params({}).training
    assert (training.outlier_factor, training.clip_norm, training.max_rejected_share) == (30.0, None, 0.5)
    assert (OUTLIER_FACTOR, CLIP_NORM, MAX_REJECTED_SHARE) == (30.0, None, 0.5)
    assert (RobustRule().k, RobustRule().clip_norm) == (OUTLIER_FACTOR, CLIP_NORM)


def test_a_device_rejected_again_and_again_is_named_in_a_warning(recwarn):
    check_rejections([2, 0, 1, 2], uploads=40, max_share=0.5, what="fedclust seed 10")  # twice at most: silent
    assert not recwarn.list
    with pytest.warns(RepeatedRejections) as caught:
        check_rejections([0] * 65 + [13] + [3, 0], uploads=2000, max_share=0.5, what="fedclust seed 10")
    assert str(caught[0].message).startswith(
        "fedclust seed 10: uploads rejected 3 times or more: device 65 (13), device 66 (3). Either faulty, or "
        "honest and locked out")
