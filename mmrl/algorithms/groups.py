"""Helpers shared by the group-wise functions: argument checks and the [N] <-> [N/G, G] reshape."""
from __future__ import annotations

import torch
from einops import rearrange


def check_group_size(n: int, group_size: int) -> int:
    """Return the number of groups `n // group_size`; raise `ValueError` naming both numbers otherwise."""
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int >= 2, got {group_size!r}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2 (a group of one response has no baseline to compare against), got {group_size}"
        )
    if n % group_size != 0:
        raise ValueError(
            f"the number of responses ({n}) is not divisible by group_size ({group_size}); "
            f"responses must come in whole groups of {group_size} consecutive rows"
        )
    return n // group_size


def to_groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] -> [N/G, G] (rows g*G .. g*G+G-1 belong to prompt g)."""
    if x.dim() != 1:
        raise ValueError(f"expected a 1-D tensor of per-response values, got shape {tuple(x.shape)}")
    check_group_size(x.shape[0], group_size)
    return rearrange(x, "(B G) -> B G", G=group_size)


def from_groups(x: torch.Tensor) -> torch.Tensor:
    """[N/G, G] -> [N]."""
    return rearrange(x, "B G -> (B G)")


def group_softmax(logits: torch.Tensor, group_size: int) -> torch.Tensor:
    """Softmax of [N] logits within each group of `group_size` consecutive rows -> [N], summing to 1 per group."""
    return from_groups(torch.softmax(to_groups(logits, group_size).float(), dim=-1))  # [N]
