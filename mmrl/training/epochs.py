"""TRL's `num_train_epochs`: the optimizer steps that make a number of passes over the prompt dataset."""
from __future__ import annotations

import math


def steps_for_epochs(epochs: float, num_prompts: int, prompts_per_rollout: int, num_iterations: int) -> int:
    """ceil(epochs x num_prompts / prompts_per_rollout) rollout batches, each giving `num_iterations` optimizer
    steps; `prompts_per_rollout` counts the prompts of one rollout batch over all processes. At least one step."""
    if num_prompts < 1 or prompts_per_rollout < 1:
        raise ValueError(f"need prompts (got {num_prompts}) and a positive rollout batch (got {prompts_per_rollout})")
    return max(1, math.ceil(epochs * num_prompts / prompts_per_rollout)) * num_iterations


def eval_interval(cfg, num_prompts: int, world: int) -> int:
    """Optimizer steps between evaluations (0 = none): `eval_steps`, or transformers' `eval_strategy` (no: none;
    steps: eval_steps, which defaults to logging_steps; epoch: the steps of one pass over the prompts)."""
    if cfg.eval_strategy is None:
        return cfg.eval_steps
    if cfg.eval_strategy == "no":
        return 0
    if cfg.eval_strategy == "steps":
        return cfg.eval_steps or cfg.logging_steps
    return steps_for_epochs(1.0, num_prompts, cfg.prompts_per_rollout * world, cfg.steps_per_rollout)


def resolve_max_steps(cfg, num_prompts: int, world: int) -> int:
    """`cfg.max_steps`, or with `num_train_epochs` and max_steps -1 or not given, the steps those epochs take
    (TRL: a positive max_steps overrides num_train_epochs)."""
    if cfg.num_train_epochs is None or (cfg.max_steps > 0 and "max_steps" in cfg._explicit):
        return cfg.max_steps
    return steps_for_epochs(cfg.num_train_epochs, num_prompts, cfg.prompts_per_rollout * world, cfg.steps_per_rollout)
