"""Paired-bootstrap 95% intervals over test items and seeds, for the tiny world's comparisons.

Every comparison scores each test item (a GenEval prompt, a Countdown problem, a Sudoku puzzle) once per training
seed, so an arm's result is a score matrix `[S seeds, I items]` (each entry the mean over that item's samples). The
uncertainty of a reported figure has two sources, the finite test set and the seed-to-seed spread of training, and a
two-level nonparametric bootstrap resamples both (Efron & Tibshirani 1993, "An Introduction to the Bootstrap",
ch. 13, the percentile interval; the two-level resampling of a nested design follows Davison & Hinkley 1997,
"Bootstrap Methods and their Application", section 3.8):

- items are drawn with replacement **once per replicate and shared by every arm** (the pairing: a gain or a
  difference is measured on the same prompts, so item difficulty cancels);
- seeds are drawn with replacement **independently per arm** (two arms' seed-k runs are separate trainings);
- with `groups` (e.g. the GenEval task of each prompt), items are resampled within their group and the statistic is
  the mean over groups of the group means (GenEval's overall score), so every replicate keeps the task weights.

The interval is the 2.5 / 97.5 percentiles of the replicated statistic. A difference is claimed only when its
interval excludes 0 (`Interval.excludes_zero`). With one seed the seed level is degenerate and the interval covers the
test-set sampling error only; `n_seeds` in the result says so.

Pure functions of numpy arrays; a `seed` makes every interval reproducible.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

N_BOOT = 2000
"""Bootstrap replicates per interval (the percentile ends' Monte-Carlo error is then ~0.1 of the interval's width)."""
LEVEL = 0.95
"""Coverage of every reported interval."""
ZERO_TOLERANCE = 1e-12
"""An interval end within this of 0 counts as 0: a bootstrap mean of differences that is 0 exactly (e.g. the
percentile replicate where the arms tie) comes out as +-3e-17 after float summation, and must not be claimed."""


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile-bootstrap interval."""

    estimate: float
    low: float
    high: float
    n_items: int
    n_seeds: int
    """The fewest seed rows among the compared arms: 1 for a gain over the base, which is measured once (the arm's
    seeds are still all resampled), the smaller seed count for a difference of two arms."""
    level: float = LEVEL

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies entirely on one side of 0 (the only case in which a difference is claimed); an
        end that is 0 up to float rounding (`ZERO_TOLERANCE`) touches 0."""
        return self.low > ZERO_TOLERANCE or self.high < -ZERO_TOLERANCE

    def to_dict(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero}

    def fmt(self, scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
        """"+10.9 [+8.1, +13.5]" (`signed`) or "63.4 [61.0, 65.8]", in units of `scale` (100: points)."""
        f = f"{{:{'+' if signed else ''}.{digits}f}}"
        return f"{f.format(scale * self.estimate)} [{f.format(scale * self.low)}, {f.format(scale * self.high)}]"


def as_matrix(scores, name: str = "scores") -> np.ndarray:
    """`scores` as a float [S, I] matrix (a 1-D array is one seed); raises on empty or non-finite input."""
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must be a non-empty [seeds, items] array (or [items]), got shape {np.shape(scores)}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds non-finite values; every item needs a score in every seed")
    return x


def _item_weights_and_resampler(n_items: int, groups: Sequence | None, rng: np.random.Generator, n_boot: int):
    """(weights [I], resampled item indices [B, I]): uniform weights and plain resampling without groups; with
    groups, weight 1 / (G * n_g) per item of group g and resampling within each group (the group sizes, hence the
    weights, stay fixed in every replicate)."""
    if groups is None:
        return np.full(n_items, 1.0 / n_items), rng.integers(0, n_items, size=(n_boot, n_items))
    labels = list(groups)
    if len(labels) != n_items:
        raise ValueError(f"groups has {len(labels)} labels for {n_items} items")
    uniq = sorted(set(labels), key=labels.index)
    weights = np.empty(n_items)
    idx = np.empty((n_boot, n_items), dtype=np.int64)
    for g in uniq:
        members = np.array([i for i, lab in enumerate(labels) if lab == g])
        weights[members] = 1.0 / (len(uniq) * len(members))
        idx[:, members] = members[rng.integers(0, len(members), size=(n_boot, len(members)))]
    return weights, idx


def point_estimate(scores, groups: Sequence | None = None) -> float:
    """The statistic itself: the mean over seeds and items (with `groups`, the mean over groups of group means)."""
    x = as_matrix(scores)
    weights, _ = _item_weights_and_resampler(x.shape[1], groups, np.random.default_rng(0), 1)
    return float((x @ weights).mean())


def _replicates(x: np.ndarray, weights: np.ndarray, item_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[B] replicated statistics of one arm: its per-seed weighted item means under each shared item resample
    (`item_idx` [B, I]), averaged over an independent resample of its seeds."""
    n_boot = item_idx.shape[0]
    per_seed = (x[:, item_idx] * weights).sum(axis=-1)  # [S, B, I] -> [S, B]
    seed_idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))  # [B, S]
    return per_seed[seed_idx, np.arange(n_boot)[:, None]].mean(axis=1)  # [B]


