"""What the run records of its completions: which responses were cut at the length limit, TRL's
completion-length metrics, and the completions table.

A response is truncated when it did not end by itself: no EOS (masked diffusion: no EOS inside the generated span).
Its length says nothing about that: the response tensor is as wide as the longest response of the batch, so a
response that ends with EOS exactly in the last column is as long as the widest one and still finished. TRL:
`is_truncated = ids[-1] not in eos_and_pad` (GRPOTrainer, `mask_truncated_completions`), `clipped_ratio` = the
fraction not terminated, `mean/min/max_terminated_length` over the terminated ones (0 when none is).

The completions table (`log_completions=true`, TRL's name): one row per sampled response of a rollout batch with
its prompt, completion, every reward, the advantage, and the columns rewards logged (TRL's `log_extra(column,
values)`, e.g. `golden_answer` / `extracted_answer`, and the non-score keys of dict returns as `<reward>/<key>`), each
a top-level column as in TRL's table (`extra/<name>` where a name clashes with a fixed column); written to `<run>/completions.jsonl` and to TensorBoard
(a markdown table under `completions`) and W&B (a `wandb.Table`) by `MetricLogger.log_completions`."""
from __future__ import annotations

import json
import math
import warnings
from typing import Any, Sequence

import torch

from mmrl.core.protocol import Rollout
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

# ------------------------------------------------------------------------------ lengths and truncation

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
