"""Reasoning RL on the tiny world's text tasks: held-out figures and the comparisons of `mmrl replicate`.

Evaluation (`held_out`): greedy decoding (d1's protocol at this scale) and the training sampler at temperature 1,
averaged over K samples per held-out row (DGPO reports Avg@32 of sampled answers, Ding et al. 2025 section 5), with
pass@K beside it. RL can only sharpen what the base already produces: a base whose pass@K is far above its pass@1 is
the regime where the reward-tilted target `p_ref * exp(r / alpha)` (DMPO) or a group-relative update (GRPO) helps.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch


def sampled_generation(family: str, length: int, temperature: float = 1.0) -> dict[str, Any]:
    """The training sampler's options for a text family at `temperature` (masked diffusion: one token per step,
    low-confidence remasking, one block)."""
    if family == "masked_diffusion":
        return {"gen_length": length, "block_length": length, "steps": length, "temperature": temperature,
                "sampler": "low_confidence"}
    return {"max_new_tokens": length, "temperature": temperature}


def held_out(policy, rows: Sequence[dict], metric: str, family: str, length: int, k: int = 4,
             batch_size: int = 128) -> dict[str, float]:
    """Greedy accuracy, sampled accuracy (mean over `k` samples per row at temperature 1) and pass@k on `rows`.

    Sudoku's scores are cell accuracies (pass@k then counts fully solved puzzles); the other metrics are 1 / 0."""
    from mmrl.evaluate import d1_generation, evaluate

    greedy = evaluate(policy, rows, metric, batch_size=batch_size, progress=False,
                      **d1_generation(family, length, length, length)).accuracy
    scores = torch.zeros(len(rows), k)  # [R, K]
    for j in range(k):
        res = evaluate(policy, rows, metric, batch_size=batch_size, progress=False, seed=1000 + j,
                       **sampled_generation(family, length))
        scores[:, j] = torch.tensor(res.scores)
    return {"greedy": float(greedy), "sampled": float(scores.mean()), f"pass@{k}": float((scores >= 1).any(1).float().mean())}