def _interval(estimate: float, reps: np.ndarray, n_items: int, n_seeds: int, level: float) -> Interval:
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(reps, [alpha, 1.0 - alpha])
    return Interval(float(estimate), float(low), float(high), n_items, n_seeds, level)


def _check(level: float, n_boot: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be >= 100 for a percentile interval, got {n_boot}")


def mean_interval(scores, *, groups: Sequence | None = None, n_boot: int = N_BOOT, level: float = LEVEL,
                  seed: int = 0) -> Interval:
    """The interval of one arm's mean score; `scores` [S, I] (or [I])."""
    _check(level, n_boot)
    x = as_matrix(scores)
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(x.shape[1], groups, rng, n_boot)
    reps = _replicates(x, weights, item_idx, rng)
    return _interval(float((x @ weights).mean()), reps, x.shape[1], x.shape[0], level)


def difference_interval(a, b, *, groups: Sequence | None = None, n_boot: int = N_BOOT, level: float = LEVEL,
                        seed: int = 0) -> Interval:
    """The paired interval of mean(a) - mean(b) on the same items: `a` [S_a, I], `b` [S_b, I] (or [I]).

    Used for a gain (a = after RL, b = the base, one row per base measurement) and for a between-method difference
    (a, b = two arms). Items are shared by both arms in every replicate; seeds are resampled per arm."""
    _check(level, n_boot)
    xa, xb = as_matrix(a, "a"), as_matrix(b, "b")
    if xa.shape[1] != xb.shape[1]:
        raise ValueError(f"a and b must score the same items: {xa.shape[1]} vs {xb.shape[1]} items")
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(xa.shape[1], groups, rng, n_boot)
    reps = _replicates(xa, weights, item_idx, rng) - _replicates(xb, weights, item_idx, rng)
    est = float((xa @ weights).mean() - (xb @ weights).mean())
    return _interval(est, reps, xa.shape[1], min(xa.shape[0], xb.shape[0]), level)


def difference_of_differences_interval(a, b, c, d, *, groups: Sequence | None = None, n_boot: int = N_BOOT,
                                       level: float = LEVEL, seed: int = 0) -> Interval:
    """The paired interval of (mean(a) - mean(b)) - (mean(c) - mean(d)) on the same items, each [S_x, I] (or [I]):
    whether one difference (a - b, e.g. a KL-free arm over GRPO) is as large as another (c - d, e.g. DAPO's recipe
    over GRPO in another table on the same test items). Items are shared by all four in every replicate; seeds are
    resampled per arm (the bootstrap of the module docstring, on a contrast of four means)."""
    _check(level, n_boot)
    xs = [as_matrix(x, n) for x, n in ((a, "a"), (b, "b"), (c, "c"), (d, "d"))]
    if len({x.shape[1] for x in xs}) != 1:
        raise ValueError(f"a, b, c and d must score the same items: {[x.shape[1] for x in xs]} items")
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(xs[0].shape[1], groups, rng, n_boot)
    ra, rb, rc, rd = (_replicates(x, weights, item_idx, rng) for x in xs)
    ma, mb, mc, md = (float((x @ weights).mean()) for x in xs)
    return _interval((ma - mb) - (mc - md), (ra - rb) - (rc - rd), xs[0].shape[1], min(x.shape[0] for x in xs), level)


def gain_interval(after, base, **kw) -> Interval:
    """The paired interval of a gain over the base: `difference_interval(after, base)`."""
    return difference_interval(after, base, **kw)


def gap_closed_interval(after, base, reference, *, groups: Sequence | None = None, n_boot: int = N_BOOT,
                        level: float = LEVEL, seed: int = 0) -> Interval:
    """The share of the base-to-reference gap an arm closes, (mean(after) - mean(base)) / (mean(reference) -
    mean(base)), e.g. the reference being the same model pre-trained on clean data at the same compute; all three
    resampled on shared items (replicates with a gap of exactly 0 are dropped). Raises when the point gap is 0."""
    _check(level, n_boot)
    xa, xb, xr = as_matrix(after, "after"), as_matrix(base, "base"), as_matrix(reference, "reference")
    if not xa.shape[1] == xb.shape[1] == xr.shape[1]:
        raise ValueError(f"after, base and reference must score the same items: {xa.shape[1]}, {xb.shape[1]}, {xr.shape[1]}")
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(xa.shape[1], groups, rng, n_boot)
    ra, rb, rr = (_replicates(x, weights, item_idx, rng) for x in (xa, xb, xr))
    gap = float((xr @ weights).mean() - (xb @ weights).mean())
    if gap == 0.0:
        raise ValueError("the reference scores exactly the base: the share of the gap closed is undefined")
    est = float((xa @ weights).mean() - (xb @ weights).mean()) / gap
    ok = (rr - rb) != 0.0
    reps = (ra[ok] - rb[ok]) / (rr[ok] - rb[ok])
    return _interval(est, reps, xa.shape[1], xa.shape[0], level)


def _ratio_replicates(xn: np.ndarray, xd: np.ndarray, weights: np.ndarray, item_idx: np.ndarray,
                      rng: np.random.Generator) -> np.ndarray:
    """[B] replicated ratios mean(num) / mean(den) of one arm: numerator and denominator share every item and seed
    resample (they are two scores of the same runs); a replicate with a zero denominator is nan."""
    n_boot = item_idx.shape[0]
    num = np.stack([(xn[:, row] * weights).sum(axis=1) for row in item_idx], axis=1)  # [S, B]
    den = np.stack([(xd[:, row] * weights).sum(axis=1) for row in item_idx], axis=1)  # [S, B]
    seed_idx = rng.integers(0, xn.shape[0], size=(n_boot, xn.shape[0]))  # [B, S]
    cols = np.arange(n_boot)[:, None]
    n, d = num[seed_idx, cols].mean(axis=1), den[seed_idx, cols].mean(axis=1)  # [B]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, n / np.where(d > 0, d, 1.0), np.nan)


def _ratio_inputs(num, den, label: str) -> tuple[np.ndarray, np.ndarray]:
    xn, xd = as_matrix(num, f"{label} numerator"), as_matrix(den, f"{label} denominator")
    if xn.shape != xd.shape:
        raise ValueError(f"{label}: numerator and denominator must have the same [seeds, items] shape, got {xn.shape} and {xd.shape}")
    if (xd < 0).any():
        raise ValueError(f"{label}: the denominator must be >= 0 (a count or share of answers)")
    if xd.sum() == 0:
        raise ValueError(f"{label}: the denominator is 0 on every item: the ratio is undefined")
    return xn, xd


def ratio_interval(num, den, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0) -> Interval:
    """The interval of one arm's ratio of means, sum(num) / sum(den) over seeds and items (e.g. the accuracy among
    the answers that are not the shortcut: num = each item's share of right non-shortcut answers, den = its share of
    non-shortcut answers); `num`, `den` [S, I] (or [I]). Items and seeds are resampled together for both."""
    _check(level, n_boot)
    xn, xd = _ratio_inputs(num, den, "ratio")
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(xn.shape[1], None, rng, n_boot)
    reps = _ratio_replicates(xn, xd, weights, item_idx, rng)
    est = float((xn @ weights).mean() / (xd @ weights).mean())
    return _interval(est, reps[np.isfinite(reps)], xn.shape[1], xn.shape[0], level)


def ratio_difference_interval(num_a, den_a, num_b, den_b, *, n_boot: int = N_BOOT, level: float = LEVEL,
                              seed: int = 0) -> Interval:
    """The paired interval of ratio(a) - ratio(b) (`ratio_interval`) on the same items: items shared by both arms in
    every replicate, seeds resampled per arm (replicates with a zero denominator in either arm are dropped)."""
    _check(level, n_boot)
    an, ad = _ratio_inputs(num_a, den_a, "a")
    bn, bd = _ratio_inputs(num_b, den_b, "b")
    if an.shape[1] != bn.shape[1]:
        raise ValueError(f"a and b must score the same items: {an.shape[1]} vs {bn.shape[1]} items")
    rng = np.random.default_rng(seed)
    weights, item_idx = _item_weights_and_resampler(an.shape[1], None, rng, n_boot)
    reps = _ratio_replicates(an, ad, weights, item_idx, rng) - _ratio_replicates(bn, bd, weights, item_idx, rng)
    est = float((an @ weights).mean() / (ad @ weights).mean() - (bn @ weights).mean() / (bd @ weights).mean())
    return _interval(est, reps[np.isfinite(reps)], an.shape[1], min(an.shape[0], bn.shape[0]), level)
