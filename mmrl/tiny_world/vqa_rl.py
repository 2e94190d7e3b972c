"""Visual question answering RL on the shapes world: GCPO vs GRPO on the tiny Qwen2.5-VL (`mmrl replicate
gcpo-vs-grpo-vqa`).

Both arms start from the cached `shapes-vqa` base (`mmrl pretrain-tiny shapes-vqa`, pre-trained on 30% wrong
answers, so it is partly right and its samples spread over answers), train on the `shapes_vqa` training rows with
the same rollouts per step, seeds, learning rate, KL and loss aggregation, and are scored on every held-out row by
exact match of the greedy answer, per question type (`vqa_accuracy`). The only difference is GCPO's token credit
(Gao et al., "GCPO", eq. 5-7: k3 contrast of the log-probs under the prompt vs under its negative condition, rank-
power weights); for the VLM the negative condition is the question with the wrong-answer instruction appended and
the image kept (`models.vlm`, `negative_instruction`), one extra no-grad forward per step.

Writes `<out>/gcpo-vs-grpo-vqa/results.json` (base accuracy and pass@k, each arm's accuracy per seed),
`table.md`, `accuracy.png` (held-out accuracy during training) and `reward.png` (training reward).
"""
from __future__ import annotations

import json
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch

NAME = "gcpo-vs-grpo-vqa"
"""The comparison's name (`mmrl replicate NAME`, the output folder)."""
BASE = "shapes-vqa"
"""The tiny-world base model both arms start from."""

VQA_RL: dict[str, Any] = {
    # the values of configs/tiny_grpo_shapes_vqa.yaml and configs/tiny_gcpo_shapes_vqa.yaml (a test checks both)
    "family": "vlm",
    "task": "shapes_vqa",
    "model_name_or_path": f"tiny-world:{BASE}",
    "reward_funcs": ["shapes_vqa"],
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 1,
    "max_steps": 60,
    "max_completion_length": 10,
    "temperature": 1.0,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_ratio": 0.1,
    "beta": 0.04,
    "dynamic_sampling": False,
    "loss_type": "dapo",
    "epsilon_high": 0.28,
    "dual_clip": 3.0,
    "negative_instruction": "Note: Intentionally generate an incorrect answer.",
    "eval_steps": 10,
    "eval_limit": None,
    "save_steps": 60,
}
"""Settings shared by both arms: 8 questions x 8 answers per optimizer step, 60 steps (3,840 answers per run)."""

ARMS: dict[str, dict[str, Any]] = {"GRPO": {"method": "grpo"}, "GCPO": {"method": "gcpo"}}
"""arm label -> its overrides of `VQA_RL`."""

SMOKE = {"max_steps": 2, "eval_steps": 1, "per_device_train_batch_size": 16, "save_steps": 2}
"""`smoke=True`: two small steps per arm (CI plumbing check)."""

CURVE_PER_TYPE = 40
"""Held-out rows per question type in the evaluations during training (the final one uses every test row)."""
PASS_K = 8
"""k of the base model's sampled pass@k diagnostic (the group size)."""
EVAL_GENERATION = {"temperature": 1.0, "top_k": 1}
"""Held-out answers are greedy (d1's evaluation decoding for autoregressive models)."""


