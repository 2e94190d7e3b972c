"""mmrl.tiny_world.stats: paired-bootstrap intervals checked against hand-computed and analytically known cases."""
import numpy as np
import pytest

from mmrl.tiny_world.stats import (Interval, difference_interval, difference_of_differences_interval, gain_interval, gap_closed_interval, mean_interval,
                                   point_estimate, ratio_difference_interval, ratio_interval)


def test_constant_difference_gives_a_zero_width_interval():
    rng = np.random.default_rng(1)
    b = rng.random((5, 40))
    a = b + 0.25  # every item, every seed: exactly +0.25
    iv = difference_interval(a, b, n_boot=500)
    # seeds are resampled per arm, so a zero width needs the seeds of each arm to be alike too: use one base row
    iv1 = gain_interval(b[:1] + 0.25, b[:1], n_boot=500)
    assert iv1.estimate == pytest.approx(0.25) and iv1.low == pytest.approx(0.25) and iv1.high == pytest.approx(0.25)
    assert iv1.excludes_zero
    assert iv.estimate == pytest.approx(0.25) and iv.low < 0.25 < iv.high  # seed spread of the two arms is not paired


def test_identical_seeds_and_constant_shift_is_exact_with_several_seeds():
    row = np.linspace(0, 1, 30)
    a, b = np.tile(row + 0.1, (5, 1)), np.tile(row, (3, 1))
    iv = difference_interval(a, b, n_boot=300)
    assert (iv.low, iv.estimate, iv.high) == pytest.approx((0.1, 0.1, 0.1))
    assert iv.n_items == 30 and iv.n_seeds == 3


def test_two_binary_items_by_hand():
    # one seed, items [0, 1]: a replicate's mean is 0, 0.5 or 1 w.p. 1/4, 1/2, 1/4, so the 2.5% / 97.5% quantiles
    # are 0 and 1 and about half of the replicates sit at 0.5
    iv = mean_interval([0.0, 1.0], n_boot=4000, seed=3)
    assert iv.estimate == 0.5 and iv.low == 0.0 and iv.high == 1.0
    assert not Interval(0.1, -0.2, 0.3, 2, 1).excludes_zero


def test_width_matches_the_normal_theory_for_many_items():
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, size=400)
    iv = mean_interval(x, n_boot=4000)
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert (iv.high - iv.low) / 2 == pytest.approx(half, rel=0.1)
    assert iv.estimate == pytest.approx(x.mean())


def test_coverage_on_a_synthetic_normal_sample_is_near_95_percent():
    rng = np.random.default_rng(7)
    trials, hits = 300, 0
    for t in range(trials):
        x = rng.normal(0.3, 1.0, size=60)
        iv = mean_interval(x, n_boot=400, seed=t)
        hits += iv.low <= 0.3 <= iv.high
    # percentile bootstrap at n = 60: coverage slightly under 95%; binomial sd over 300 trials ~1.3 points
    assert 0.90 <= hits / trials <= 0.98


def test_seed_level_is_resampled():
    # every item scores the seed's level: the interval spans the seeds' spread, nothing from the items
    levels = np.array([0.2, 0.4, 0.6, 0.8, 1.0])
    x = np.repeat(levels[:, None], 50, axis=1)
    iv = mean_interval(x, n_boot=2000)
    assert iv.estimate == pytest.approx(0.6)
    assert 0.2 <= iv.low < 0.5 and 0.7 < iv.high <= 1.0


def test_groups_weight_every_group_equally_and_resample_within_groups():
    # group A: 1 item scoring 1, group B: 3 items scoring 0: overall (mean over groups) 0.5 in every replicate
    x = [1.0, 0.0, 0.0, 0.0]
    groups = ["A", "B", "B", "B"]
    assert point_estimate(x, groups) == 0.5
    iv = mean_interval(x, groups=groups, n_boot=500)
    assert (iv.low, iv.high) == (0.5, 0.5)
    assert point_estimate(x) == 0.25


def test_gap_closed_hand_computed():
    base, ref = np.zeros(10), np.ones(10)
    after = np.full(10, 0.25)
    iv = gap_closed_interval(after, base, ref, n_boot=200)
    assert (iv.low, iv.estimate, iv.high) == pytest.approx((0.25, 0.25, 0.25))
    with pytest.raises(ValueError, match="undefined"):
        gap_closed_interval(after, base, base, n_boot=200)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same items"):
        difference_interval(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="non-finite"):
        mean_interval([0.0, float("nan")])
    with pytest.raises(ValueError, match="level"):
        mean_interval([0.0, 1.0], level=1.5)
    with pytest.raises(ValueError, match="groups has"):
        mean_interval([0.0, 1.0], groups=["a"])


