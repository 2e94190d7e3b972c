"""Steps 3-4 of the loop between the rewards and the buffer: the length penalty of variable-length families and
the group advantages (docs/design.md, "The data flow of one step"), on the pure functions of `mmrl.algorithms`."""
from __future__ import annotations

import torch

from mmrl.algorithms import group_advantages, soft_overlong_penalty


def overlong_penalty(rollout, cfg) -> torch.Tensor:
    """DAPO's soft overlong penalty [N] of each response's length (`soft_overlong_penalty`, on the CPU)."""
    return soft_overlong_penalty(rollout.response_mask.sum(-1).cpu(), cfg.max_completion_length, cfg.overlong_buffer_len)


def compute_advantages(rewards: torch.Tensor, scorable: torch.Tensor, cfg, accelerator, world: int) -> torch.Tensor:
    """Group advantages [N] of this process's rewards [N] (`group_advantages` with `cfg.scale_rewards` and `cfg.advantage_epsilon`); with
    `scale_rewards="batch"` on several processes the std is over the global batch (every process's scorable
    rewards gathered, unscorable ones left out, as in TRL)."""
    if cfg.scale_rewards == "batch" and world > 1:
        all_r = accelerator.gather(torch.where(scorable, rewards, torch.full_like(rewards, float("nan"))))
        all_r = all_r[~torch.isnan(all_r)]
        centered = group_advantages(rewards, cfg.num_generations, scale="none", scorable=scorable)
        return centered / (all_r.std() + cfg.advantage_epsilon) if all_r.numel() >= 2 else torch.zeros_like(centered)
    return group_advantages(rewards, cfg.num_generations, scale=cfg.scale_rewards, scorable=scorable,
                            eps=cfg.advantage_epsilon)
