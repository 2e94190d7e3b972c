"""The completions table (`log_completions=true`, TRL's name): one row per sampled response of a rollout batch with
its prompt, completion, every reward and the advantage; written to `<run>/completions.jsonl` and to TensorBoard
(a markdown table under `completions`) and W&B (a `wandb.Table`) by `MetricLogger.log_completions`."""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import torch

from mmrl.rewards.completions import completion_text, prompt_text

MAX_TEXT_ROWS = 32
"""Rows of the TensorBoard text table per step (the JSONL file keeps all of them)."""


def _text(value: Any, read) -> str | None:
    if isinstance(value, str):
        return value
    try:
        return read(value)
    except TypeError:
        return None  # an image or another non-text payload


def completion_rows(prompts: Sequence, completions: Sequence, per_reward: dict[str, torch.Tensor], idx: Sequence[int]) -> list[dict]:
    """Rows `idx` of a scored batch: `prompt` and `completion` as text (None for images), `rewards` by name
    (None where a reward does not apply)."""
    rows = []
    for i in idx:
        rewards = {name: (None if math.isnan(float(v[i])) else float(v[i])) for name, v in per_reward.items()}
        rows.append({"prompt": _text(prompts[i], prompt_text), "completion": _text(completions[i], completion_text),
                     "rewards": rewards})
    return rows


def with_advantages(rows: list[dict], advantages: torch.Tensor, total: torch.Tensor) -> list[dict]:
    """The rows with the total reward and the advantage of each response added."""
    return [{**r, "reward": float(t), "advantage": float(a)} for r, t, a in zip(rows, total.tolist(), advantages.tolist())]


def jsonl_lines(step: int, rows: list[dict]) -> str:
    return "".join(json.dumps({"step": step, **r}) + "\n" for r in rows)


def markdown_table(rows: list[dict]) -> str:
    """A markdown table of the first MAX_TEXT_ROWS rows (TensorBoard renders markdown in its text tab)."""
    names = sorted({k for r in rows for k in r["rewards"]})
    head = "| prompt | completion | " + " | ".join(names) + " | reward | advantage |"
    sep = "|" + "---|" * (len(names) + 4)

    def cell(x) -> str:
        s = "" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
        return s.replace("|", "\\|").replace("\n", " ")[:200]

    body = ["| " + " | ".join([cell(r["prompt"]), cell(r["completion"]), *(cell(r["rewards"].get(n)) for n in names),
                               cell(r["reward"]), cell(r["advantage"])]) + " |" for r in rows[:MAX_TEXT_ROWS]]
    return "\n".join([head, sep, *body])
