"""The authors' construction of S1, S2, A1, A2 (scenarios/authors.py, DESIGN.md §9)."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.config import ParamsError, parse_params
from clusterfed.build import build_federation
from clusterfed.scenarios import NoiseParams, build_authors_scenario
from clusterfed.scenarios.authors import standardise
from clusterfed.scenarios.noise import indexed_gaussian_and_salt_pepper


def _labels(fed, devices, split="train"):
    return set(np.concatenate([getattr(fed.devices[d], f"y_{split}") for d in devices]).tolist())


def test_device_counts_groups_and_seed_independence(digits):
    for name, n in (("S1", 10), ("S2", 10), ("A1", 10), ("A2", 5)):
        fed = build_authors_scenario(digits, name, seed=10)
        assert fed.n_devices == n
        expected = [(d % 2) if name == "S1" else int(d % 2 == 0) for d in range(n)]
        assert fed.groups.tolist() == expected
        for dev in fed.devices:  # 25% + 1 of the device's train data is validation
            assert len(dev.y_val) == int((dev.n_train + len(dev.y_val)) * 0.25) + 1
    a, b = build_authors_scenario(digits, "A1", seed=10), build_authors_scenario(digits, "A1", seed=55)
    for da, db in zip(a.devices, b.devices):  # data seeded with 0 whatever the run seed
        np.testing.assert_array_equal(da.x_train, db.x_train)
        np.testing.assert_array_equal(da.y_test, db.y_test)


def test_pixels_are_standardised_over_all_images(digits):
    x = np.concatenate([digits.x_train, digits.x_test])
    z = standardise(x).reshape(len(x), -1)
    assert np.abs(z.mean(0)).max() < 1e-9
    varying = x.reshape(len(x), -1).std(0) > 0
    np.testing.assert_allclose(z.std(0)[varying], 1.0, atol=1e-2)
    assert (z[:, ~varying] == 0).all()


def test_s2_shifts_even_devices_and_a1_keeps_the_same_users(digits):
    s2 = build_authors_scenario(digits, "S2", seed=10)
    a1 = build_authors_scenario(digits, "A1", seed=10)
    for d, (ds, da) in enumerate(zip(s2.devices, a1.devices)):
        shift = 1 if d % 2 == 0 else 0
        np.testing.assert_array_equal(ds.y_train, (da.y_train + shift) % 10)
        np.testing.assert_array_equal(ds.y_test, (da.y_test + shift) % 10)
        if d % 2:  # clean devices of A1 hold the same standardised images as S2
            np.testing.assert_array_equal(ds.x_train, da.x_train)


def test_s1_label_rule(digits):
    fed = build_authors_scenario(digits, "S1", seed=10)
    s2 = build_authors_scenario(digits, "S2", seed=10)  # same users, true labels on odd devices
    even, odd = range(0, 10, 2), range(1, 10, 2)
    assert _labels(fed, even, "test") <= set(range(5)) and _labels(fed, odd, "test") <= set(range(5, 10))
    for d in odd:  # out-of-range test samples dropped, in-range kept
        assert len(fed.devices[d].y_test) == int((s2.devices[d].y_test >= 5).sum())
    # out-of-range train samples got a label from all ten classes, so both halves occur
    assert _labels(fed, even) == set(range(10)) and _labels(fed, odd) == set(range(10))


def test_s1_exclusive_keeps_each_device_s_in_range_samples_and_drops_the_others(digits):
    """The thesis text's S1 under the authors' construction: the same users, every
    in-range train sample kept (the same images), every other one dropped; the test
    split is the relabel reading's."""
    relabel = build_authors_scenario(digits, "S1", seed=10)
    exclusive = build_authors_scenario(digits, "S1", seed=10, s1_out_of_range="exclusive")
    s2 = build_authors_scenario(digits, "S2", seed=10)  # same users, true labels on odd devices
    assert exclusive.description["s1_out_of_range"] == "exclusive" and "s1_out_of_range" not in relabel.description
    for d, (r, e, s) in enumerate(zip(relabel.devices, exclusive.devices, s2.devices)):
        lo = 0 if d % 2 == 0 else 5
        y_true = np.concatenate([s.y_train, s.y_val]) - (1 if d % 2 == 0 else 0)  # undo S2's shift
        y_true %= 10
        x_true = np.concatenate([s.x_train, s.x_val]).reshape(len(y_true), -1)
        in_range = (y_true >= lo) & (y_true < lo + 5)
        y = np.concatenate([e.y_train, e.y_val])
        x = np.concatenate([e.x_train, e.x_val]).reshape(len(y), -1)
        assert len(y) == int(in_range.sum()) and set(y.tolist()) <= set(range(lo, lo + 5))
        key = lambda xs, ys: sorted(zip(map(bytes, xs), ys.tolist()))  # noqa: E731 (multiset of samples)
        assert key(x, y) == key(x_true[in_range], y_true[in_range])
        assert len(e.y_val) == int(len(y) * 0.25) + 1  # 25% + 1 of what is kept
        np.testing.assert_array_equal(e.x_test, r.x_test)
        np.testing.assert_array_equal(e.y_test, r.y_test)
    with pytest.raises(ValueError, match="s1_out_of_range must be one of"):
        build_authors_scenario(digits, "S1", seed=10, s1_out_of_range="drop")
    params = parse_params({"scenario": {"name": "S1", "construction": "authors", "s1_out_of_range": "exclusive"},
                           "continual": {"enabled": False}})
    assert build_federation(params, seed=10).description["s1_out_of_range"] == "exclusive"


