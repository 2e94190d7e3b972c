"""Accuracy of a policy on a task's test rows, with the d1 or DMPO evaluation protocol.

Both protocols (authors' code: dllm-reasoning/d1 eval/eval.py, yuchen-zhu-zyc/DMPO eval/eval.py; docs/sources.md
"DMPO") decode masked-diffusion models greedily (temperature 0) with low-confidence remasking and
semi-autoregressive blocks of 32, after the chat template with the assistant turn pre-filled with `<reasoning>`, and
score Sudoku on 256 of d1's 500 test puzzles drawn with numpy seed 42. They differ in the number of denoising steps:
d1 uses half the generation length (`d1_generation`), DMPO the full length (`--full_steps`, `dmpo_generation`).
Sudoku is scored by cell accuracy aggregated over all puzzles (correct blank cells / all blank cells), the other
tasks by the mean 1 / 0 correctness. Autoregressive text models decode greedily (top-k 1).
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


def _greedy_generation(family: str, gen_length: int, block_length: int, steps: int) -> dict[str, Any]:
    """The family's greedy decoding options (its adapter's `greedy_generation`)."""
    from mmrl.models import adapter_class

    return adapter_class(family).greedy_generation(gen_length, block_length, steps)


def d1_generation(family: str, gen_length: int = 256, block_length: int = 32, steps: int | None = None) -> dict[str, Any]:
    """d1's evaluation decoding for a family (greedy; masked diffusion: steps = gen_length / 2 unless given, as d1's
    `eval.py` sets `diffusion_steps = gen_length // 2`)."""
    return _greedy_generation(family, gen_length, block_length, steps or max(1, gen_length // 2))


def dmpo_generation(family: str, gen_length: int = 256, block_length: int = 32, steps: int | None = None) -> dict[str, Any]:
    """DMPO's evaluation decoding (greedy; masked diffusion: steps = gen_length unless given, DMPO's `--full_steps`)."""
    return _greedy_generation(family, gen_length, block_length, steps or gen_length)


PROTOCOLS = {"d1": d1_generation, "dmpo": dmpo_generation}
"""Evaluation protocols by name: each gives the decoding options; both pre-fill `<reasoning>` and use the 256
seeded Sudoku rows (`protocol_rows`)."""


def protocol_generation(protocol: str, family: str, gen_length: int = 256, block_length: int = 32,
                        steps: int | None = None) -> dict[str, Any]:
    """The decoding options of `protocol` ("d1" or "dmpo"; unknown names raise listing them)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown evaluation protocol {protocol!r}; valid: {sorted(PROTOCOLS)}")
    return PROTOCOLS[protocol](family, gen_length, block_length, steps)


PROTOCOL_SUDOKU_ROWS = 256
"""d1 and DMPO score Sudoku on 256 of the 500 test puzzles (`subsample=256`, numpy seed 42)."""


def protocol_rows(task, rows: Sequence[dict] | None = None) -> list[dict]:
    """The test rows of a d1 / DMPO evaluation of `task` (a `mmrl.data.tasks.Task`; `rows` default to its test
    split): the task's evaluation prompt (`Task.eval_prompt`, the authors' instructions) with `<reasoning>`
    pre-filled after the chat template (`mmrl.data.tasks.d1_eval_prompt`) and, for `sudoku`, the 256 puzzles the
    authors' scripts draw."""
    from mmrl.data.tasks import d1_eval_prompt, d1_sudoku_test

    rows = task.test if rows is None else rows
    if task.name == "sudoku":
        rows = d1_sudoku_test(PROTOCOL_SUDOKU_ROWS)
    prompt = task.eval_prompt or (lambda r: r["prompt"])
    return [{**r, "prompt": d1_eval_prompt(prompt(r))} for r in rows]


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
        seeds = [(seed * 1_000_003 + start + i) % 2**63 for i in range(len(batch))]  # torch seeds are 64-bit
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


def evaluate_during_training(policy, eval_rows: Sequence[dict], metric: str, cfg, accelerator, rank: int, world: int) -> dict[str, float]:
    """The trainer's periodic evaluation: each process scores its share of `eval_rows` with `cfg.eval_generation`
    (default: DMPO's decoding for the family, `dmpo_generation`); the accuracy is the mean over all rows."""
    gen = dict(cfg.eval_generation) or dmpo_generation(cfg.family, cfg.max_completion_length, cfg.block_length, None)
    known = getattr(policy, "generation_defaults", {})
    gen = {k: v for k, v in gen.items() if k in known}
    rows = list(eval_rows)[rank::world]
    t0 = time.perf_counter()
    res = evaluate(policy, rows, metric, batch_size=max(16, cfg.per_device_train_batch_size), progress=False,
                   seed=cfg.seed, **gen)
    total = torch.tensor([res.accuracy * max(1, len(rows)), float(len(rows))], device=accelerator.device)
    if world > 1:
        total = accelerator.reduce(total, reduction="sum")
    return {"eval/accuracy": float(total[0] / total[1].clamp(min=1)), "perf/eval_time": time.perf_counter() - t0}


@torch.no_grad()
def evaluate_rewards_during_training(policy, eval_rows: Sequence[dict], rewards, cfg, accelerator, rank: int,
                                     world: int) -> dict[str, float]:
    """The periodic evaluation with rewards instead of a task metric (TRL evaluates with the training rewards):
    one response per row (`cfg.eval_generation`, as `evaluate_during_training`), scored by the `RewardSet`
    `rewards`; `eval/reward` is the mean weighted reward, `eval/rewards/<name>/mean` each reward's mean over the rows
    it applies to, all processes."""
    from mmrl.rewards.completions import in_prompt_format

    gen = dict(cfg.eval_generation) or dmpo_generation(cfg.family, cfg.max_completion_length, cfg.block_length, None)
    known = getattr(policy, "generation_defaults", {})
    gen = {k: v for k, v in gen.items() if k in known}
    rows = list(eval_rows)[rank::world]
    t0 = time.perf_counter()
    bs = max(16, cfg.per_device_train_batch_size)
    names = list(rewards.names)
    sums = torch.zeros(2 + 2 * len(names), dtype=torch.float64)  # total, count, then (sum, count) per reward
    for start in range(0, len(rows), bs):
        batch = rows[start : start + bs]
        seeds = [(cfg.seed * 1_000_003 + rank + world * (start + i)) % 2**63 for i in range(len(batch))]
        rollout = policy.sample([r["prompt"] for r in batch], 1, seeds=seeds, **gen)
        columns = {k: [r.get(k) for r in batch] for k in batch[0] if k != "prompt"}
        out = rewards(rollout.prompts, in_prompt_format(rollout.prompts, rollout.completions), **columns)
        ok = out.valid & (out.scorable if out.scorable is not None else torch.ones_like(out.valid))  # [b]
        sums[0] += float(out.total[ok].double().sum())
        sums[1] += float(ok.sum())
        for j, name in enumerate(names):
            v = out.per_reward[name].double()  # [b] NaN where it does not apply
            sums[2 + 2 * j] += float(torch.nansum(v))
            sums[3 + 2 * j] += float((~torch.isnan(v)).sum())
    sums = sums.to(accelerator.device)
    if world > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    sums = sums.cpu()
    nan = float("nan")
    m = {"eval/reward": float(sums[0] / sums[1]) if sums[1] > 0 else nan}
    for j, name in enumerate(names):
        c = sums[3 + 2 * j]
        m[f"eval/rewards/{name}/mean"] = float(sums[2 + 2 * j] / c) if c > 0 else nan
    m["perf/eval_time"] = time.perf_counter() - t0
    return m
