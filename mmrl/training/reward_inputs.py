"""The arguments reward functions receive, exactly as TRL's `GRPOTrainer._calculate_rewards` passes them.

    reward_fn(prompts=..., completions=..., completion_ids=..., trainer_state=..., <every dataset column>=...,
              log_metric=..., log_extra=...)

- `prompts`: as in the dataset (strings or chat messages), repeated G times;
- `completions`: in the prompt's format: strings for plain prompts, `[{"role": "assistant", "content": text}]` for
  conversational ones (TRL's format, so the common `completion[0]["content"]` works), PIL images for image models;
- `completion_ids`: the response token ids through the first EOS, one list per completion;
- `trainer_state`: a `transformers.TrainerState` with `global_step`, `max_steps`, `epoch`, `num_train_epochs`
  (curriculum rewards read it);
- every dataset column but `prompt`, one value per completion.
"""
from __future__ import annotations

from typing import Any, Sequence

from mmrl.core.protocol import Rollout
from mmrl.rewards.completions import in_prompt_format


def build_rewards(cfg, reward_funcs=None):
    """The run's `mmrl.rewards.combine.RewardSet`: `reward_funcs` (names or callables) or `cfg.reward_funcs`, with the
    config's weights, error policy, timeout, retries and reward kwargs."""
    from mmrl.rewards.combine import RewardSet

    return RewardSet(list(reward_funcs or cfg.reward_funcs), weights=cfg.reward_weights, on_error=cfg.on_reward_error,
                     timeout=cfg.reward_timeout, retries=cfg.reward_retries, retry_backoff=cfg.reward_retry_backoff,
                     **cfg.reward_kwargs)


def build_eval_rewards(cfg):
    """The `RewardSet` of `cfg.eval_reward_funcs` for the periodic evaluation (failures dropped, not raised; the
    reward kwargs of those rewards)."""
    from mmrl.rewards.combine import RewardSet

    return RewardSet(list(cfg.eval_reward_funcs), on_error="drop", timeout=cfg.reward_timeout, retries=cfg.reward_retries,
                     retry_backoff=cfg.reward_retry_backoff,
                     **{k: v for k, v in cfg.reward_kwargs.items() if k in cfg.eval_reward_funcs})


def make_trainer_state(step: int, max_steps: int, epoch: float, num_train_epochs: float | None = None):
    """A `transformers.TrainerState` describing the step being collected for (TRL passes `self.state`)."""
    from transformers import TrainerState

    return TrainerState(global_step=int(step), max_steps=int(max_steps), epoch=float(epoch),
                        num_train_epochs=int(num_train_epochs) if num_train_epochs is not None else 0)


def completion_ids(rollout: Rollout) -> list[list[int]]:
    """[N] the valid response token ids of each completion (TRL's `completion_ids`)."""
    return [ids[m].tolist() for ids, m in zip(rollout.response_ids.cpu(), rollout.response_mask.cpu())]


def reward_arguments(rollout: Rollout, rows: Sequence[dict], group_size: int, *, trainer_state: Any = None) -> tuple[list, list, dict]:
    """(prompts, completions, keyword columns) for `RewardSet(prompts, completions, **columns)`; `rows` are the B
    dataset rows the rollout answers, each repeated `group_size` times."""
    columns = {k: [row.get(k) for row in rows for _ in range(group_size)] for k in rows[0] if k != "prompt"}
    columns["completion_ids"] = completion_ids(rollout)
    if trainer_state is not None:
        columns["trainer_state"] = trainer_state
    return list(rollout.prompts), in_prompt_format(rollout.prompts, rollout.completions), columns


def response_columns(columns: dict, idx: Sequence[int], num_responses: int) -> dict[str, list]:
    """The per-response dataset columns of `reward_arguments`'s `columns` ([N] lists; not `completion_ids` or the
    trainer state) restricted to responses `idx`, for the buffer (`Buffer.columns`)."""
    return {k: [v[i] for i in idx] for k, v in columns.items()
            if k != "completion_ids" and isinstance(v, list) and len(v) == num_responses}
