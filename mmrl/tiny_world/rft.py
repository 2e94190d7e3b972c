"""Rejection-sampling fine-tuning (RFT): the baseline an RL claim must beat at the same number of rollouts.

The base model samples exactly the rollouts an RL arm would (`rollouts` batches of `prompts_per_rollout` training
prompts x `group_size` responses, the same sampler), every response is scored by the task's reward, and the model is
fine-tuned by maximum likelihood on the responses that score 1 (the correct ones) only: one optimizer step per
rollout batch on that batch's accepted responses, so the optimizer steps match the RL arm too. This is rejection
sampling fine-tuning as in Yuan et al. 2023 ("Scaling Relationship on Learning Mathematical Reasoning with Large
Language Models", RFT: SFT on the model's own correct samples), and the offline counterpart of RAFT (Dong et al.
2023): the samples come from the base, never from the model being fine-tuned.

It works for every family through the policy protocol: `sample` for the rollouts, `logprob` (teacher-forced
log-probs of the accepted response tokens) for the loss `-sum(logp * mask) / sum(mask)`; a masked-diffusion model
fits its accepted samples with its own pre-training loss instead (`masked_diffusion_nll` with the base recipe's loss
options, `pretrain.loss_options`: the sequence likelihood is not exact there, so RFT maximises the same masked-token
objective, the ELBO or its recipe's variant, that pre-training did, on the accepted answers packed as pre-training
packs an answer, `eos_padded`); a masked image-token model likewise fits its accepted images with MaskGIT's
pre-training loss (`masked_image_nll`).

The fitting loop (`fit_batches`: one AdamW step per batch) is shared with the clean-SFT baseline of the Sudoku
comparison (`truth_batches`: the training puzzles' true solutions instead of accepted samples, same loss, same
optimizer, same number of steps), so the two rows differ only in the data they fit.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger(__name__)

ACCEPT = 1.0
"""A response is kept when its reward is at least this (a correct answer / a fully satisfied GenEval prompt)."""


def rft_loss(policy, rollout) -> torch.Tensor:
    """The mean negative log-likelihood per response token of `rollout`'s responses (scalar, differentiable)."""
    scores = policy.logprob(rollout)
    mask = rollout.response_mask.to(scores.logp.dtype)  # [N, T]
    return -(scores.logp * mask).sum() / mask.sum().clamp(min=1.0)


