"""Token sampling for the autoregressive samplers: per-row random streams, top-k / top-p filtering, inverse-CDF draws.

Randomness is per response row, not per batch: each row n gets its own 63-bit seed, and its uniforms
`u[n, 0..T-1]` are drawn once from a generator seeded with it. The token at step t is the inverse CDF of the
filtered distribution at `u[n, t]`. A row's tokens therefore depend only on its seed and its own logits, never on
which other rows share the batch or how much left padding they add (the logits themselves agree to float
rounding, so a token flips only when `u` lies within ~1e-7 of a CDF boundary). Per-row seeds come from the
caller's `torch.Generator` (one draw of N seeds), so a seeded generator reproduces the whole rollout.
"""
from __future__ import annotations

from typing import Sequence

import torch

_SEED_HIGH = 2**62
"""Row seeds are drawn in [0, 2**62): positive, and far from the int64 limit."""


def row_seeds(num_rows: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[N] long (CPU): one seed per response row, drawn from `generator` (torch's default generator if None)."""
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.randint(0, _SEED_HIGH, (num_rows,), generator=generator, device=device).cpu()  # [N]


def row_uniforms(seeds: torch.Tensor | Sequence[int], num_steps: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[N, num_steps] float32 in [0, 1): row n is `torch.rand(num_steps)` from a CPU generator seeded with seeds[n].

    Drawn once before decoding, so the decode loop itself makes no generator calls.
    """
    seeds = torch.as_tensor(seeds, dtype=torch.long).cpu().tolist()
    out = torch.empty(len(seeds), num_steps, dtype=torch.float32)  # [N, T]
    gen = torch.Generator()
    for n, seed in enumerate(seeds):
        gen.manual_seed(int(seed))
        out[n] = torch.rand(num_steps, generator=gen)
    return out.to(device)


def top_k_keep(probs: torch.Tensor, top_k: int) -> torch.Tensor | None:
    """[N, V] bool: the `top_k` most probable tokens of each row, ties with the k-th kept (transformers'
    `TopKLogitsWarper` rule); None when `top_k <= 0` or `>= V` (keep all)."""
    if top_k <= 0 or top_k >= probs.shape[-1]:
        return None
    kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]  # [N, 1]
    return probs >= kth


TOP_P_CANDIDATES = 1024
"""`top_p_keep` first looks for the nucleus among this many most probable tokens (a `topk`, much cheaper than
sorting a 150k vocabulary); rows whose nucleus does not fit fall back to a full sort."""


def _nucleus_floor(sorted_probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """For probabilities sorted in descending order [N, K]: (probability of the least probable nucleus token [N, 1],
    number of nucleus tokens [N, 1]). A token is in the nucleus when the mass ranked strictly above it is < top_p."""
    mass_above = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # [N, K]
    count = (mass_above < top_p).sum(-1, keepdim=True).clamp_(min=1)  # [N, 1]
    return sorted_probs.gather(-1, count - 1), count


def top_p_keep(probs: torch.Tensor, top_p: float, *, candidates: int = TOP_P_CANDIDATES) -> torch.Tensor | None:
    """Nucleus filtering (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration") of normalised
    probabilities [N, V]: bool [N, V], or None when `top_p >= 1` (keep all).

    Keeps the most probable tokens until their mass reaches `top_p` (a token is kept when the mass ranked strictly
    above it is below `top_p`, so the top token always stays; the set transformers' `TopPLogitsWarper` keeps), and
    every token exactly tied with the least probable kept one: on exact ties (common in bf16) the kept set does not
    depend on how a sort orders them, so it is the same whatever else is in the batch.
    """
    if top_p >= 1.0:
        return None
    v = probs.shape[-1]
    k = min(candidates, v)
    top = torch.topk(probs, k, dim=-1).values  # [N, k] descending
    floor, count = _nucleus_floor(top, top_p)  # [N, 1]
    if k < v:
        # the nucleus (with its ties) may reach past the k candidates: sort those rows fully
        spill = ((count == k) | (top[:, -1:] == floor)).squeeze(-1)  # [N]
        if bool(spill.any()):
            full = torch.sort(probs[spill], dim=-1, descending=True).values  # [n, V]
            floor = floor.clone()
            floor[spill] = _nucleus_floor(full, top_p)[0]
    return probs >= floor


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """`logits` [N, V] with everything outside the top-k set (`top_k_keep`) at -inf."""
    keep = top_k_keep(logits, top_k)
    return logits if keep is None else logits.masked_fill(~keep, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float, *, candidates: int = TOP_P_CANDIDATES) -> torch.Tensor:
    """`logits` [N, V] with everything outside the nucleus of softmax(logits) (`top_p_keep`) at -inf."""
    keep = top_p_keep(torch.softmax(logits.float(), dim=-1), top_p, candidates=candidates)
    return logits if keep is None else logits.masked_fill(~keep, float("-inf"))


def inverse_cdf_from_probs(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [N] drawn in proportion to the non-negative `weights` [N, V] (normalised or not) with the uniforms
    u [N] in [0, 1), by inverting the CDF in vocabulary order: the first token whose cumulative weight exceeds
    `u * total`. The `right=True` search never lands on a zero-weight (filtered) token, and scaling by the row
    total keeps rounding in the float32 cumulative sum from pushing the target past the end."""
    cdf = torch.cumsum(weights, dim=-1)  # [N, V]
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)  # [N, 1]
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [N]
    return ids.clamp_(max=weights.shape[-1] - 1)


def inverse_cdf_draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [N] drawn from softmax(logits) [N, V] with the uniforms u [N] (`inverse_cdf_from_probs`)."""
    return inverse_cdf_from_probs(torch.softmax(logits, dim=-1), u)


def sample_next_tokens(
    scaled_logits: torch.Tensor,
    u: torch.Tensor,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    suppress_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step from float32 temperature-scaled logits [N, V] and uniforms u [N].

    Filters in the order transformers applies its warpers (suppressed ids, top-k, then top-p on the renormalised
    top-k distribution) and draws by inverse CDF. Returns (ids [N] long, log-probs [N] of the drawn tokens under the
    *unfiltered* softmax(scaled_logits), TRL's convention). One softmax serves the draw and the log-prob.
    """
    lse = torch.logsumexp(scaled_logits, dim=-1, keepdim=True)  # [N, 1]
    probs = (scaled_logits - lse).exp_()  # [N, V] unfiltered softmax
    weights = probs
    if suppress_ids is not None and suppress_ids.numel():
        weights = weights.index_fill(-1, suppress_ids, 0.0)
    keep = top_k_keep(weights, top_k)
    if keep is not None:
        weights = weights * keep
    if top_p < 1.0:
        keep = top_p_keep(weights / weights.sum(-1, keepdim=True), top_p)
        weights = weights * keep
    ids = inverse_cdf_from_probs(weights, u)  # [N]
    logp = scaled_logits.gather(-1, ids[:, None]).squeeze(-1) - lse.squeeze(-1)  # [N]
    return ids, logp