def test_ratio_is_the_ratio_of_pooled_means_by_hand():
    # accuracy among non-shortcut answers: item shares of right non-shortcut answers / of non-shortcut answers
    num = np.array([[0.5, 0.0, 0.25], [0.25, 0.25, 0.0]])  # [S=2, I=3]
    den = np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.0]])
    iv = ratio_interval(num, den, n_boot=500)
    assert iv.estimate == pytest.approx((1.25 / 6) / (3.25 / 6))  # sum(num) / sum(den) = 1.25 / 3.25, not the mean of item ratios
    assert iv.low <= iv.estimate <= iv.high and (iv.n_seeds, iv.n_items) == (2, 3)
    # a numerator proportional to the denominator gives that constant in every replicate: a zero-width interval
    rng = np.random.default_rng(0)
    d = rng.random((4, 30))
    c = ratio_interval(0.3 * d, d, n_boot=300)
    assert c.estimate == pytest.approx(0.3) and c.low == pytest.approx(0.3) and c.high == pytest.approx(0.3)
    # with a denominator of 1 everywhere the ratio is the plain mean and its interval the plain mean's
    m = rng.random((3, 25))
    r, p = ratio_interval(m, np.ones_like(m), n_boot=400, seed=3), mean_interval(m, n_boot=400, seed=3)
    assert r.estimate == pytest.approx(p.estimate)
    assert r.low == pytest.approx(p.low) and r.high == pytest.approx(p.high)


def test_ratio_difference_by_hand_and_refusals():
    rng = np.random.default_rng(2)
    d = rng.random((5, 40)) + 0.1
    iv = ratio_difference_interval(0.6 * d, d, 0.2 * d, d, n_boot=300)
    assert iv.estimate == pytest.approx(0.4) and iv.low == pytest.approx(0.4) and iv.high == pytest.approx(0.4)
    assert iv.excludes_zero
    noisy = ratio_difference_interval(rng.random((3, 40)) * d[:3], d[:3], rng.random((3, 40)) * d[:3], d[:3], n_boot=300)
    assert noisy.low < noisy.estimate < noisy.high and not noisy.excludes_zero  # same distribution: 0 inside
    with pytest.raises(ValueError, match="same"):
        ratio_interval(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="denominator is 0"):
        ratio_interval(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="same items"):
        ratio_difference_interval(np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 4)), np.ones((1, 4)))


def test_difference_of_differences_by_hand():
    # one seed each, items [0, 1]: (a - b) per item is [+1, 0] and (c - d) is [0, 0], so the contrast is the mean of
    # [+1, 0]: 0.5, and its replicates are 0, 0.5 or 1 (both items drawn alike, or one of each)
    a, b, c, d = [1.0, 1.0], [0.0, 1.0], [0.5, 0.5], [0.5, 0.5]
    iv = difference_of_differences_interval(a, b, c, d, n_boot=4000, seed=3)
    assert iv.estimate == 0.5 and iv.low == 0.0 and iv.high == 1.0 and iv.n_items == 2
    # the same shift in both differences, one row per arm: exactly 0 in every replicate
    row = np.linspace(0, 1, 20)
    iv0 = difference_of_differences_interval(row + 0.2, row, row * 0.5 + 0.2, row * 0.5, n_boot=300)
    assert (iv0.low, iv0.estimate, iv0.high) == pytest.approx((0.0, 0.0, 0.0))
    # with c == d it is a - b's own interval: the same estimate, the same item draws (c, d add no seed spread here)
    rng = np.random.default_rng(2)
    x, y = rng.random((3, 30)), rng.random((4, 30))
    assert difference_of_differences_interval(x, y, row[:1].repeat(30), row[:1].repeat(30)).estimate == pytest.approx(
        difference_interval(x, y).estimate)
    with pytest.raises(ValueError, match="same items"):
        difference_of_differences_interval([0.0, 1.0], [0.0, 1.0], [0.0], [1.0])


def test_an_interval_end_at_zero_up_to_float_rounding_is_not_claimed():
    """A percentile end that is 0 but for summation error (the arms tie in that replicate) touches 0: not claimed;
    the smallest real difference a score in [0, 1] over items can make is far above the tolerance."""
    from mmrl.tiny_world.stats import Interval, difference_interval

    assert not Interval(0.08, 2.8e-17, 0.16, 100, 1).excludes_zero
    assert not Interval(-0.08, -0.16, -2.8e-17, 100, 1).excludes_zero
    assert Interval(0.08, 1.0 / 1000, 0.16, 1000, 1).excludes_zero  # one item of 1,000 flipped
    assert Interval(-0.08, -0.16, -1.0 / 1000, 1000, 1).excludes_zero
    # the float rounding case built for real: 0.1 + 0.2 - 0.3 is 5.6e-17, not 0
    a, b = [0.1, 0.2, 0.7], [0.3, 0.0, 0.7]
    iv = difference_interval([a], [b])
    assert abs(iv.estimate) < 1e-15 and not iv.excludes_zero