def arm_config(arm: str, *, seed: int, out: Path, smoke: bool = False, steps: int | None = None) -> dict[str, Any]:
    cfg = {**VQA_RL, **ARMS[arm], "seed": seed, "output_dir": str(out), "progress_bar": False}
    if smoke:
        cfg.update(SMOKE)
    if steps is not None:
        cfg.update(max_steps=steps, eval_steps=max(1, steps // 6), save_steps=steps)
    return cfg


def balanced_rows(rows: Sequence[dict], per_type: int) -> list[dict]:
    """The first `per_type` rows of every question type, type by type."""
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES

    return [r for t in QUESTION_TYPES for r in [r for r in rows if r["qtype"] == t][:per_type]]


def per_type_accuracy(rows: Sequence[dict], scores: Sequence[float]) -> dict[str, float]:
    """Accuracy per question type and `overall`, the mean over all rows."""
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES

    acc: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(rows, scores):
        acc[r["qtype"]].append(float(s))
    out = {t: sum(v) / len(v) for t in QUESTION_TYPES if (v := acc.get(t))}
    out["overall"] = sum(float(s) for s in scores) / max(1, len(scores))
    return out


def vqa_accuracy(policy, rows: Sequence[dict], *, batch_size: int = 128) -> dict[str, float]:
    """Greedy held-out accuracy of `policy` on `rows`, per question type and overall."""
    return vqa_items(policy, rows, batch_size=batch_size)[0]


def vqa_items(policy, rows: Sequence[dict], *, batch_size: int = 128) -> tuple[dict[str, float], list[float]]:
    """(`vqa_accuracy`, the per-question 0 / 1 scores behind it)."""
    from mmrl.training.evaluate import evaluate

    res = evaluate(policy, rows, "shapes_vqa", batch_size=batch_size, progress=False, **EVAL_GENERATION)
    return per_type_accuracy(rows, res.scores), [float(x) for x in res.scores]


@torch.no_grad()
def pass_at_k(policy, rows: Sequence[dict], k: int = PASS_K, *, seed: int = 0, batch_size: int = 32) -> dict[str, dict[str, float]]:
    """Sampled (temperature 1) pass@1 (mean correctness of the k samples) and pass@k (any of the k right) per
    question type and overall: the headroom RL can sharpen."""
    from mmrl.tiny_world.shapes_vqa import shapes_vqa

    rows = list(rows)
    mean, best = [], []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        seeds = [seed * 1_000_003 + (start + i) * k + j for i in range(len(batch)) for j in range(k)]
        out = policy.sample([r["prompt"] for r in batch], k, seeds=seeds, temperature=1.0, top_k=0)
        scores = shapes_vqa(None, out.completions, [r["answer"] for r in batch for _ in range(k)])
        for i in range(len(batch)):
            group = scores[i * k : (i + 1) * k]
            mean.append(sum(group) / k)
            best.append(max(group))
    return {"pass@1": per_type_accuracy(rows, mean), f"pass@{k}": per_type_accuracy(rows, best)}


def run_gcpo_vs_grpo_vqa(out: str | Path = "runs/replicate", seeds: int = 5, smoke: bool = False, steps: int | None = None,
                         progress: bool = True) -> dict[str, Any]:
    """Run both arms over `seeds`; returns the results dict also written to `<out>/gcpo-vs-grpo-vqa/results.json`."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.models import ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES
    from mmrl.training.trainer import Trainer

    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be an integer >= 1 or None, got {steps!r}")
    say = print if progress else (lambda *a, **k: None)
    root = Path(out) / NAME
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t_all = time.perf_counter()
    ensure_built(BASE, progress=progress)
    from mmrl.tiny_world import register

    register()  # the tiny world's tasks and rewards
    task = load_task("shapes_vqa")
    test = balanced_rows(task.test, 2) if smoke else task.test
    curve_rows = balanced_rows(task.validation, 1 if smoke else CURVE_PER_TYPE)  # curves on validation; test once per run
    base_policy = load_base_policy(BASE, progress=False)
    before, before_items = vqa_items(base_policy, test)
    base_pass = pass_at_k(base_policy, test)
    curve_base = vqa_accuracy(base_policy, curve_rows)["overall"]  # the curves' step-0 level
    say("base model, held-out accuracy: " + "  ".join(f"{k} {v:.3f}" for k, v in before.items()))
    say(f"base model, sampled pass@1 {base_pass['pass@1']['overall']:.3f}, pass@{PASS_K} {base_pass[f'pass@{PASS_K}']['overall']:.3f}")
    arms: dict[str, list[dict]] = {}
    for arm in ARMS:
        for seed in range(seeds):
            run_dir = root / "runs" / f"{arm.lower()}-seed{seed}"
            cfg = load_config(None, arm_config(arm, seed=seed, out=run_dir, smoke=smoke, steps=steps))
            say(f"[{NAME}] {arm}, seed {seed + 1}/{seeds}: {cfg.max_steps} steps of "
                f"{cfg.prompts_per_rollout} questions x {cfg.num_generations} answers")
            policy = load_base_policy(BASE, progress=False)
            t0 = time.perf_counter()
            Trainer(cfg, policy=policy, dataset=task.train, eval_dataset=curve_rows, eval_metric="shapes_vqa").train()
            train_s = time.perf_counter() - t0
            after, items = vqa_items(policy, test)
            arms.setdefault(arm, []).append({"seed": seed, "after": after, "items": items, "train_seconds": train_s,
                                             "records": read_metrics(run_dir)})
            say(f"      held-out overall {after['overall']:.3f} (base {before['overall']:.3f}), {train_s:.0f} s")
    # ---- report
    header = ["question type", "base (greedy)", f"base pass@1 / pass@{PASS_K} (T=1)"] + [
        f"{a} ({seeds} seed{'s' if seeds > 1 else ''})" for a in arms]
    rows = []
    for key in [t for t in QUESTION_TYPES if t in before] + ["overall"]:
        row = [key, fmt(before[key]), f"{fmt(base_pass['pass@1'][key])} / {fmt(base_pass[f'pass@{PASS_K}'][key])}"]
        row += [fmt(*mean_std([r["after"][key] for r in runs])) for runs in arms.values()]
        rows.append(row)
    from mmrl.tiny_world.stats import difference_interval

    gain_ivs = {a: difference_interval([r["items"] for r in runs], [before_items]) for a, runs in arms.items()}
    rows.append(["gain, per-question mean (points) [95% CI]", "-", "-"] + [iv.fmt(signed=True) for iv in gain_ivs.values()])
    if len(arms) > 1:
        (a1, r1), (a2, r2) = list(arms.items())[:2]
        diff = difference_interval([r["items"] for r in r2], [r["items"] for r in r1])
        rows.append([f"{a2} - {a1} (points) [95% CI]", "-", "-", "-", diff.fmt(signed=True)][: len(header)])
    secs = {a: mean_std([r["train_seconds"] for r in runs])[0] for a, runs in arms.items()}
    rows.append(["seconds per run", "-", "-"] + [f"{s:.0f}" for s in secs.values()])
    table = markdown_table(header, rows)
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in arms.items()}, root / "accuracy.png",
                title=f"validation shapes VQA accuracy (greedy, {len(curve_rows)} questions)", ylabel="accuracy",
                baseline=curve_base)
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in arms.items()}, root / "reward.png",
                title="training reward (exact match, sampled at T=1)", ylabel="reward")
    total = time.perf_counter() - t_all
    results = {"name": NAME, "base": BASE, "before": before, "before_items": before_items, "base_pass_at_k": base_pass,
               "gains": {a: iv.to_dict() for a, iv in gain_ivs.items()}, "seeds": seeds, "seconds": total,
               "smoke": smoke, "test_rows": len(test), "task_info": task.info,
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in arms.items()},
               "configs": {a: arm_config(a, seed=0, out=Path("."), smoke=smoke, steps=steps) for a in ARMS}}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\n{seeds} seed{'s' if seeds > 1 else ''} per arm, {len(test)} held-out "
                                   f"questions (greedy answers, exact match), {total:.0f} s in all.\n")
    say("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results

