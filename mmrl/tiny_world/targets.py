"""Rollouts-to-target: how many sampled answers a run needs before its validation curve first reaches a target
accuracy (DMPO's sample-efficiency claim, Zhu et al. 2025, arXiv 2510.08233, "reaches the baseline's final accuracy
with fewer rollouts"; docs/RESULTS.md, "DMPO reuse F > 1 without negative weights").

A run's validation curve is a list of (optimizer step, accuracy) points; with F optimizer steps per rollout batch an
evaluation after step s has seen s / F rollout batches. The curve's first point may be the base's (step 0).
Pure functions of plain lists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class TargetHit:
    """Where a curve first reaches a target: `batches` rollout batches (the budget when `reached` is False, i.e. the
    run is censored there) and `rollouts` = batches x answers per batch."""

    batches: int
    rollouts: int
    reached: bool


def batches_curve(points: Sequence[tuple[int, float]], steps_per_rollout: int) -> list[tuple[int, float]]:
    """[(rollout batches seen, accuracy)] from [(optimizer step, accuracy)] at `steps_per_rollout` (F) optimizer
    steps per rollout batch; an evaluation inside a batch's F steps counts the batches it has started (ceil)."""
    if steps_per_rollout < 1:
        raise ValueError(f"steps_per_rollout (F) must be >= 1, got {steps_per_rollout}")
    return [(-(-int(s) // steps_per_rollout), float(a)) for s, a in points]


def rollouts_to_target(curve: Sequence[tuple[int, float]], target: float, answers_per_batch: int,
                       budget_batches: int) -> TargetHit:
    """The first point of `curve` ([(rollout batches, accuracy)], any order; sorted here) whose accuracy is at least
    `target`; if none is, the run is censored at `budget_batches` (`reached` False). `answers_per_batch`: prompts x
    answers per prompt of one rollout batch (16 x 8 = 128 in `dllm-countdown3`)."""
    if answers_per_batch < 1 or budget_batches < 0:
        raise ValueError(f"answers_per_batch must be >= 1 and budget_batches >= 0, got {answers_per_batch}, {budget_batches}")
    if not curve:
        raise ValueError("rollouts_to_target needs at least one curve point")
    for b, acc in sorted(curve):
        if acc >= target:
            return TargetHit(int(b), int(b) * answers_per_batch, True)
    return TargetHit(budget_batches, budget_batches * answers_per_batch, False)


def mean_curve(curves: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The pointwise mean over runs of curves on one grid ([(x, y)] each, the same x's in the same order)."""
    if not curves:
        raise ValueError("mean_curve needs at least one curve")
    xs = [x for x, _ in curves[0]]
    for c in curves[1:]:
        if [x for x, _ in c] != xs:
            raise ValueError(f"mean_curve: curves on different grids ({xs} vs {[x for x, _ in c]})")
    return [(x, sum(c[i][1] for c in curves) / len(curves)) for i, x in enumerate(xs)]
