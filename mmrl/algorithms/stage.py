"""STAGE's similarity-aware token masks and the per-token KL masks of STAGE and GCPO's text-to-image branch.

Sources (docs/sources.md, "T2I branch" and "STAGE baseline"):
- STAGE: "STAGE: Stable and Generalizable GRPO for Autoregressive Image Generation" (arXiv 2509.25027), the base of
  GCPO's T2I code; as run by GCPO's only T2I baseline launcher (jacklishufan/gcpo
  `t2i/src/scripts/run_training_geneval.py`: `reward_smooth`, `kl_reweight`, `entropy_reward` on) in
  `t2i/src/grpo/src/open_r1/trainer/grpo_trainer.py` `compute_loss`.
- GCPO T2I (`launch.sh`, `use_importance_sampling` on): the same KL re-weighting with the guidance-contrast weight w
  in place of STAGE's similarity, `cos := 1 - 2 w`.

Image tokens of one prompt's images share the position grid: token t of image i and token t of image j cover the
same patch. STAGE compares them through the cosine of their VQ code vectors.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mmrl.algorithms.groups import check_group_size

WEIGHTED_MEAN_EPS = 1e-6
"""The authors' `+ 1e-6` in the denominator of the mask-weighted token mean."""


def opposite_advantage_similarity(codes: torch.Tensor, advantages: torch.Tensor, group_size: int) -> torch.Tensor:
    """STAGE's similarity map: per image token, the mean cosine similarity of its code vector to the code vectors at
    the same position in the group's images of opposite advantage.

        c_it = sum_{j != i, A_i A_j <= 0} cos(e_it, e_jt) / #{j : A_i A_j <= 0}

    j runs over the group of i (the authors' device batch is one group). As in the authors' code, the count includes
    j = i when A_i = 0 (its cosine is not added), and an image with A = 0 is "opposite" to every image.

    Args:
        codes: [N, T, C] code vector of every image token (the VQ codebook entry of the sampled id).
        advantages: [N] sequence advantages, groups of `group_size` consecutive rows.
    Returns: [N, T] float32 similarities in [-1, 1].
    """
    n, t, _ = codes.shape
    b = check_group_size(n, group_size)
    e = F.normalize(codes.float(), dim=-1).reshape(b, group_size, t, -1)  # [B, G, T, C]
    cos = torch.einsum("bitc,bjtc->bijt", e, e)  # [B, G, G, T]
    eye = torch.eye(group_size, dtype=torch.bool, device=codes.device)
    cos = cos.masked_fill(eye[None, :, :, None], 0.0)  # the authors leave the diagonal of the map at 0
    a = advantages.float().reshape(b, group_size)  # [B, G]
    pairs = (a[:, :, None] * a[:, None, :] <= 0).float()  # [B, G, G]
    sim = (cos * pairs[..., None]).sum(2) / pairs.sum(2).clamp(min=1)[..., None]  # [B, G, T]
    return sim.reshape(n, t)  # [N, T]


def stage_token_masks(similarity: torch.Tensor) -> torch.Tensor:
    """STAGE's soft token mask `clamp((1 - c) / 2, 0, 1)` [N, T]: tokens unlike the opposite-advantage images get
    the credit, tokens they share (c = 1) none."""
    return ((1.0 - similarity) / 2).clamp(0.0, 1.0)


def stage_kl_mask(similarity: torch.Tensor) -> torch.Tensor:
    """STAGE's per-token KL weight `0.5 + 0.5 clamp(c + 1, 0, 1)` [N, T]: 1 for c >= 0, down to 0.5 at c = -1."""
    return 0.5 + 0.5 * (similarity + 1.0).clamp(0.0, 1.0)


def gcpo_kl_mask(weights: torch.Tensor) -> torch.Tensor:
    """GCPO T2I's per-token KL weight `0.5 + 0.5 clamp(2 - 2 w, 0, 1)` [N, T] from the token weights w (STAGE's mask
    with `c = 1 - 2 w`): the full KL for w <= 0.5, half of it for w >= 1."""
    return 0.5 + 0.5 * (2.0 - 2.0 * weights.float()).clamp(0.0, 1.0)


def weighted_mean_weights(masks: torch.Tensor, valid: torch.Tensor, group_size: int,
                          eps: float = WEIGHTED_MEAN_EPS) -> torch.Tensor:
    """Token weights [N, T] that turn a token mean into the authors' mask-weighted token mean per group.

    The authors' policy term over a group g is `sum_{i in g, t} m_it rho_it A_i / (sum_{i in g, t} m_it + eps)`.
    With `w_it = m_it * n_g / (sum_g m + eps)` (n_g the group's valid tokens) the token mean of `w rho A` over
    the group is exactly that; over equal-sized groups the global token mean is the mean over groups, which is the
    authors' average over devices (one group each).

    Args:
        masks: [N, T] non-negative masks m (0 where `valid` is False is enforced).
        valid: [N, T] bool valid tokens.
    """
    n, t = masks.shape
    b = check_group_size(n, group_size)
    m = torch.where(valid, masks.float(), torch.zeros_like(masks, dtype=torch.float32)).reshape(b, group_size * t)
    count = valid.reshape(b, group_size * t).float().sum(-1, keepdim=True)  # [B, 1]
    w = m * count / (m.sum(-1, keepdim=True) + eps)  # [B, G*T]
    return w.reshape(n, t)  # [N, T]
