"""The MaskGIT / aMUSEd sampling schedule as pure functions, and the sampler loop of the `masked_image` family.

Source: Chang et al. 2022, "MaskGIT", section 3.2 (iterative decoding with a cosine mask schedule), as aMUSEd runs
it (Patil et al. 2024; diffusers `schedulers/scheduling_amused.py` `AmusedScheduler.step` and
`pipelines/deprecated/amused/pipeline_amused.py`). Written here because the scheduler returns no per-token
probabilities and the pipeline runs under `no_grad` with one batch-wide generator. One step s = 0..S-1 on a state
x_s [N, T] (T image tokens, masked positions hold the mask id):

1. logits `l = transformer(x_s)` [N, T, V], guided `l_u + w (l_c - l_u)` (`cfg_logits`);
2. every masked position draws a token from `softmax(l / tau)` (tau = 1 in aMUSEd); visible ones keep theirs;
3. unless s is the last step, `mask_len = max(1, min(#masked - 1, floor(T cos(pi/2 (s+1)/S))))` positions are masked
   again: those of lowest confidence `log p(drawn token) + t_s g`, g Gumbel noise, t_s the remasking temperature
   (linear from `temperature[0]` to `temperature[1]` over the steps; visible positions have infinite confidence).

A position unmasked at step s keeps its token to the end, so the state of every step is a function of the final
tokens and the step at which each position was revealed (`order` [N, T]): `state_at_step`. That is what makes the
per-step log-probs of the family (`log p(o_d | x_{order_d})`) re-computable teacher-forced.

Randomness is per response row: row n owns a `torch.Generator`; per step it draws the tokens with
`torch.multinomial(probs_n [T, V], 1)` and then T uniforms for the Gumbel noise, the very draws `AmusedScheduler.step`
makes for a batch of one image, so a row with seed k reproduces `AmusedPipeline(generator=manual_seed(k))`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

SCHEDULES = ("cosine", "linear")
"""Mask-ratio schedules of `AmusedScheduler` (`masking_schedule`)."""


def mask_ratio(step: int, num_steps: int, schedule: str = "cosine") -> torch.Tensor:
    """Fraction of tokens left masked after step `step` of `num_steps` (a 0-dim float32 tensor): cos(pi/2 r) or
    1 - r with r = (step + 1) / num_steps (MaskGIT eq. 3's cosine schedule)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown masking schedule {schedule!r}; valid: {list(SCHEDULES)}")
    ratio = (torch.tensor(step) + 1) / num_steps
    return torch.cos(ratio * math.pi / 2) if schedule == "cosine" else 1 - ratio


def num_to_mask(num_masked: torch.Tensor, seq_len: int, ratio: torch.Tensor) -> torch.Tensor:
    """[N] long: how many positions stay masked after a step: `floor(T ratio)`, at most one fewer than are masked
    now, at least 1 (`AmusedScheduler.step`)."""
    target = (seq_len * ratio).floor()  # float32
    return torch.clamp(torch.minimum(num_masked.to(target.dtype) - 1, target), min=1).long()  # [N]


def remask_temperatures(num_steps: int, temperature: float | Sequence[float]) -> torch.Tensor:
    """[S] remasking temperatures t_s: linear from `temperature[0]` to `temperature[1]`, or from a single value to
    0.01 (`AmusedScheduler.set_timesteps`; aMUSEd's default (2, 0))."""
    if isinstance(temperature, (tuple, list)):
        if len(temperature) != 2:
            raise ValueError(f"remask_temperature must be a number or a pair (start, end), got {temperature!r}")
        return torch.linspace(float(temperature[0]), float(temperature[1]), num_steps)
    return torch.linspace(float(temperature), 0.01, num_steps)


def gumbel(uniforms: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from uniforms in [0, 1): `-log(-log u)`, both logs clamped at 1e-20 (as aMUSEd)."""
    return -torch.log((-torch.log(uniforms.clamp(1e-20))).clamp(1e-20))


def remask(drawn_probs: torch.Tensor, masked: torch.Tensor, count: torch.Tensor, temperature: torch.Tensor,
           uniforms: torch.Tensor) -> torch.Tensor:
    """[N, T] bool: the positions masked again after a step (MaskGIT's confidence rule, `mask_by_random_topk`).

    Args: drawn_probs [N, T] probability of each position's drawn token, masked [N, T] the positions that were
    masked before the step (the others can never be chosen), count [N] how many to mask, temperature (0-dim) the
    Gumbel weight t_s, uniforms [N, T] for the noise.
    """
    probs = torch.where(masked, drawn_probs, torch.finfo(drawn_probs.dtype).max)  # [N, T]
    confidence = torch.log(probs.clamp(1e-20)) + temperature * gumbel(uniforms)  # [N, T]
    cut = torch.sort(confidence, dim=-1).values.gather(1, count[:, None])  # [N, 1]
    return confidence < cut


def cfg_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance `uncond + scale * (cond - uncond)` ([..., V] each; aMUSEd's pipeline). Scale 1
    returns `cond` itself."""
    if scale == 1.0:
        return cond
    return uncond + scale * (cond - uncond)


def state_at_step(tokens: torch.Tensor, order: torch.Tensor, step: int | torch.Tensor, mask_id: int) -> torch.Tensor:
    """[N, T] the sampler's input at `step`: positions revealed at earlier steps (`order < step`) hold their final
    token, the rest the mask id. `step` is an int or [N]."""
    step = torch.as_tensor(step, device=order.device)
    hidden = order >= (step[:, None] if step.dim() else step)  # [N, T]
    return torch.where(hidden, torch.full_like(tokens, mask_id), tokens)


@torch.no_grad()
def maskgit_sample(
    logits_fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    generators: Sequence[torch.Generator],
    *,
    num_tokens: int,
    mask_id: int,
    num_steps: int,
    cfg_scale: float,
    temperature: float = 1.0,
    remask_temperature: float | Sequence[float] = (2.0, 0.0),
    schedule: str = "cosine",
) -> dict[str, torch.Tensor]:
    """Run the schedule; returns {"tokens" [N, T] long, "order" [N, T] long (step each position was revealed),
    "cond_logp" [N, T], "guided_logp" [N, T] (float32 log-probs of the revealed tokens at their step, at
    temperature `temperature`)}.

    Args:
        logits_fn: state [N, T] -> (conditional logits [N, T, V], unconditional logits [N, T, V] or None when
            `cfg_scale == 1`).
        generators: one CPU `torch.Generator` per row.
        temperature: tau of the token draw `softmax(guided / tau)` (aMUSEd: 1).
        remask_temperature: the Gumbel weights of the remasking (`remask_temperatures`).
    """
    n = len(generators)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    temps = remask_temperatures(num_steps, remask_temperature)  # [S]
    device = None
    x = order = cond_lp = guided_lp = None
    for s in range(num_steps):
        cond, uncond = logits_fn(x if x is not None else _all_masked(n, num_tokens, mask_id, device))
        device = cond.device
        if x is None:
            x = _all_masked(n, num_tokens, mask_id, device)
            order = torch.full((n, num_tokens), -1, dtype=torch.long, device=device)
            cond_lp = torch.zeros(n, num_tokens, device=device)
            guided_lp = torch.zeros(n, num_tokens, device=device)
        guided = cfg_logits(cond, uncond, cfg_scale) if uncond is not None else cond  # [N, T, V]
        scaled = guided if temperature == 1.0 else guided / temperature
        probs = scaled.softmax(-1)  # [N, T, V]
        p_cpu = probs.float().cpu()
        drawn = torch.stack([torch.multinomial(p_cpu[i], 1, generator=g)[:, 0] for i, g in enumerate(generators)])  # [N, T]
        masked = x == mask_id  # [N, T]
        drawn = torch.where(masked, drawn.to(device), x)
        if s == num_steps - 1:
            keep_masked = torch.zeros_like(masked)
        else:
            uniforms = torch.stack([torch.empty(num_tokens).uniform_(0, 1, generator=g) for g in generators]).to(device)
            count = num_to_mask(masked.sum(-1), num_tokens, mask_ratio(s, num_steps, schedule)).to(device)  # [N]
            drawn_p = probs.gather(-1, drawn[..., None])[..., 0]  # [N, T]
            keep_masked = remask(drawn_p, masked, count, temps[s].to(device), uniforms)
        revealed = masked & ~keep_masked  # [N, T]
        order = torch.where(revealed, torch.full_like(order, s), order)
        lp_g = torch.log_softmax(scaled.float(), -1).gather(-1, drawn[..., None])[..., 0]  # [N, T]
        c_scaled = cond if temperature == 1.0 else cond / temperature
        lp_c = torch.log_softmax(c_scaled.float(), -1).gather(-1, drawn[..., None])[..., 0]  # [N, T]
        guided_lp = torch.where(revealed, lp_g, guided_lp)
        cond_lp = torch.where(revealed, lp_c, cond_lp)
        x = torch.where(keep_masked, torch.full_like(drawn, mask_id), drawn)
    return {"tokens": x, "order": order, "cond_logp": cond_lp, "guided_logp": guided_lp}


def _all_masked(n: int, t: int, mask_id: int, device) -> torch.Tensor:
    return torch.full((n, t), mask_id, dtype=torch.long, device=device)
