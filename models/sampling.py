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


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` largest logits of each row (ties with the k-th kept), -inf elsewhere: [N, V] -> [N, V].

    Same rule as transformers' `TopKLogitsWarper`; `top_k <= 0` or `>= V` keeps everything.
    """
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [N, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"): [N, V] -> [N, V].

    Keeps the most probable tokens until their mass reaches `top_p`: a token is kept when the mass of the tokens
    ranked strictly above it is below `top_p` (so the top token is always kept). This is the set transformers'
    `TopPLogitsWarper` keeps. `top_p >= 1` keeps everything.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # [N, V]
    probs = torch.softmax(sorted_logits, dim=-1)  # [N, V]
    mass_above = torch.cumsum(probs, dim=-1) - probs  # [N, V] mass of tokens ranked strictly higher
    drop_sorted = mass_above >= top_p  # [N, V]
    drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)  # [N, V] back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def inverse_cdf_draw(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [N] drawn from softmax(logits) [N, V] with the uniforms u [N] in [0, 1), by inverting the CDF in
    vocabulary order: the first token whose cumulative probability exceeds `u * total`.

    `right=True` search never lands on a zero-probability (filtered) token, and scaling by the row total keeps
    rounding in the float32 cumulative sum from pushing the target past the end.
    """
    probs = torch.softmax(logits, dim=-1)  # [N, V]
    cdf = torch.cumsum(probs, dim=-1)  # [N, V]
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)  # [N, 1]
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # [N]
    return ids.clamp_(max=logits.shape[-1] - 1)


def sample_next_tokens(
    scaled_logits: torch.Tensor,
    u: torch.Tensor,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    suppress_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decoding step: filter the temperature-scaled logits [N, V] (suppressed ids, top-k, then top-p, the order
    transformers applies its warpers in) and draw one token per row with its uniform u [N]. Returns ids [N] long.
    """
    logits = scaled_logits
    if suppress_ids is not None and suppress_ids.numel():
        logits = logits.index_fill(-1, suppress_ids, float("-inf"))
    logits = filter_top_k(logits, top_k)
    logits = filter_top_p(logits, top_p)
    return inverse_cdf_draw(logits, u)
