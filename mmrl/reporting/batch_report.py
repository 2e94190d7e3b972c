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


def nanstd(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sample standard deviation (Bessel's n - 1) ignoring NaNs; NaN where fewer than 2 values (TRL's `nanstd`)."""
    mean = torch.nanmean(x, dim=dim, keepdim=True) if dim is not None else torch.nanmean(x)
    count = (~torch.isnan(x)).sum(dim=dim) if dim is not None else (~torch.isnan(x)).sum()
    sq = torch.nansum((x - mean) ** 2, dim=dim) if dim is not None else torch.nansum((x - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return torch.where(count > 1, var.sqrt(), torch.full_like(var, float("nan")))


def scorable_group_std(total: torch.Tensor, scorable: torch.Tensor, group_size: int) -> torch.Tensor:
    """[N] rewards, [N] bool -> [B] in-group std over the scorable samples (NaN where fewer than 2)."""
    r = torch.where(scorable.to(total.device), total.float(), torch.full_like(total.float(), float("nan")))
    return nanstd(r.view(-1, group_size), dim=-1)


def impute_unscorable(rewards: torch.Tensor, scorable: torch.Tensor, group_size: int) -> torch.Tensor:
    """The rewards with each unscorable sample's entry replaced by its group's mean over the scorable ones (0 where
    none is): a neutral value for methods that read rewards directly. [N] -> [N]."""
    m = scorable.to(rewards.device).view(-1, group_size)  # [B, G]
    r = rewards.view(-1, group_size)  # [B, G]
    mean = (r * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    return torch.where(m, r, mean.expand_as(r)).reshape(-1)


def reward_metrics(total: torch.Tensor, valid_groups: torch.Tensor, group_size: int, *, scorable: torch.Tensor | None = None,
                   accelerator=None, world: int = 1) -> dict[str, float]:
    """TRL's `reward` (mean), `reward_std` (the std of the whole batch's rewards, not a mean of group stds: TRL
    `GRPOTrainer` logs `nanstd(rewards)`) and `frac_reward_zero_std` (groups whose std is 0), over the samples of
    every process that were scored: a dropped sample (failed reward) or an unscorable one (every reward None) is
    left out, as TRL leaves unscorable ones out. NaN if none."""
    r = total.float().clone()  # [N]
    rows_valid = valid_groups.to(r.device).repeat_interleave(group_size)
    ok = rows_valid if scorable is None else rows_valid & scorable.to(r.device)
    r[~ok] = float("nan")
    grouped_valid = valid_groups.to(r.device).float()  # [B]
    if world > 1 and accelerator is not None:
        r = accelerator.gather(r.to(accelerator.device)).cpu()
        grouped_valid = accelerator.gather(grouped_valid.to(accelerator.device)).cpu()
    if not bool((~torch.isnan(r)).any()):
        nan = float("nan")
        return {"reward": nan, "reward_std": nan, "frac_reward_zero_std": nan}
    group_std = nanstd(r.view(-1, group_size), dim=-1)[grouped_valid.bool()]  # [B']
    zero = torch.isclose(group_std, torch.zeros_like(group_std))  # NaN (under 2 scored) is not zero, as in TRL
    return {"reward": float(torch.nanmean(r)), "reward_std": float(nanstd(r)), "frac_reward_zero_std": float(zero.float().mean())}


def per_reward_metrics(columns: dict[str, list[torch.Tensor]]) -> dict[str, float]:
    """TRL's `rewards/<name>/mean` and `rewards/<name>/std` over every sample a reward scored in this rollout batch
    (all refill tries; NaN entries, where it returned None or the sample was dropped, left out). `columns`: name ->
    the [n] values of each try. A reward that scored nothing gives NaN, as TRL's `nanmean` does."""
    out = {}
    for name, cols in columns.items():
        x = torch.cat([c.float() for c in cols])  # [N total]
        out[f"rewards/{name}/mean"] = float(torch.nanmean(x)) if bool((~torch.isnan(x)).any()) else float("nan")
        s = nanstd(x)
        out[f"rewards/{name}/std"] = 0.0 if torch.isnan(s) and int((~torch.isnan(x)).sum()) == 1 else float(s)
    return out


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


def peak_memory_gb(device) -> float:
    """Peak memory of this process: the CUDA allocator's on GPUs, the resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB


def clip_extremes(metrics: dict[str, float], accelerator, world: int) -> dict[str, float]:
    """TRL's `clip_ratio/low_min` and `clip_ratio/high_max` across processes: the method's loss gives, per micro-batch,
    the lowest per-completion low-clip fraction and the highest per-completion high-clip fraction (TRL: the masked
    sequence mean of the clip indicator, `nanmin` / `nanmax` over the gathered completions), averaged over the
    micro-batches; here the lowest / highest of those over the processes."""
    if "clip_ratio/low_min" not in metrics:
        return {}
    t = torch.tensor([metrics["clip_ratio/low_min"], metrics["clip_ratio/high_max"]], device=accelerator.device)
    if world > 1:
        every = accelerator.gather(t[None])  # [P, 2]
        return {"clip_ratio/low_min": float(every[:, 0].min()), "clip_ratio/high_max": float(every[:, 1].max())}
    return {}
