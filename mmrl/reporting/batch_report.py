"""What the trainer reports about a rollout batch: reward metrics over the usable samples, and the message when
dynamic sampling or drop-mode refills cannot fill a batch."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

MAX_QUOTED_FAILURES = 3
"""Reward failure messages the stop message quotes."""


def add_failures(failures: list[str], new: Sequence[str]) -> None:
    """Append the messages of `new` not yet in `failures`, keeping at most `MAX_QUOTED_FAILURES`."""
    for f in new:
        if len(failures) < MAX_QUOTED_FAILURES and f not in failures:
            failures.append(f)


def reward_metrics(total: torch.Tensor, valid_groups: torch.Tensor, group_size: int) -> dict[str, float]:
    """TRL's `reward`, `reward_std` (mean over groups of the in-group std) and `frac_reward_zero_std`, over the groups
    whose rewards all succeeded: a dropped sample has no reward (its placeholder 0 is not averaged in). NaN if none."""
    groups = total.view(-1, group_size)[valid_groups.to(total.device)]  # [B', G]
    if groups.numel() == 0:
        nan = float("nan")
        return {"reward": nan, "reward_std": nan, "frac_reward_zero_std": nan}
    std = groups.std(-1)  # [B']
    return {"reward": float(groups.mean()), "reward_std": float(std.mean()), "frac_reward_zero_std": float((std == 0).float().mean())}


def unfilled_batch_message(*, dynamic_sampling: bool, max_tries: int, usable: int, need: int, zero_std: int, seen: int,
                           dropped: int, failures: Sequence[str], checkpoint: Path | None) -> str:
    """Why the batch could not be filled, the rewards' own errors, and only the remedies that apply."""
    what = "dynamic sampling" if dynamic_sampling else "refilling dropped groups"
    msg = (f"{what} could not fill a batch: after {max_tries} rollout batches only {usable} of {need} groups were usable "
           f"({zero_std} of {seen} groups had equal rewards, {dropped} were dropped for failed rewards).")
    if failures:
        msg += " Reward failures: " + "; ".join(failures) + "."
    remedies = [f"raise dynamic_sampling_max_tries (now {max_tries})"]
    if dropped:
        remedies.append("fix the failing reward (or set on_reward_error=raise to stop at the first failure)")
    if dynamic_sampling and zero_std:
        remedies += ["make the task easier or harder", "set dynamic_sampling=false"]
    msg += " To go on: " + ", or ".join(remedies) + "."
    msg += (f" The last checkpoint, {checkpoint.name}, is intact." if checkpoint is not None
            else " No checkpoint has been written yet in this run.")
    return msg


def completion_ids(rollout) -> list[list[int]]:
    """The response token ids of each row, without padding (TRL's `completion_ids` reward argument)."""
    return [ids[m].tolist() for ids, m in zip(rollout.response_ids, rollout.response_mask)]


def peak_memory_gb(device) -> float:
    """Peak memory of this process: the CUDA allocator's on GPUs, the resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def clip_extremes(metrics: dict[str, float], accelerator, world: int) -> dict[str, float]:
    """TRL's `clip_ratio/low_min` and `clip_ratio/high_max`: the lowest low-clip and highest high-clip ratio over the
    processes (each process's ratio is its step mean; one process: equal to the mean)."""
    if "clip_ratio/low_mean" not in metrics:
        return {}
    t = torch.tensor([metrics["clip_ratio/low_mean"], metrics["clip_ratio/high_mean"]], device=accelerator.device)
    if world > 1:
        every = accelerator.gather(t[None])  # [P, 2]
        return {"clip_ratio/low_min": float(every[:, 0].min()), "clip_ratio/high_max": float(every[:, 1].max())}
    return {"clip_ratio/low_min": float(t[0]), "clip_ratio/high_max": float(t[1])}
