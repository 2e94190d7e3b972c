"""GenEval's summary of a `results.jsonl` (djghosh13/geneval `evaluation/summary_scores.py`;
docs/geneval.md): image and prompt counts (prompts = distinct `metadata` strings), % correct images (mean of
`correct`), % correct prompts (mean over prompts of "any image correct"), per-task accuracy in first-seen order, and
the overall score = the unweighted mean of the task accuracies.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a results file; each needs `tag`, `metadata` and a boolean `correct` (errors name the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {str(path)!r} does not exist")
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{lineno}: each line must be a JSON object")
        missing = [k for k in ("tag", "metadata", "correct") if k not in row]
        if missing:
            raise ValueError(f"{path}:{lineno}: missing key(s) {missing} (a GenEval results line has filename, tag, "
                             "prompt, correct, reason, metadata, details)")
        if not isinstance(row["correct"], bool):
            raise ValueError(f"{path}:{lineno}: 'correct' must be true or false, got {row['correct']!r}")
        rows.append(row)
    if not rows:
        raise ValueError(f"results file {str(path)!r} holds no results")
    return rows


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The official summary numbers as a dict (fractions in [0, 1])."""
    if not rows:
        raise ValueError("no results to summarize")
    by_prompt: dict[str, bool] = {}
    by_task: dict[str, list[int]] = {}
    for r in rows:
        key = r["metadata"] if isinstance(r["metadata"], str) else json.dumps(r["metadata"])
        by_prompt[key] = by_prompt.get(key, False) or bool(r["correct"])
        hits = by_task.setdefault(r["tag"], [0, 0])
        hits[0] += bool(r["correct"])
        hits[1] += 1
    tasks = {tag: {"correct": k, "total": n, "accuracy": k / n} for tag, (k, n) in by_task.items()}
    return {
        "images": len(rows),
        "prompts": len(by_prompt),
        "correct_images": sum(bool(r["correct"]) for r in rows) / len(rows),
        "correct_prompts": sum(by_prompt.values()) / len(by_prompt),
        "tasks": tasks,
        "overall": sum(t["accuracy"] for t in tasks.values()) / len(tasks),
        "errors": sum(1 for r in rows if r.get("error")),
    }


def format_summary(s: Mapping[str, Any]) -> str:
    """The official printout."""
    lines = ["Summary", "=======", f"Total images: {s['images']}", f"Total prompts: {s['prompts']}",
             f"% correct images: {s['correct_images']:.2%}", f"% correct prompts: {s['correct_prompts']:.2%}"]
    if s.get("errors"):
        lines.append(f"Images with errors (scored incorrect): {s['errors']}")
    lines += ["", "Task breakdown", "=============="]
    for tag, t in s["tasks"].items():
        lines.append(f"{tag:<16} = {t['accuracy']:.2%} ({t['correct']} / {t['total']})")
    lines += ["", f"Overall score (avg. over tasks): {s['overall']:.5f}"]
    return "\n".join(lines)
