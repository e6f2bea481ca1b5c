"""Scenarios S0–A2 produce the documented groups and concepts (thesis §3.3.2–3.3.3)."""

import numpy as np
import pytest

from clusterfed.scenarios import Federation, NoiseParams, ScarcityParams, build_scenario


def test_groups_follow_group_sizes_and_s0_is_one_concept(digits):
    fed = build_scenario(digits, "S2", group_sizes=[3, 5], seed=1)
    assert fed.groups.tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    s0 = build_scenario(digits, "S0", group_sizes=[4, 4], seed=1)
    assert s0.groups.tolist() == [0] * 8


def test_splits_are_disjoint_even_and_quarter_validation(digits):
    fed = build_scenario(digits, "S0", group_sizes=[10], seed=2)
    n_pool = len(digits.y_train) // 10
    for dev in fed.devices:
        assert len(dev.y_val) == round(n_pool * 0.25)
        assert dev.n_train + len(dev.y_val) == n_pool
        assert len(dev.y_test) == len(digits.y_test) // 10
    # devices draw consecutive slices of one permutation: their label counts add up
    # to the pool's first 10 * n_pool permuted samples, i.e. no sample is used twice
    labels = np.concatenate([np.concatenate([d.y_train, d.y_val]) for d in fed.devices])
    order = np.random.default_rng(2).permutation(len(digits.y_train))
    np.testing.assert_array_equal(np.sort(labels), np.sort(digits.y_train[order[: 10 * n_pool]]))


def test_s1_keeps_each_group_in_its_label_range(digits):
    fed = build_scenario(digits, "S1", group_sizes=[2, 2], seed=3)
    for dev, g in zip(fed.devices, fed.groups):
        allowed = set(range(0, 5)) if g == 0 else set(range(5, 10))
        for y in (dev.y_train, dev.y_val, dev.y_test):
            assert set(y.tolist()) <= allowed
        assert set(dev.y_train.tolist()) == allowed


def test_s1_exclusive_draws_only_in_range_samples_each_used_once(digits):
    """s1_out_of_range = "exclusive" (the thesis text): a device of range r takes the next
    100 samples of r from the seeded permutation, unrelabelled (validation first, as
    every split), so splits hold only r's labels at the full requested sizes and no
    sample is drawn twice; a request larger than a range's pool names the key and the
    labels."""
    fed = build_scenario(digits, "S1", group_sizes=[3, 3], seed=4, samples_per_device=100,
                         test_samples_per_device=20, s1_out_of_range="exclusive")
    order = np.random.default_rng(4).permutation(len(digits.y_train))
    pools = [order[np.isin(digits.y_train[order], r)] for r in (range(5), range(5, 10))]
    for d, (dev, g) in enumerate(zip(fed.devices, fed.groups)):
        taken = pools[g][(d % 3) * 100 : (d % 3 + 1) * 100]
        np.testing.assert_array_equal(np.concatenate([dev.y_val, dev.y_train]), digits.y_train[taken])
        np.testing.assert_array_equal(np.concatenate([dev.x_val, dev.x_train]), digits.x_train[taken])
        assert len(dev.y_test) == 20 and set(dev.y_test) <= set(range(5) if g == 0 else range(5, 10))
    with pytest.raises(ValueError, match=r"samples_per_device \(labels \[0, 1, 2, 3, 4\]\)"):
        build_scenario(digits, "S1", group_sizes=[8, 1], seed=4, samples_per_device=200, s1_out_of_range="exclusive")
    with pytest.raises(ValueError, match="s1_out_of_range must be one of"):
        build_scenario(digits, "S1", group_sizes=[1, 1], seed=4, s1_out_of_range="drop")