def test_a2_scarce_devices_hold_digits_0_to_5_relabelled(digits):
    fed = build_authors_scenario(digits, "A2", seed=10)
    scarce, rich = np.flatnonzero(fed.groups == 1), np.flatnonzero(fed.groups == 0)
    assert scarce.tolist() == [0, 2, 4]
    for split in ("train", "test"):
        assert _labels(fed, scarce, split) == {0, 2, 4, 5}
        assert _labels(fed, rich, split) == set(range(10))
    assert max(fed.devices[d].n_train for d in scarce) < min(fed.devices[d].n_train for d in rich)


def test_a1_noise_values_on_noisy_devices(digits):
    fed = build_authors_scenario(digits, "A1", seed=10)
    for d, dev in enumerate(fed.devices):
        x = np.concatenate([dev.x_train, dev.x_val, dev.x_test])
        if d % 2 == 0:
            assert x.min() == -1.0 and x.max() == 1.0
            at_bound = np.isin(x, (-1.0, 1.0)).mean()
            assert 0.7 < at_bound < 0.85  # 70% salt & pepper plus clipped Gaussian values
        else:
            assert x.max() > 1.0  # clean standardised pixels are not clipped


def test_a1_on_test_false_scores_noisy_devices_on_clean_images(digits):
    noisy = build_authors_scenario(digits, "A1", seed=10)
    clean = build_authors_scenario(digits, "A1", seed=10, noise=NoiseParams(on_test=False))
    s0 = build_authors_scenario(digits, "A1", seed=10, concepts=np.zeros(noisy.n_devices, dtype=np.int64))
    for d in range(noisy.n_devices):
        np.testing.assert_array_equal(clean.devices[d].x_train, noisy.devices[d].x_train)
        np.testing.assert_array_equal(clean.devices[d].x_val, noisy.devices[d].x_val)
        np.testing.assert_array_equal(clean.devices[d].x_test, s0.devices[d].x_test)
    assert not np.array_equal(noisy.devices[0].x_test, clean.devices[0].x_test)
    params = parse_params({"scenario": {"name": "A1", "construction": "authors", "noise": {"on_test": False}}})
    via_params = build_federation(params, seed=10)
    assert via_params.devices[0].x_train.min() == -1.0 and via_params.devices[0].x_train.max() == 1.0
    assert via_params.devices[0].x_test.max() > 1.0  # clean standardised pixels are not clipped


def test_indexed_noise_is_the_same_for_sample_i_on_every_device():
    rng = np.random.default_rng(0)
    a = rng.normal(-0.3, 0.5, size=(4, 1, 8, 8))
    b = rng.normal(-0.3, 0.5, size=(6, 1, 8, 8))
    na, nb = (indexed_gaussian_and_salt_pepper(v, mean=0.0, variance=0.4, amount=0.7) for v in (a, b))
    for i in range(4):
        rs = np.random.RandomState(i)
        rs.normal(size=64)
        rs = np.random.RandomState(i)  # skimage re-seeds for the s&p call
        flipped = rs.random_sample(64) < 0.7
        salted = rs.random_sample(64) < 0.5
        for n in (na[i].ravel(), nb[i].ravel()):
            assert (n[flipped & salted] == 1.0).all() and (n[flipped & ~salted] == -1.0).all()
        np.testing.assert_array_equal(na[i].ravel()[flipped], nb[i].ravel()[flipped])
        gauss = np.random.RandomState(i).normal(0.0, 0.4**0.5, 64)
        inside = ~flipped & (np.abs(a[i].ravel() + gauss) < 1) & (np.abs(b[i].ravel() + gauss) < 1)
        np.testing.assert_allclose((na[i].ravel() - a[i].ravel())[inside], gauss[inside], atol=1e-6)
        np.testing.assert_allclose((nb[i].ravel() - b[i].ravel())[inside], gauss[inside], atol=1e-6)


def test_indexed_noise_matches_skimage_015_code_path():
    """The draws of skimage 0.15's random_noise: np.random.seed, normal, then
    np.random.choice([True, False]) for the flipped and salted masks."""
    x = np.random.default_rng(1).normal(-0.2, 0.6, size=(3, 50))
    ours = indexed_gaussian_and_salt_pepper(x, mean=0.0, variance=0.4, amount=0.7)
    for i, image in enumerate(x):
        np.random.seed(i)
        out = np.clip(image + np.random.normal(0.0, 0.4**0.5, image.shape), -1.0, 1.0)
        np.random.seed(i)
        flipped = np.random.choice([True, False], size=image.shape, p=[0.7, 0.3])
        salted = np.random.choice([True, False], size=image.shape, p=[0.5, 0.5])
        out[flipped & salted] = 1.0
        out[flipped & ~salted] = -1.0
        np.testing.assert_allclose(ours[i], out, atol=1e-6)


