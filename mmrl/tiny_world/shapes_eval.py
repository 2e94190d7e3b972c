"""Held-out GenEval-shapes accuracy per task, the way GenEval reports it: the mean over the six tasks.

The held-out prompts of `shapes` are 20% of the distinct prompts of every task, which leaves 1 prompt for
single_object, two_object and counting and 40 for color_attr; each task gets the same number of sampled images
(`PER_TASK`, the prompts of a task cycled), so the overall figure is the mean over tasks of equally precise
estimates. Images are sampled at temperature 1 (GenEval samples; DGPO's Avg@k is sampled too), every row from its
own seed, so two evaluations of one model with one seed see the same random numbers.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from mmrl.geneval.rules import TASKS as GENEVAL_TASKS

PER_TASK = 64
"""Images per GenEval task in a held-out evaluation (384 images for the six tasks)."""
EVAL_GENERATION = {"temperature": 1.0, "cfg_scale": 1.0}
"""How held-out images are sampled (the rollouts' settings in the tiny presets)."""


def balanced_rows(rows: Sequence[dict], per_task: int = PER_TASK) -> list[dict]:
    """`per_task` rows of every GenEval task present in `rows` (the task's prompts cycled in order), task by task."""
    by_tag: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_tag[r["metadata"]["tag"]].append(r)
    out = []
    for tag in GENEVAL_TASKS:
        group = by_tag.get(tag, [])
        out += [group[i % len(group)] for i in range(per_task)] if group else []
    return out


def per_task_accuracy(rows: Sequence[dict], scores: Sequence[float]) -> dict[str, float]:
    """Accuracy per GenEval task and `overall`, the mean over the tasks present (GenEval's overall score)."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(rows, scores):
        acc[r["metadata"]["tag"]].append(float(s))
    out = {tag: sum(v) / len(v) for tag in GENEVAL_TASKS if (v := acc.get(tag))}
    out["overall"] = sum(out.values()) / max(1, len(out))
    return out


def geneval_accuracy(policy, rows: Sequence[dict], *, per_task: int = PER_TASK, seed: int = 0, batch_size: int = 128,
                     **generation: Any) -> tuple[dict[str, float], list]:
    """({task: accuracy, "overall": mean over tasks}, the sampled images) of `policy` on held-out `rows`."""
    from mmrl.training.evaluate import evaluate

    balanced = balanced_rows(rows, per_task)
    res = evaluate(policy, balanced, "geneval", batch_size=batch_size, progress=False, seed=seed,
                   **{**EVAL_GENERATION, **generation})
    return per_task_accuracy(balanced, res.scores), res.completions
