"""The rows a run trains and evaluates on: a task's splits or the rows passed to the `Trainer`, checked before any
model loads (a missing prompt column, null prompts, oversized rows stop the run with the file and row named)."""
from __future__ import annotations

from typing import Callable, Sequence

from mmrl.data.loading import DatasetError, require_column
from mmrl.data.validate import check_prompts


def training_data(cfg, dataset: Sequence[dict] | None, reward_funcs: Sequence[str | Callable] | None,
                  eval_dataset: Sequence[dict] | None, eval_metric: str | None):
    """(training rows, reward functions, evaluation rows, evaluation metric) of a run.

    Without `dataset`, `cfg.task`'s training split, its rewards (unless `reward_funcs` or `cfg.reward_funcs` name
    others), its validation split for the curves (the test split where it has none: the test split is for the final
    figure only) and its metric; given arguments win."""
    if dataset is None:
        from mmrl.data.tasks import load_task

        task = load_task(cfg.task, cfg.dataset_path, seed=cfg.seed, eval_split=cfg.eval_split,
                         geneval_train_on_eval_prompts=cfg.geneval_train_on_eval_prompts)
        dataset = task.train
        reward_funcs = reward_funcs or cfg.reward_funcs or task.reward_funcs
        eval_dataset = (task.validation or task.test) if eval_dataset is None else eval_dataset
        eval_metric = eval_metric or task.metric
    where = _where(cfg)
    require_column(list(dataset), "prompt", where)  # no prompt column, or null / missing prompts: stop here
    check_prompts(list(dataset), "the training dataset")
    return dataset, reward_funcs, eval_dataset, eval_metric


def _where(cfg) -> str:
    return "the training dataset" if cfg.dataset_path is None else cfg.dataset_path


def check_reward_columns(cfg, rewards, rows: Sequence[dict]) -> None:
    """Raise `DatasetError` when a reward of `rewards` (a `RewardSet`) reads a column the rows lack."""
    missing = rewards.missing_columns([k for row in rows[:1] for k in row])
    if missing:
        name, cols = next(iter(missing.items()))
        raise DatasetError(f"reward {name!r} needs the dataset column(s) {cols}, which {_where(cfg)} lacks (columns: "
                           f"{sorted(rows[0])}); add them, or choose rewards for this data")
