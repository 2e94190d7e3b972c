"""Training only on the high-entropy "forking" tokens (TRL `GRPOConfig.top_entropy_quantile`).

Source: Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement
Learning for LLM Reasoning", section 4 (the policy gradient restricted to the top-rho entropy tokens of a batch);
TRL's `GRPOTrainer.get_high_entropy_mask` (threshold = the (1 - q) quantile of the valid tokens' entropies, tokens
at or above it kept).
"""
from __future__ import annotations

import torch


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """[N, T] bool: the valid tokens whose entropy is in the top `quantile` of the valid tokens of this batch.

    entropy: [N, T] per-token entropies; mask: [N, T] valid response tokens; quantile in (0, 1] (1 keeps every
    valid token). Ties at the threshold are kept (`>=`, as TRL). Deviation: TRL gathers the entropies of every
    process for the threshold; this is the threshold of the tokens given (one process's micro-batch)."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    mask = mask.bool()
    if quantile == 1 or not bool(mask.any()):
        return mask
    valid = entropy.detach()[mask].float()  # [M]
    threshold = torch.quantile(valid, 1.0 - quantile)
    return (entropy.detach().float() >= threshold) & mask