def test_indexed_noise_keeps_skimage_value_rules_when_installed():
    skimage_util = pytest.importorskip("skimage.util")
    image = np.random.default_rng(2).normal(-0.2, 0.6, size=(28, 28))
    ref = skimage_util.random_noise(image, mode="gaussian", mean=0, var=0.4, clip=True)
    ref = skimage_util.random_noise(ref, mode="s&p", amount=0.7, clip=True)
    ours = indexed_gaussian_and_salt_pepper(image[None], mean=0.0, variance=0.4, amount=0.7)[0]
    assert ref.min() == ours.min() == -1.0 and ref.max() == ours.max() == 1.0


def test_params_select_the_construction(digits):
    params = parse_params({"scenario": {"name": "A2", "construction": "authors"}, "continual": {"enabled": False}})
    fed = build_federation(params, seed=10)
    assert fed.n_devices == 5 and fed.description["construction"] == "authors"
    with pytest.raises(ParamsError, match="scenario.construction"):
        parse_params({"scenario": {"name": "S0", "construction": "authors"}, "continual": {"enabled": False}})
    assert parse_params({"scenario": {"name": "A1", "construction": "authors"}}).continual.enabled  # continual too
    with pytest.raises(ParamsError, match="scenario.users"):
        build_federation(parse_params({"scenario": {"name": "A2", "construction": "authors", "users": 30},
                                       "continual": {"enabled": False}}), seed=10)


def test_data_seed_redraws_the_power_law_and_nothing_else(digits):
    """FedProx's generator is unseeded: ``data_seed`` draws another federation of the
    same shape; 0 (the authors' re-seed) stays the default."""
    base = build_authors_scenario(digits, "S2", seed=10)
    explicit = build_authors_scenario(digits, "S2", seed=10, data_seed=0)
    other = build_authors_scenario(digits, "S2", seed=10, data_seed=1)
    assert base.description["samples_per_device"] == explicit.description["samples_per_device"] == [
        132, 110, 125, 180, 162, 182, 198, 144, 163, 114]
    assert other.description["samples_per_device"] == [186, 134, 141, 155, 113, 138, 199, 179, 157, 106]
    assert other.description["data_seed"] == 1 and base.description["data_seed"] == 0
    assert other.groups.tolist() == base.groups.tolist()
    params = parse_params({"scenario": {"name": "S2", "construction": "authors", "data_seed": 1},
                           "continual": {"enabled": False}})
    routed = build_federation(params, seed=10)
    assert routed.description["samples_per_device"] == other.description["samples_per_device"]
    with pytest.raises(ParamsError, match="scenario.data_seed"):
        parse_params({"scenario": {"name": "S2", "data_seed": 1}, "continual": {"enabled": False}})


def test_first_devices_keep_the_federations_first_devices_unchanged(digits):
    """The authors' FAACL ``--samplesize``: the first N devices, each exactly as in the
    whole federation (S1's random relabelling included), and every key routed."""
    for name in ("S1", "A1", "A2"):
        whole = build_authors_scenario(digits, name, seed=10)
        first = build_authors_scenario(digits, name, seed=10, first_devices=4)
        assert first.n_devices == 4 and first.description["first_devices"] == 4
        assert first.groups.tolist() == whole.groups[:4].tolist()
        for a, b in zip(first.devices, whole.devices[:4]):
            for f in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    a2 = build_authors_scenario(digits, "A2", seed=10, first_devices=3)  # scarce 0, 2; abundant 1
    assert a2.oracle_pools[1].tolist() == [0, 1, 2]
    params = parse_params({"scenario": {"name": "A1", "construction": "authors", "first_devices": 6}})
    assert build_federation(params, seed=10).n_devices == 6
    with pytest.raises(ParamsError, match=r"scenario.first_devices: A1 of 100 users has 10 devices"):
        parse_params({"scenario": {"name": "A1", "construction": "authors", "first_devices": 11}})
    with pytest.raises(ParamsError, match=r"needs 2 <= first_devices <= 5"):
        parse_params({"scenario": {"name": "A2", "construction": "authors", "first_devices": 1}})
    with pytest.raises(ParamsError, match="scenario.first_devices: read only by the authors' construction"):
        parse_params({"scenario": {"name": "A1", "first_devices": 4}})


def test_mnist_device_counts_and_a2_labels(mnist):
    s2 = build_authors_scenario(mnist, "S2", seed=10)
    assert s2.n_devices == 100 and np.bincount(s2.groups).tolist() == [50, 50]
    used = sum(d.n_train + len(d.y_val) + len(d.y_test) for d in s2.devices)
    assert 69_000 < used <= 70_000  # FedProx's users share (almost) all 70 000 images
    a2 = build_authors_scenario(mnist, "A2", seed=10)
    assert a2.n_devices == 50
    assert _labels(a2, np.flatnonzero(a2.groups == 1)) == {0, 2, 4, 5}
