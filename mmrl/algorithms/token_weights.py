"""Per-sequence normalizations that turn token scores into token weights (GCPO "hist", cdf; DGPO softmax).

All functions take scores [N, T] and the valid mask [N, T], work on each row's valid tokens only, return
float32 weights [N, T] that are exactly 0 on padding, and carry no gradient.
"""
from __future__ import annotations

import math

import torch

from mmrl.algorithms.registry import TOKEN_WEIGHTS


def rank_power_alpha(top_fraction: float = 0.4, target_mass: float = 0.8) -> float:
    """Exponent `alpha` such that under `w = p ** alpha` the top `top_fraction` of ranks carry `target_mass`.

    GCPO authors' code (`importance.py`, "hist"; derivation in the removed `rank(x/y)` comment):
    `integral_{1-x}^{1} q^a dq = y * integral_0^1 q^a dq` gives `(1-x)^(a+1) = 1-y`, so
    `a = ln(1-y) / ln(1-x) - 1` (= 2.1507 for x = 0.4, y = 0.8).
    """
    if not 0.0 < top_fraction < 1.0:
        raise ValueError(f"top_fraction must be in (0, 1), got {top_fraction}")
    if not top_fraction <= target_mass < 1.0:
        raise ValueError(f"target_mass must be in [top_fraction, 1) = [{top_fraction}, 1), got {target_mass}")
    return math.log(1.0 - target_mass) / math.log(1.0 - top_fraction) - 1.0


@torch.no_grad()
def average_ranks(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """1-based ascending ranks of each row's valid scores, ties sharing the average of their ranks.

    Returns (ranks [N, T] float64, 0 on padding; n [N, 1] number of valid tokens). Vectorised with one sort
    and two `searchsorted` calls: the average rank of x is `(#{y < x} + 1 + #{y <= x}) / 2` over valid y.
    Non-finite scores are clamped (+inf to the largest, -inf and NaN to the lowest float) so padding, which is
    placed at +inf, never ties with a valid score.
    """
    mask = mask.bool()
    s = scores.detach().double()  # [N, T]
    big = torch.finfo(torch.float64).max
    s = torch.nan_to_num(s, nan=-big, posinf=big, neginf=-big)  # [N, T]
    s = torch.where(mask, s, torch.full_like(s, math.inf))  # padding sorts last and is never <= a valid score
    sorted_s, _ = torch.sort(s, dim=-1)  # [N, T]
    below = torch.searchsorted(sorted_s, s, right=False).double()  # [N, T] #{y < x}
    upto = torch.searchsorted(sorted_s, s, right=True).double()  # [N, T] #{y <= x}
    ranks = torch.where(mask, (below + 1.0 + upto) / 2.0, torch.zeros_like(s))  # [N, T]
    n = mask.sum(-1, keepdim=True).double()  # [N, 1]
    return ranks, n


@TOKEN_WEIGHTS.register("rank_power")
@torch.no_grad()
def rank_power_weights(scores: torch.Tensor, mask: torch.Tensor, *, top_fraction: float = 0.4, target_mass: float = 0.8) -> torch.Tensor:
    """GCPO "hist" normalization: `w = (rank / n) ** alpha`, rescaled to mean 1 over each row's valid tokens.

    Source: GCPO authors' code (`jacklishufan/gcpo`, `compute_importance_weights`, normalization "hist");
    `alpha` from `rank_power_alpha`. Deviation: ties get the average of their ranks (the authors' `argsort`
    breaks ties arbitrarily), which makes the weights deterministic and equal for equal scores. A row with one
    valid token gets weight 1; a row without valid tokens gets all zeros.
    """
    alpha = rank_power_alpha(top_fraction, target_mass)
    ranks, n = average_ranks(scores, mask)  # [N, T], [N, 1]
    w = (ranks / n.clamp(min=1)) ** alpha  # [N, T]; padding has rank 0 -> 0
    w = w * n / w.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)  # [N, T] mean 1 over valid
    return w.float()


@TOKEN_WEIGHTS.register("cdf")
@torch.no_grad()
def cdf_weights(scores: torch.Tensor, mask: torch.Tensor, **_: object) -> torch.Tensor:
    """GCPO paper wording: the empirical CDF of the score within the sequence, `w = rank / n` in (0, 1].

    Source: GCPO paper, section 3 (rank-based "histogram equalization"). No rescaling, so the mean weight is
    `(n + 1) / (2n)`, not 1. Ties share the average rank.
    """
    ranks, n = average_ranks(scores, mask)  # [N, T], [N, 1]
    return (ranks / n.clamp(min=1)).float()  # [N, T]


@TOKEN_WEIGHTS.register("softmax")
@torch.no_grad()
def softmax_weights(scores: torch.Tensor, mask: torch.Tensor, *, tau: float = 0.5, **_: object) -> torch.Tensor:
    """DGPO redistribution: `w_t = n * softmax_t(s_t / tau)` over each row's valid tokens (mean 1, padding 0).

    Source: DGPO (arXiv 2605.03327) section 3.2 as reconstructed by two secondary sources (see
    docs/sources.md, "DGPO"). Computed as `e / mean(e)` with `e = exp(s/tau - max)`, which is the
    same number and gives exactly 1 when all scores of a row are equal.
    """
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    mask = mask.bool()
    z = torch.where(mask, scores.detach().float() / tau, torch.full_like(scores, -math.inf, dtype=torch.float32))  # [N, T]
    z = z - z.amax(-1, keepdim=True).nan_to_num(neginf=0.0)  # [N, T]
    e = torch.where(mask, torch.exp(z), torch.zeros_like(z))  # [N, T]
    n = mask.sum(-1, keepdim=True).float()  # [N, 1]
    return e * n / e.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # [N, T]
