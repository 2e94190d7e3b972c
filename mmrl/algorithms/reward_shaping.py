"""Reward shaping applied before the group advantages: DAPO's soft overlong punishment (docs/algorithms.md
section 2).

Paper: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476, eq. 13.
"""
from __future__ import annotations

import torch


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int | None) -> torch.Tensor:
    """DAPO eq. 13 (soft overlong punishment) [N]: 0 up to `L_max - L_cache`, then linearly down to -1 at `L_max`.

    `lengths` [N] are the response lengths, `max_len` is L_max and `buffer_len` the punishment interval L_cache
    (None: a fifth of L_max, at least 1)."""
    cache = buffer_len if buffer_len is not None else max(1, max_len // 5)
    start = max_len - cache
    over = (lengths.float() - start).clamp(min=0)  # [N]
    return -(over / cache).clamp(max=1.0)  # [N]
