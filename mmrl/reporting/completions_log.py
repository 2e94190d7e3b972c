"""The completions table (`log_completions=true`, TRL's name): one row per sampled response of a rollout batch with
its prompt, completion, every reward, the advantage, and the columns rewards logged (TRL's `log_extra(column,
values)`, e.g. `golden_answer` / `extracted_answer`, and the non-score keys of dict returns as `<reward>/<key>`), each
a top-level column as in TRL's table (`extra/<name>` where a name clashes with a fixed column); written to `<run>/completions.jsonl` and to TensorBoard
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


FIXED_COLUMNS = ("step", "prompt", "completion", "rewards", "reward", "advantage")
"""The columns every row has; a logged extra of one of these names is written as `extra/<name>`."""


def extra_column(name: str) -> str:
    return f"extra/{name}" if name in FIXED_COLUMNS else name


def _cell(value: Any) -> Any:
    """A logged value as JSON can hold it (numbers, strings, None, lists and dicts of them; anything else as text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_cell(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _cell(v) for k, v in value.items()}
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _cell(value.item())
    return str(value)


def completion_rows(prompts: Sequence, completions: Sequence, per_reward: dict[str, torch.Tensor], idx: Sequence[int],
                    extras: dict[str, list] | None = None) -> list[dict]:
    """Rows `idx` of a scored batch: `prompt` and `completion` as text (None for images), `rewards` by name
    (None where a reward does not apply), and each logged extra column (None where a sample has no value)."""
    rows = []
    n = len(completions)
    for i in idx:
        rewards = {name: (None if math.isnan(float(v[i])) else float(v[i])) for name, v in per_reward.items()}
        row = {"prompt": _text(prompts[i], prompt_text), "completion": _text(completions[i], completion_text),
               "rewards": rewards}
        for name, col in (extras or {}).items():
            row[extra_column(name)] = _cell(col[i]) if isinstance(col, (list, tuple)) and len(col) == n else None
        rows.append(row)
    return rows


def extra_names(rows: list[dict]) -> list[str]:
    """The logged extra columns of `rows`, in first-seen order."""
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k not in FIXED_COLUMNS:
                names.setdefault(k)
    return list(names)


def with_advantages(rows: list[dict], advantages: torch.Tensor, total: torch.Tensor) -> list[dict]:
    """The rows with the total reward and the advantage of each response added."""
    return [{**r, "reward": float(t), "advantage": float(a)} for r, t, a in zip(rows, total.tolist(), advantages.tolist())]


def jsonl_lines(step: int, rows: list[dict]) -> str:
    return "".join(json.dumps({"step": step, **r}) + "\n" for r in rows)


def markdown_table(rows: list[dict]) -> str:
    """A markdown table of the first MAX_TEXT_ROWS rows (TensorBoard renders markdown in its text tab)."""
    names = sorted({k for r in rows for k in r["rewards"]})
    extra = extra_names(rows)
    head = "| prompt | completion | " + " | ".join([*names, *extra]) + " | reward | advantage |"
    sep = "|" + "---|" * (len(names) + len(extra) + 4)

    def cell(x) -> str:
        s = "" if x is None else (f"{x:.4g}" if isinstance(x, float) else str(x))
        return s.replace("|", "\\|").replace("\n", " ")[:200]

    body = ["| " + " | ".join([cell(r["prompt"]), cell(r["completion"]), *(cell(r["rewards"].get(n)) for n in names),
                               *(cell(r.get(x)) for x in extra), cell(r["reward"]), cell(r["advantage"])]) + " |" for r in rows[:MAX_TEXT_ROWS]]
    return "\n".join([head, sep, *body])
