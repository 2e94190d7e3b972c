"""Masks and per-token bookkeeping of the masked-diffusion log-prob estimators (docs/algorithms.md sections 5 and 7).

- d1's one-step mean-field estimate: every response token masked, each real prompt token masked with
  probability `p_mask_prompt`; one forward gives `log pi(o_d | masked input)` for every response position.
- DMPO's ELBO estimate: R antithetic masked copies of the response (prompt never masked), per-token
  `log p * |o| / m` averaged over the copies; its sum over the response is the sequence ELBO.
- the exact log-probs of the random-order sampler, re-scored from its recorded order.

Masks are seeded per row from `mask_seed` and the row's own tokens (prompt and response), never from its place
in the batch: the same rollout row gets the same masks in every micro-batch, for the policy, the old policy, the
reference model and under the negative condition (whose prompt masks are drawn from the same row stream).

Shapes: N rows, P prompt width (left padded), T response tokens, R masked copies.
"""
from __future__ import annotations

import hashlib
from typing import Iterator

import torch
from einops import rearrange

from mmrl.algorithms.dmpo import DEFAULT_MIN_MASK_RATE, antithetic_masks


def row_seeds(
    mask_seed: int, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor, salt: str
) -> list[int]:
    """A 63-bit seed per row from `mask_seed`, `salt` and the row's real prompt tokens and response tokens."""
    if isinstance(mask_seed, bool) or not isinstance(mask_seed, int):
        raise ValueError(f"mask_seed must be an int, got {mask_seed!r}")
    prompts = prompt_ids.detach().cpu().long()
    pmask = prompt_mask.detach().cpu().bool()
    responses = response_ids.detach().cpu().long()
    seeds = []
    for i in range(prompts.shape[0]):
        h = hashlib.blake2b(digest_size=8)
        h.update(f"{salt}:{mask_seed}:".encode())
        h.update(prompts[i][pmask[i]].numpy().tobytes())
        h.update(b"|")
        h.update(responses[i].numpy().tobytes())
        seeds.append(int.from_bytes(h.digest(), "little") >> 1)
    return seeds


def _generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def mean_field_prompt_mask(prompt_mask: torch.Tensor, p_mask_prompt: float, seeds: list[int]) -> torch.Tensor:
    """[N, P] bool: real prompt tokens to mask, each with probability `p_mask_prompt` (d1 `forward_process`).

    Row i draws one U(0, 1) per real prompt token (left to right) from its own seed, so the mask does not depend
    on the padding width of the batch.
    """
    if not 0.0 <= p_mask_prompt <= 1.0:
        raise ValueError(f"p_mask_prompt must be in [0, 1], got {p_mask_prompt}")
    pm = prompt_mask.detach().cpu().bool()
    out = torch.zeros_like(pm)  # [N, P]
    for i, seed in enumerate(seeds):
        n = int(pm[i].sum())
        if n:
            u = torch.rand(n, generator=_generator(seed))  # [n]
            out[i, pm[i]] = u < p_mask_prompt
    return out.to(prompt_mask.device)


def mean_field_input(
    prompt_ids: torch.Tensor, prompt_masked: torch.Tensor, response_ids: torch.Tensor, mask_id: int
) -> torch.Tensor:
    """[N, P + T] d1's one-step input: the prompt with `prompt_masked` positions masked, the response all masks."""
    prompt = torch.where(prompt_masked, torch.full_like(prompt_ids, mask_id), prompt_ids)  # [N, P]
    return torch.cat([prompt, torch.full_like(response_ids, mask_id)], dim=1)  # [N, P + T]


