"""STAGE's entropy reward (on in the GCPO / STAGE text-to-image launches and their GRPO baseline): the default
reward shaping of every method (`Method.shape_rewards`), before the advantages."""
from __future__ import annotations

import torch


@torch.no_grad()
def stage_entropy_reward(policy, rollout, rewards: torch.Tensor, cfg, micro_batches, est: dict) -> torch.Tensor:
    """The bonus [N] of STAGE's entropy reward (`mmrl.algorithms.entropy_reward.stage_entropy_bonus`, on in the
    GCPO text-to-image launch): mean token entropies of the policy and of the reference per response, in
    micro-batches (`micro_batches(N)` yields index tensors), scored with the estimator options `est`."""
    from mmrl.algorithms.entropy_reward import stage_entropy_bonus

    h, h_ref = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for idx in micro_batches(rollout.num_responses):
        mb = rollout.select(idx)
        mask = mb.response_mask.float()  # [n, T]
        count = mask.sum(-1).clamp(min=1)  # [n]
        for out, ref in ((h, False), (h_ref, True)):
            ent = policy.logprob(mb, use_reference=ref, stats=("entropy",), **est).stats["entropy"]  # [n, T]
            out[idx.to(out.device)] = ((ent.float() * mask).sum(-1) / count).to(out.device)
    return stage_entropy_bonus(rewards, h, h_ref, cfg.num_generations, coeff=cfg.gcpo_entropy_reward)
