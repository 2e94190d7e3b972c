"""GSPO: the clipped surrogate on a sequence-level importance ratio (docs/algorithms.md section 6).

Paper: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071, eq. 5-7. The worked example of
adding a method (docs/design.md, "Adding a method").
"""
from __future__ import annotations

import torch


def gspo_sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO eq. 7: `s_i = exp(mean_t (logp_it - old_logp_it))` over the valid tokens of response i, [N].

    The length-normalised (geometric-mean) ratio keeps `s_i` in a range one clip width fits, whatever the length.
    `logp` [N, T] carries the gradient, `old_logp` [N, T] is constant, `mask` [N, T] bool."""
    m = mask.to(logp.dtype)
    log_s = ((logp - old_logp.detach()) * m).sum(-1) / m.sum(-1).clamp(min=1)  # [N]
    return torch.exp(log_s)  # [N]


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO eq. 5 per response (to be minimised): `-min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)` [N].

    `advantages` [N] are the group advantages (eq. 6, GRPO's). The paper's clip range is (3e-4, 4e-4): sequence
    ratios move far less than token ratios. Returns (loss [N], metrics) with `clip_ratio/region_mean`, the
    fraction of responses whose ratio is clipped and whose gradient is therefore zero."""
    s = gspo_sequence_ratio(logp, old_logp, mask)  # [N]
    a = advantages.to(s.dtype)  # [N]
    unclipped = s * a
    clipped = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high) * a
    loss = -torch.minimum(unclipped, clipped)  # [N]
    with torch.no_grad():
        region = ((s < 1.0 - eps_low) & (a < 0)) | ((s > 1.0 + eps_high) & (a > 0))
        metrics = {"clip_ratio/region_mean": region.float().mean(), "gspo/ratio_mean": s.mean()}
    return loss, metrics
