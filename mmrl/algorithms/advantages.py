"""Group-relative advantages: GRPO, TRL's batch scaling, Dr.GRPO / d1 (docs/algorithms.md section 1).

Sources:
- GRPO: Shao et al. 2024, "DeepSeekMath", section 4.1.2 (outcome supervision): A_i = (r_i - mean(r)) / std(r).
- batch scaling: TRL `GRPOConfig.scale_rewards="batch"` (std over the whole batch, mean still per group).
- Dr.GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training", eq. 3: no std division. d1 / diffu-GRPO uses
  the same (Zhao et al. 2025, d1, section 3.2; `diffu_grpo_trainer.py` logs the std but does not divide).
"""
from __future__ import annotations

import torch

from mmrl.algorithms.groups import from_groups, to_groups
from mmrl.algorithms.registry import ADVANTAGES


def _centered(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - mean_g r) as [B, G] with groups of exactly equal rewards set to exactly 0, and the equal-group flag [B, 1]."""
    r = to_groups(rewards, group_size).float()  # [B, G]
    centered = r - r.mean(dim=-1, keepdim=True)  # [B, G]
    # mean() of equal floats need not return that float exactly; force the documented exact zero
    equal = (r.amax(dim=-1, keepdim=True) == r.amin(dim=-1, keepdim=True))  # [B, 1]
    return torch.where(equal, torch.zeros_like(centered), centered), equal


@ADVANTAGES.register("group")
def _scale_group(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    centered, _ = _centered(rewards, group_size)  # [B, G]
    std = to_groups(rewards, group_size).float().std(dim=-1, keepdim=True, unbiased=True)  # [B, 1]
    return from_groups(centered / (std + eps))  # [N]


@ADVANTAGES.register("batch")
def _scale_batch(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    centered, _ = _centered(rewards, group_size)  # [B, G]
    std = rewards.float().std(unbiased=True)  # []
    return from_groups(centered / (std + eps))  # [N]


@ADVANTAGES.register("none")
def _scale_none(rewards: torch.Tensor, group_size: int, eps: float) -> torch.Tensor:
    centered, _ = _centered(rewards, group_size)  # [B, G]
    return from_groups(centered)  # [N]


def group_advantages(rewards: torch.Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-6,
                     scorable: torch.Tensor | None = None) -> torch.Tensor:
    """Group-relative advantages of `rewards` [N] -> [N] float32.

    Rows g*G .. g*G+G-1 form the group of prompt g.

    - `scale="group"` (GRPO): `A_i = (r_i - mean_g r) / (std_g r + eps)`, unbiased (N-1) std of the group.
    - `scale="batch"` (TRL `scale_rewards="batch"`): the same numerator, std of the whole batch.
    - `scale="none"` (Dr.GRPO, d1): `A_i = r_i - mean_g r`.

    A group whose rewards are all equal gets exactly 0 (never NaN). `group_size < 2` and `N % group_size != 0`
    raise `ValueError`; so do non-finite rewards (a NaN reward is a bug upstream, not a zero).

    `scorable` [N] bool (optional): False marks a sample no reward applied to (TRL: every reward function returned
    None). As in TRL's `GRPOTrainer._generate_and_score_completions` (NaN rewards, nan-aware mean and std, then
    `nan_to_num`), such a sample is left out of its group's mean and std (and of the batch std) and gets advantage
    exactly 0; so does every member of a group with fewer than 2 scorable samples under std scaling. Its entry in
    `rewards` is ignored. No deviation from the sources.
    """
    rewards = torch.as_tensor(rewards)
    fn = ADVANTAGES[scale]
    if rewards.numel() and not torch.isfinite(rewards).all():
        bad = torch.nonzero(~torch.isfinite(rewards)).flatten().tolist()
        raise ValueError(f"rewards must be finite; non-finite values at indices {bad[:10]}")
    if scorable is not None and not bool(torch.as_tensor(scorable).all()):
        return _masked_advantages(rewards, torch.as_tensor(scorable, dtype=torch.bool).to(rewards.device), group_size, scale, eps)
    return fn(rewards, group_size, eps)


def _masked_advantages(rewards: torch.Tensor, scorable: torch.Tensor, group_size: int, scale: str, eps: float) -> torch.Tensor:
    """`group_advantages` over the scorable samples only (the others: 0). rewards, scorable [N] -> [N]."""
    if scale not in ADVANTAGES:
        raise ValueError(f"unknown advantage scaling {scale!r}")
    r = to_groups(rewards, group_size).float()  # [B, G]
    m = to_groups(scorable, group_size)  # [B, G]
    mf = m.float()
    count = mf.sum(-1, keepdim=True)  # [B, 1]
    mean = (r * mf).sum(-1, keepdim=True) / count.clamp(min=1)  # [B, 1]
    centered = torch.where(m, r - mean, torch.zeros_like(r))  # [B, G]
    big, small = torch.finfo(r.dtype).max, torch.finfo(r.dtype).min
    equal = torch.where(m, r, torch.full_like(r, small)).amax(-1, keepdim=True) == \
        torch.where(m, r, torch.full_like(r, big)).amin(-1, keepdim=True)  # [B, 1] (scorable rewards all equal)
    centered = torch.where(equal, torch.zeros_like(centered), centered)
    if scale == "none":
        return from_groups(centered)  # [N]
    if scale == "group":
        std = ((centered ** 2).sum(-1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()  # [B, 1] unbiased
        adv = torch.where(count >= 2, centered / (std + eps), torch.zeros_like(centered))
        return from_groups(adv)  # [N]
    kept = rewards.float()[scorable]  # [N']
    std = kept.std(unbiased=True) if kept.numel() >= 2 else torch.tensor(float("nan"))
    adv = centered / (std + eps) if kept.numel() >= 2 else torch.zeros_like(centered)
    return from_groups(adv)  # [N]
