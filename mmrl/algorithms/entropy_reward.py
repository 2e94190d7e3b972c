"""STAGE's entropy reward, which the GCPO text-to-image launch turns on (docs/sources.md, "T2I branch").

Authors' code: jacklishufan/gcpo t2i/src/grpo/src/open_r1/trainer/grpo_trainer.py (`entropy_reward`, with
`only_add_max`; on in t2i/src/scripts/launch.sh and run_training_geneval.py). Among the images of maximal reward in a
group, an image whose mean token entropy stays close to the reference model's gets a bonus:

    e_i = 1 / (1 + (H_ref,i - H_theta,i)^2),      r_i += c * (e_i - mean_{j in top} e_j)   for i in top,

with H the full-vocabulary entropy of the image-token distribution averaged over the image's tokens and c = 0.4.
Other images keep their reward; the bonuses of the top images sum to 0.
"""
from __future__ import annotations

import torch

from mmrl.algorithms.groups import to_groups

STAGE_ENTROPY_COEFF = 0.4
"""The coefficient c of the GCPO T2I launch."""


def entropy_closeness(entropy: torch.Tensor, ref_entropy: torch.Tensor) -> torch.Tensor:
    """e = 1 / (1 + (H_ref - H_theta)^2) per response [N] from mean token entropies [N]."""
    return 1.0 / (1.0 + (ref_entropy.float() - entropy.float()).square())


@torch.no_grad()
def stage_entropy_bonus(rewards: torch.Tensor, entropy: torch.Tensor, ref_entropy: torch.Tensor, group_size: int, *,
                        coeff: float = STAGE_ENTROPY_COEFF) -> torch.Tensor:
    """The reward bonus [N]: `coeff * (e_i - mean e over the group's top-reward responses)` for the responses whose
    reward equals the group maximum (exact ties all count, as the authors' `rewards == rewards.max()`), 0 otherwise.

    Args:
        rewards: [N] rewards before the bonus, groups of `group_size` consecutive rows.
        entropy, ref_entropy: [N] mean token entropy of each response under the policy and the reference.
    """
    e = to_groups(entropy_closeness(entropy, ref_entropy), group_size)  # [B, G]
    r = to_groups(rewards.float(), group_size)  # [B, G]
    top = (r == r.max(-1, keepdim=True).values).float()  # [B, G]
    mean_top = (e * top).sum(-1, keepdim=True) / top.sum(-1, keepdim=True)  # [B, 1]
    return (coeff * (e - mean_top) * top).reshape(-1)  # [N]
