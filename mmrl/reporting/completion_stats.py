"""Which responses were cut at the length limit, and TRL's completion-length metrics.

A response is truncated when it did not end by itself: no EOS (masked diffusion: no EOS inside the generated span).
Its length says nothing about that: the response tensor is as wide as the longest response of the batch, so a
response that ends with EOS exactly in the last column is as long as the widest one and still finished. TRL:
`is_truncated = ids[-1] not in eos_and_pad` (GRPOTrainer, `mask_truncated_completions`), `clipped_ratio` = the
fraction not terminated, `mean/min/max_terminated_length` over the terminated ones (0 when none is).
"""
from __future__ import annotations

import warnings

import torch

from mmrl.core.protocol import Rollout


def terminated(rollout: Rollout) -> torch.Tensor:
    """[N] bool: the responses that ended by themselves (the adapter's `extras["terminated"]`).

    An adapter that does not report it (a custom one) falls back to "shorter than the response width", which
    counts a response ending with EOS in the last column as truncated; a warning says so."""
    flag = rollout.extras.get("terminated")
    if isinstance(flag, torch.Tensor) and flag.shape == (rollout.num_responses,):
        return flag.bool()
    warnings.warn("the policy's rollout has no extras['terminated'] ([N] bool, EOS seen); treating responses that fill "
                  "the response width as truncated", RuntimeWarning, stacklevel=2)
    return rollout.response_mask.sum(-1) < rollout.response_ids.shape[1]


def length_metrics(lengths: torch.Tensor, is_terminated: torch.Tensor) -> dict[str, float]:
    """TRL's `completions/*` metrics of response lengths [N] and termination flags [N]."""
    lengths = lengths.float().cpu()
    done = is_terminated.bool().cpu()
    term = lengths[done] if bool(done.any()) else torch.zeros(1)
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float((~done).float().mean()),
        "completions/mean_terminated_length": float(term.mean()),
        "completions/min_terminated_length": float(term.min()),
        "completions/max_terminated_length": float(term.max()),
    }