def eos_padded(ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """`ids` [N, T] with every position after a row's first EOS set to `eos_ids[0]`: a masked-diffusion rollout's
    generated span as pre-training packs an answer (`pretrain.pack_pairs`: the answer, then EOS to the end), so what
    follows the answer's EOS (never read by the reward) is not fitted. Rows without an EOS are unchanged."""
    from mmrl.models.base import mask_through_first_eos

    keep = mask_through_first_eos(ids, eos_ids)  # [N, T] True up to and including the first EOS
    return torch.where(keep, ids, torch.full_like(ids, eos_ids[0]))


def masked_diffusion_nll(seed: int = 0, **options) -> Callable[[Any, Any], torch.Tensor]:
    """A loss function `(policy, batch) -> scalar` for a masked-diffusion policy: its pre-training loss
    (`mmrl.tiny_world.pretrain.masked_sft_loss` with `options`, the base's recipe's loss keys,
    `pretrain.loss_options(spec.recipe)`; none: LLaDA's SFT loss, eq. 5) on a `Rollout`'s responses (`eos_padded`,
    as pre-training packs an answer) or on a `truth_batches` tuple (x_p, m_p, x_r, fixed); its mask rates and masks
    come from one CPU generator seeded `seed`, so a run is reproducible."""
    from mmrl.tiny_world.pretrain import LOSS_OPTIONS, masked_sft_loss

    bad = sorted(set(options) - set(LOSS_OPTIONS))
    if bad:
        raise ValueError(f"unknown masked-diffusion loss options {bad}; valid: {list(LOSS_OPTIONS)}")
    g = torch.Generator().manual_seed(seed)

    def loss(policy, batch) -> torch.Tensor:
        if isinstance(batch, tuple):
            x_p, m_p, x_r, fixed = batch
        else:  # a Rollout: the infilled given cells (`extras["fixed"]`) are never masked nor counted
            x_p, m_p, x_r = batch.prompt_ids, batch.prompt_mask, eos_padded(batch.response_ids, policy.eos_token_ids)
            fixed = batch.extras.get("fixed")
            fixed = torch.zeros_like(x_r, dtype=torch.bool) if fixed is None else fixed
        return masked_sft_loss(policy, x_p, m_p, x_r, fixed.cpu(), g, **options)

    return loss


def masked_image_nll(seed: int = 0, *, cfg_dropout: float = 0.1) -> Callable[[Any, Any], torch.Tensor]:
    """A loss function `(policy, rollout) -> scalar` for a masked image-token policy (`MaskedImageAdapter`): its
    pre-training loss on the rollout's images, MaskGIT's masked-token cross-entropy (Chang et al. 2022, section 3.1;
    `mmrl.tiny_world.masked_image_pretrain.maskgit_masks` / `maskgit_loss`: per image a mask ratio cos(pi/2 u), the
    CE of the masked tokens given the visible ones and the prompt), with the prompt replaced by the negative prompt
    `cfg_dropout` of the time as pre-training does, so the unconditional branch that classifier-free guidance reads
    keeps being fitted. The transformer's trainable parameters are fitted; the frozen text encoder is only read.
    Masks and dropout come from one CPU generator seeded `seed`, so a run is reproducible."""
    from mmrl.tiny_world.masked_image_pretrain import maskgit_loss, maskgit_masks

    if not 0.0 <= cfg_dropout < 1.0:
        raise ValueError(f"cfg_dropout must lie in [0, 1), got {cfg_dropout}")
    g = torch.Generator().manual_seed(seed)

    def loss(policy, rollout) -> torch.Tensor:
        target = rollout.response_ids  # [N, T] image tokens
        n, t = target.shape
        masked = maskgit_masks(n, t, g).to(target.device)  # [N, T]
        drop = (torch.rand(n, generator=g) < cfg_dropout).to(target.device)  # [N]
        null = policy.tokenize([policy.generation_defaults["negative_prompt"]]).to(target.device)  # [1, L]
        ids = torch.where(drop[:, None], null, rollout.prompt_ids)  # [N, L]
        states = torch.where(masked, torch.full_like(target, policy.mask_token_id), target)  # [N, T]
        text = policy.encode_text(ids)  # no-grad: the text encoder stays frozen
        logits = policy.image_logits(policy.model, states, text)  # [N, T, V]
        return maskgit_loss(logits, target, masked)

    return loss


def truth_batches(policy, rows: Sequence[dict], *, steps: int, batch_size: int, gen_length: int, target_key: str = "solution",
                  seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """`steps` batches of `batch_size` training rows (drawn with replacement, seeded) with their true answers
    `row[target_key]` as the response, packed as the masked-diffusion pre-training packs them (`pack_pairs`, the
    given cells of an infilling prompt fixed): [(x_p [B, P], m_p [B, P], x_r [B, gen_length], fixed [B, gen_length])]."""
    from mmrl.tiny_world.pretrain import pack_pairs

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    rows = list(rows)
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        batch = [rows[rng.randrange(len(rows))] for _ in range(batch_size)]
        prompts = [r["prompt"] for r in batch]
        x_p, m_p, x_r = pack_pairs(policy.tokenizer, [policy._prompt_text(p) for p in prompts], [r[target_key] for r in batch],
                                   gen_length, policy.pad_token_id, policy.eos_token_ids[0])
        templates = policy.response_templates(prompts, gen_length)  # [B, T] or None
        fixed = (templates != policy.mask_token_id).cpu() if templates is not None else torch.zeros_like(x_r, dtype=torch.bool)
        out.append((x_p, m_p, x_r, fixed))
    return out


def fit_batches(policy, batches: Sequence[Any], loss_fn: Callable[[Any, Any], torch.Tensor], *, lr: float,
                max_grad_norm: float = 1.0, weight_decay: float = 0.0) -> list[float]:
    """Fine-tune `policy` in place, one AdamW step (constant `lr`, gradient clipping) per batch on
    `loss_fn(policy, batch)`; a `None` batch makes no update (its loss is nan). Returns the per-step losses."""
    from mmrl.tiny_world.pretrain import sft_update

    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    losses = []
    policy.model.train()
    for batch in batches:
        if batch is None:
            losses.append(float("nan"))
            continue
        loss = loss_fn(policy, batch)
        losses.append(sft_update(loss, params, opt, max_grad_norm=max_grad_norm))
    policy.model.eval()
    return losses


def rejection_sampling_ft(policy, rows: Sequence[dict], reward: str, *, rollouts: int, prompts_per_rollout: int,
                          group_size: int, lr: float, seed: int = 0, max_grad_norm: float = 1.0,
                          generation: dict[str, Any] | None = None, weight_decay: float = 0.0,
                          loss_fn: Callable[[Any, Any], torch.Tensor] | None = None) -> dict[str, Any]:
    """Fine-tune `policy` in place on its own rewarded samples (see the module docstring); returns
    {"accepted": per-batch counts, "sampled": total responses, "loss": per-step losses}. `loss_fn` (default
    `rft_loss`, the exact NLL) fits each batch's accepted responses (`masked_diffusion_nll` for a masked-diffusion model).

    The samples are all drawn before the first update, from the base itself; a batch with no accepted response
    costs its rollouts and makes no update (as an RL group with no reward signal)."""
    from mmrl.rewards import RewardSet
    from mmrl.rewards.completions import in_prompt_format

    if rollouts < 1 or prompts_per_rollout < 1 or group_size < 1:
        raise ValueError(f"rollouts, prompts_per_rollout and group_size must be >= 1, got {rollouts}, "
                         f"{prompts_per_rollout}, {group_size}")
    rows = list(rows)
    scorer = RewardSet([reward])
    rng = random.Random(seed)
    gen = dict(generation or {})
    chunks, accepted = [], []
    for b in range(rollouts):
        batch = [rows[rng.randrange(len(rows))] for _ in range(prompts_per_rollout)]
        seeds = [seed * 1_000_003 + b * 100_003 + i for i in range(prompts_per_rollout * group_size)]
        with torch.no_grad():
            rollout = policy.sample([r["prompt"] for r in batch], group_size, seeds=seeds, **gen)
        reps = [r for r in batch for _ in range(group_size)]
        columns = {k: [r.get(k) for r in reps] for k in reps[0] if k != "prompt"}
        out = scorer(rollout.prompts, in_prompt_format(rollout.prompts, rollout.completions), **columns)
        keep = torch.nonzero(out.per_reward[reward] >= ACCEPT).flatten()  # [K]
        accepted.append(int(keep.numel()))
        chunks.append(rollout.select(keep) if keep.numel() else None)
    losses = fit_batches(policy, chunks, loss_fn or rft_loss, lr=lr, max_grad_norm=max_grad_norm, weight_decay=weight_decay)
    total = rollouts * prompts_per_rollout * group_size
    log.info("RFT: %d of %d sampled responses accepted, %d updates", sum(accepted), total, sum(c is not None for c in chunks))
    return {"accepted": accepted, "sampled": total, "loss": losses}
