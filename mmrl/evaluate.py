"""Accuracy of a policy on a task's test rows, with d1's evaluation settings by default.

d1 / DMPO evaluation (reference notes `dmpo_dllm.md` 1.7): masked-diffusion models decode greedily (temperature 0)
with low-confidence remasking, semi-autoregressive blocks of 32 and steps = generation length; Sudoku is scored by
cell accuracy aggregated over all puzzles (correct blank cells / all blank cells), the other tasks by the mean
correctness. Autoregressive text models decode greedily (top-k 1).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch


@dataclass
class EvalResult:
    task: str
    metric: str
    accuracy: float
    """Mean correctness, or for Sudoku the aggregated cell accuracy."""
    n: int
    seconds: float
    scores: list[float] = field(default_factory=list)
    completions: list[Any] = field(default_factory=list)

    def to_dict(self, with_samples: bool = False) -> dict:
        d = {"task": self.task, "metric": self.metric, "accuracy": self.accuracy, "n": self.n, "seconds": self.seconds}
        if with_samples:
            d["scores"] = self.scores
            d["completions"] = [c if isinstance(c, str) else None for c in self.completions]
        return d


def d1_generation(family: str, gen_length: int = 256, block_length: int = 32, steps: int | None = None) -> dict[str, Any]:
    """d1's evaluation decoding for a family (greedy)."""
    if family == "masked_diffusion":
        return {"gen_length": gen_length, "block_length": block_length, "steps": steps or gen_length, "temperature": 0.0,
                "sampler": "low_confidence"}
    if family in ("causal_lm", "vlm"):
        return {"max_new_tokens": gen_length, "temperature": 1.0, "top_k": 1}
    return {}


@torch.no_grad()
def evaluate(policy, rows: Sequence[dict], metric: str, *, task: str = "", batch_size: int = 16, progress: bool = True,
             seed: int = 0, **generation: Any) -> EvalResult:
    """Sample one response per row (greedy unless `generation` says otherwise) and score it with reward `metric`."""
    from mmrl.rewards import RewardSet
    from mmrl.rewards.completions import in_prompt_format

    scorer = RewardSet([metric])
    rows = list(rows)
    scores: list[float] = []
    completions: list[Any] = []
    t0 = time.perf_counter()
    it = range(0, len(rows), batch_size)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"eval {task or metric}", unit="batch", leave=False)
    for start in it:
        batch = rows[start : start + batch_size]
        seeds = [seed * 1_000_003 + start + i for i in range(len(batch))]
        rollout = policy.sample([r["prompt"] for r in batch], 1, seeds=seeds, **generation)
        columns = {k: [r.get(k) for r in batch] for k in batch[0] if k != "prompt"}
        out = scorer(rollout.prompts, in_prompt_format(rollout.prompts, rollout.completions), **columns)  # as in training
        scores += out.per_reward[metric].tolist()
        completions += list(rollout.completions)
    if metric == "sudoku":
        blanks = [r["puzzle"].count("0") for r in rows]
        acc = sum(s * b for s, b in zip(scores, blanks)) / max(1, sum(blanks))
    else:
        acc = sum(scores) / max(1, len(scores))
    return EvalResult(task, metric, float(acc), len(rows), time.perf_counter() - t0, scores, completions)


def write_result(result: EvalResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result.to_dict(with_samples=True), f, indent=2)
