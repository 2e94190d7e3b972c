"""Held-out GenEval-shapes accuracy per task, the way GenEval reports it: the mean over the six tasks.

Two evaluations:

- `geneval_items` (the test figure, once per run): `n_samples` images per prompt (4, as the official GenEval
  protocol), so every prompt gets a score (the mean over its images), per task the mean over its prompts, overall
  the mean over tasks; the per-prompt scores go into results.json for the paired intervals of
  `mmrl.tiny_world.stats` (items grouped by task).
- `geneval_accuracy` (the curves during training, on validation): `PER_TASK` images per task, the prompts of a task
  cycled, so the overall figure is the mean over tasks of equally precise estimates.

Images are sampled at temperature 1 (GenEval samples; DGPO's Avg@k is sampled too), every image from its own seed,
so two evaluations of one model with one seed see the same random numbers.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

from mmrl.geneval.rules import TASKS as GENEVAL_TASKS

PER_TASK = 64
"""Images per GenEval task in a balanced evaluation (384 images for the six tasks)."""
N_SAMPLES = 4
"""Images per prompt in a per-prompt evaluation (`geneval_items`; the official GenEval protocol samples 4)."""
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


def geneval_items(policy, rows: Sequence[dict], *, n_samples: int = N_SAMPLES, seed: int = 0, batch_size: int = 128,
                  **generation: Any) -> dict[str, Any]:
    """Per-prompt GenEval scores of `policy` on `rows`, `n_samples` images each: {"scores": [I] (mean over the
    prompt's images), "samples": [I][n_samples] (0 / 1 per image), "tags": [I] (the prompt's GenEval task),
    "prompts": [I], "per_task": {task: accuracy, "overall": mean over tasks}}."""
    from mmrl.training.evaluate import evaluate

    if int(n_samples) < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    rows = list(rows)
    repeated = [r for r in rows for _ in range(n_samples)]
    res = evaluate(policy, repeated, "geneval", batch_size=batch_size, progress=False, seed=seed,
                   **{**EVAL_GENERATION, **generation})
    samples = [[float(x) for x in res.scores[i * n_samples : (i + 1) * n_samples]] for i in range(len(rows))]
    scores = [sum(s) / n_samples for s in samples]
    return {"scores": scores, "samples": samples, "tags": [r["metadata"]["tag"] for r in rows],
            "prompts": [r["prompt"] for r in rows], "per_task": per_task_accuracy(rows, scores)}


def best_of_n(items: dict[str, Any]) -> dict[str, Any]:
    """Best-of-n from per-image scores (`geneval_items`' "samples"): a prompt scores 1 when any of its n images
    satisfies it (the GenEval verifier picks the image), in the same layout as `geneval_items`."""
    scores = [float(max(s)) for s in items["samples"]]
    rows = [{"metadata": {"tag": t}} for t in items["tags"]]
    return {**items, "scores": scores, "samples": [[x] for x in scores], "per_task": per_task_accuracy(rows, scores)}