def elbo_masks(seeds: list[int], num_copies: int, length: int, device,
               min_rate: float = DEFAULT_MIN_MASK_RATE) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked [R, N, T] bool, rates [R, N]): `mmrl.algorithms.antithetic_masks` drawn row by row from the row seeds,
    rates `min_rate + (1 - min_rate) U` (DMPO's `loss_mask_prob_clamp` applies to these ELBO copies as to the WDCE
    ones: yuchen-zhu-zyc/DMPO `dmpo_trainer.py` `compute_log_prob_elbo`; the config's `dmpo_min_mask_rate`).

    Every response position is maskable (the whole generated span, post-EOS padding included, as DMPO's
    `compute_log_prob_elbo`); copies k and R/2 + k are complements when R is even.
    """
    if len(seeds) == 0:
        return torch.zeros(num_copies, 0, length, dtype=torch.bool, device=device), torch.zeros(num_copies, 0, device=device)
    maskable = torch.ones(1, length, dtype=torch.bool)  # [1, T]
    masks, rates = [], []
    for seed in seeds:
        m, r = antithetic_masks(maskable, num_copies, _generator(seed), min_rate=min_rate, antithetic=num_copies % 2 == 0)
        masks.append(m)  # [R, 1, T]
        rates.append(r)  # [R, 1]
    return torch.cat(masks, dim=1).to(device), torch.cat(rates, dim=1).to(device)


def masked_copies_input(
    prompt_ids: torch.Tensor, response_ids: torch.Tensor, masked: torch.Tensor, mask_id: int
) -> torch.Tensor:
    """[R * N, P + T]: copy r of row i (row r*N + i) is the prompt plus the response with `masked[r, i]` masked."""
    r = masked.shape[0]
    resp = torch.where(masked, torch.full_like(masked, mask_id, dtype=response_ids.dtype), response_ids[None])  # [R, N, T]
    prompt = prompt_ids[None].expand(r, -1, -1)  # [R, N, P]
    return rearrange(torch.cat([prompt, resp], dim=-1), "r n l -> (r n) l")  # [R*N, P+T]


def elbo_token_contributions(masked_logp: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """[R, N, T] log-probs and masks -> [N, T] per-token ELBO contributions.

    DMPO `compute_log_prob_elbo` (LLaDA's likelihood estimator with the 1/t weight, t = m/|o|): copy r contributes
    `log p(o_d | masked copy r) * |o| / m_r` at each of its masked positions, averaged over the R copies; the sum
    over d equals `mmrl.algorithms.elbo_from_masked_logp` (|o| = T, the generated span).
    """
    length = masked.shape[-1]
    m = masked.sum(-1, keepdim=True).clamp(min=1).to(masked_logp.dtype)  # [R, N, 1]
    per_copy = torch.where(masked, masked_logp, torch.zeros_like(masked_logp)) * (length / m)  # [R, N, T]
    return per_copy.mean(0)  # [N, T]


def fold_padding(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[N, T] per-token values -> the same with every post-EOS value added onto the row's last valid token.

    The sum over valid tokens then equals the sum over the whole generated span (DMPO scores post-EOS padding,
    `log_rnd_omit_eos=False`) while padding positions stay 0 (the `TokenScores` contract). Rows without padding
    are unchanged; a row with no valid token keeps nothing.
    """
    valid = valid.bool()
    pad_sum = torch.where(valid, torch.zeros_like(values), values).sum(-1)  # [N]
    last = (valid.long().cumsum(-1) == valid.long().sum(-1, keepdim=True)) & valid  # [N, T] last valid token
    kept = torch.where(valid, values, torch.zeros_like(values))  # [N, T]
    return kept + last.to(values.dtype) * pad_sum[:, None]


def exact_step_batches(
    order: torch.Tensor, rows_per_chunk: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (row [c], step [c]) chunks over every (response row, sampler step) pair that revealed a token.

    `order` [N, T] holds the sampler step of each response position (`generate_random_order`).
    """
    if rows_per_chunk < 1:
        raise ValueError(f"rows_per_chunk must be >= 1, got {rows_per_chunk}")
    n, _ = order.shape
    steps = int(order.max()) + 1 if order.numel() else 0
    hit = torch.zeros(n, steps + 1, dtype=torch.bool, device=order.device)  # [N, S + 1]; column S collects given (-1)
    hit.scatter_(1, torch.where(order >= 0, order, torch.full_like(order, steps)), True)
    hit = hit[:, :steps]
    rows, stps = hit.nonzero(as_tuple=True)  # [M], [M]
    for start in range(0, rows.shape[0], rows_per_chunk):
        yield rows[start : start + rows_per_chunk], stps[start : start + rows_per_chunk]


def exact_step_input(
    prompt_ids: torch.Tensor, response_ids: torch.Tensor, order: torch.Tensor, step: torch.Tensor, mask_id: int
) -> torch.Tensor:
    """[c, P + T] the sampler's input at `step[j]` for row j: response positions revealed before it, others masked."""
    hidden = order >= step[:, None]  # [c, T]
    resp = torch.where(hidden, torch.full_like(response_ids, mask_id), response_ids)  # [c, T]
    return torch.cat([prompt_ids, resp], dim=1)  # [c, P + T]