def test_s2_shifts_the_second_group_by_one(digits):
    plain = build_scenario(digits, "S0", group_sizes=[2, 2], seed=4)
    shifted = build_scenario(digits, "S2", group_sizes=[2, 2], seed=4)
    for d in range(4):
        shift = 0 if d < 2 else 1
        np.testing.assert_array_equal(shifted.devices[d].x_train, plain.devices[d].x_train)
        np.testing.assert_array_equal(shifted.devices[d].y_train, (plain.devices[d].y_train + shift) % 10)
        np.testing.assert_array_equal(shifted.devices[d].y_test, (plain.devices[d].y_test + shift) % 10)


def test_a1_adds_noise_to_the_second_group_only(digits):
    plain = build_scenario(digits, "S0", group_sizes=[2, 2], seed=5)
    noisy = build_scenario(digits, "A1", group_sizes=[2, 2], seed=5)
    for d in range(2):
        np.testing.assert_array_equal(noisy.devices[d].x_train, plain.devices[d].x_train)
    for d in range(2, 4):
        x = noisy.devices[d].x_train
        assert x.min() >= 0.0 and x.max() <= 1.0
        # salt & pepper density 0.7: about 70% of the pixels are exactly 0 or 1
        share = np.isin(x, (0.0, 1.0)).mean()
        assert 0.7 <= share <= 0.9
        np.testing.assert_array_equal(noisy.devices[d].y_train, plain.devices[d].y_train)


def test_a1_on_test_false_keeps_the_noisy_groups_test_images_clean(digits):
    noisy = build_scenario(digits, "A1", group_sizes=[2, 2], seed=5)
    clean_test = build_scenario(digits, "A1", group_sizes=[2, 2], seed=5, noise=NoiseParams(on_test=False))
    plain = build_scenario(digits, "S0", group_sizes=[2, 2], seed=5)
    for d in range(4):
        np.testing.assert_array_equal(clean_test.devices[d].x_test, plain.devices[d].x_test)
        np.testing.assert_array_equal(clean_test.devices[d].y_test, plain.devices[d].y_test)
    # the first noisy device draws its training noise before any test noise: identical
    np.testing.assert_array_equal(clean_test.devices[2].x_train, noisy.devices[2].x_train)
    assert not np.array_equal(noisy.devices[2].x_test, plain.devices[2].x_test)
    x = clean_test.devices[3].x_train
    assert 0.7 <= np.isin(x, (0.0, 1.0)).mean() <= 0.9  # the training images stay noisy


def test_a2_scarce_group_has_a_tenth_of_the_data_and_a_changed_class(digits):
    fed = build_scenario(digits, "A2", group_sizes=[2, 2], seed=6, scarcity=ScarcityParams(scarce_fraction=0.1, changed_class=3))
    pool = len(digits.y_train) // 4
    assert [d.n_train + len(d.y_val) for d in fed.devices] == [pool, pool, round(pool * 0.1), round(pool * 0.1)]
    for dev in fed.devices[2:]:
        assert 3 not in dev.y_train and 3 not in dev.y_test


def test_same_seed_same_federation_and_save_load_roundtrip(digits, tmp_path):
    a = build_scenario(digits, "A1", group_sizes=[2, 2], seed=7)
    b = build_scenario(digits, "A1", group_sizes=[2, 2], seed=7)
    c = build_scenario(digits, "A1", group_sizes=[2, 2], seed=8)
    np.testing.assert_array_equal(a.devices[3].x_train, b.devices[3].x_train)
    assert not np.array_equal(a.devices[3].x_train, c.devices[3].x_train)
    a.save(tmp_path / "fed.npz")
    loaded = Federation.load(tmp_path / "fed.npz")
    assert loaded.scenario == "A1" and loaded.groups.tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(loaded.devices[2].x_test, a.devices[2].x_test)


def test_bad_requests_name_the_parameter(digits):
    with pytest.raises(ValueError, match="samples_per_device"):
        build_scenario(digits, "S0", group_sizes=[10], seed=0, samples_per_device=1000)
    with pytest.raises(ValueError, match="unknown scenario"):
        build_scenario(digits, "S9", group_sizes=[2, 2], seed=0)
    with pytest.raises(ValueError, match="at least two groups"):
        build_scenario(digits, "S2", group_sizes=[4], seed=0)
