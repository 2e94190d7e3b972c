"""The optimizer and learning-rate schedule of a run, with TRL's / transformers 5's meanings of `optim`,
`warmup_steps` (steps, or a ratio below 1), `lr_scheduler_type` and `lr_scheduler_kwargs`.

Both are checked at start-up (`check_schedule`, from `TrainConfig.validate`) by building the schedule on a
one-parameter optimizer: an unknown scheduler name or a keyword it does not take is a configuration error before
any model loads, not a traceback after.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import torch

OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw_torch": {},  # transformers' name for torch.optim.AdamW (torch's default foreach kernels)
    "adamw_torch_fused": {"fused": True},  # TRL 1.16's default: torch's fused AdamW kernel, same update
}
"""transformers' `optim` names of the AdamW variants torch ships -> `torch.optim.AdamW` keyword arguments."""


def warmup_step_count(warmup_steps: float, warmup_ratio: float, max_steps: int) -> int:
    """transformers 5's `TrainingArguments.get_warmup_steps`: `warmup_steps` >= 1 is a step count, a value in
    [0, 1) is a fraction of the training steps, rounded up; transformers 4's `warmup_ratio` is that fraction."""
    if warmup_steps >= 1:
        return int(warmup_steps)
    return math.ceil(max_steps * (warmup_steps or warmup_ratio))


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg) -> torch.optim.Optimizer:
    """`torch.optim.AdamW` with the config's hyper-parameters and the `optim` variant's kernel."""
    return torch.optim.AdamW(list(params), lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                             weight_decay=cfg.weight_decay, **OPTIMIZERS[cfg.optim])


def build_scheduler(optimizer: torch.optim.Optimizer, cfg, max_steps: int | None = None):
    """transformers' `get_scheduler` for `lr_scheduler_type` with `lr_scheduler_kwargs` (TRL passes them as
    `scheduler_specific_kwargs`)."""
    from transformers import get_scheduler

    steps = cfg.max_steps if max_steps is None else max_steps
    return get_scheduler(cfg.lr_scheduler_type, optimizer,
                         num_warmup_steps=warmup_step_count(cfg.warmup_steps, cfg.warmup_ratio, max(steps, 1)),
                         num_training_steps=max(steps, 1), scheduler_specific_kwargs=dict(cfg.lr_scheduler_kwargs) or None)


def check_schedule(cfg) -> list[str]:
    """Errors of `optim`, `lr_scheduler_type` and `lr_scheduler_kwargs`, found by building them on one parameter."""
    e: list[str] = []
    if cfg.optim not in OPTIMIZERS:
        e.append(f"optim={cfg.optim!r} is not supported; choose one of {list(OPTIMIZERS)} (the AdamW variants torch ships)")
        return e
    from transformers.trainer_utils import SchedulerType

    names = [s.value for s in SchedulerType]
    if cfg.lr_scheduler_type not in names:
        e.append(f"lr_scheduler_type={cfg.lr_scheduler_type!r} is not a transformers scheduler; choose one of {names}")
        return e
    if cfg.lr_scheduler_type == "reduce_lr_on_plateau":
        e.append("lr_scheduler_type='reduce_lr_on_plateau' steps on an evaluation metric, which RL training has not; choose "
                 "another schedule")
        return e
    try:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        build_scheduler(opt, cfg, max_steps=max(cfg.max_steps, 1))
    except (TypeError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        e.append(f"lr_scheduler_kwargs={dict(cfg.lr_scheduler_kwargs)!r} do not fit lr_scheduler_type={cfg.lr_scheduler_type!r}: {first}")
    return e
