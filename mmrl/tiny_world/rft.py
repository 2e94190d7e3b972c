"""Rejection-sampling fine-tuning (RFT): the baseline an RL claim must beat at the same number of rollouts.

The base model samples exactly the rollouts an RL arm would (`rollouts` batches of `prompts_per_rollout` training
prompts x `group_size` responses, the same sampler), every response is scored by the task's reward, and the model is
fine-tuned by maximum likelihood on the responses that score 1 (the correct ones) only: one optimizer step per
rollout batch on that batch's accepted responses, so the optimizer steps match the RL arm too. This is rejection
sampling fine-tuning as in Yuan et al. 2023 ("Scaling Relationship on Learning Mathematical Reasoning with Large
Language Models", RFT: SFT on the model's own correct samples), and the offline counterpart of RAFT (Dong et al.
2023): the samples come from the base, never from the model being fine-tuned.

It works for every family through the policy protocol: `sample` for the rollouts, `logprob` (teacher-forced
log-probs of the accepted response tokens) for the loss `-sum(logp * mask) / sum(mask)`.
"""
from __future__ import annotations

import logging
import random
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)

ACCEPT = 1.0
"""A response is kept when its reward is at least this (a correct answer / a fully satisfied GenEval prompt)."""


def rft_loss(policy, rollout) -> torch.Tensor:
    """The mean negative log-likelihood per response token of `rollout`'s responses (scalar, differentiable)."""
    scores = policy.logprob(rollout)
    mask = rollout.response_mask.to(scores.logp.dtype)  # [N, T]
    return -(scores.logp * mask).sum() / mask.sum().clamp(min=1.0)


def rejection_sampling_ft(policy, rows: Sequence[dict], reward: str, *, rollouts: int, prompts_per_rollout: int,
                          group_size: int, lr: float, seed: int = 0, max_grad_norm: float = 1.0,
                          generation: dict[str, Any] | None = None, weight_decay: float = 0.0) -> dict[str, Any]:
    """Fine-tune `policy` in place on its own rewarded samples (see the module docstring); returns
    {"accepted": per-batch counts, "sampled": total responses, "loss": per-step losses}.

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
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    losses = []
    policy.model.train()
    for chunk in chunks:
        if chunk is None:
            losses.append(float("nan"))
            continue
        loss = rft_loss(policy, chunk)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        losses.append(float(loss.detach()))
    policy.model.eval()
    total = rollouts * prompts_per_rollout * group_size
    log.info("RFT: %d of %d sampled responses accepted, %d updates", sum(accepted), total, sum(c is not None for c in chunks))
    return {"accepted": accepted, "sampled": total, "loss": losses}
