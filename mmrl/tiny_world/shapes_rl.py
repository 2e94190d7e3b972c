"""Text-to-image RL on the shapes world: GCPO vs GRPO on the tiny Janus model (`mmrl replicate gcpo-vs-grpo`).

Both arms start from the cached `shapes` base (`mmrl pretrain-tiny shapes`), train on the same training prompts
with the same rollouts per step, seeds, learning rate, KL and loss aggregation, and are scored on the held-out
prompts by the GenEval rule through the exact `shapes` detector, per task (`mmrl.tiny_world.shapes_eval`). The only
difference is GCPO's token credit (Gao et al., "GCPO", eq. 5-7: k3 contrast of the prompt-conditioned vs the
null-prompt log-probs, rank-power weights), which costs one extra no-grad forward per step under the null prompt.
Writes `<out>/results.json`, `table.md`, `accuracy.png`, `reward.png`, `grid.png` (the same held-out prompts and
seeds before and after, seed 0 of each arm) and `credit.png` (GCPO's token credit laid over its images).
"""
from __future__ import annotations

import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SHAPES_RL: dict[str, Any] = {
    # the values of configs/tiny_grpo_shapes.yaml and configs/tiny_gcpo_shapes.yaml (a test checks both)
    "family": "janus",
    "task": "shapes",
    "model_name_or_path": "tiny-world:shapes",
    "reward_funcs": ["geneval_strict"],
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 2,
    "max_steps": 60,
    "cfg_scale": 1.0,
    "temperature": 1.0,
    "learning_rate": 5e-4,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "beta": 0.1,
    "dynamic_sampling": False,
    "loss_type": "dapo",
    "epsilon_high": 0.28,
    "dual_clip": 3.0,
    "eval_steps": 20,
    "eval_limit": None,
    "save_steps": 60,
    "credit_steps": 30,
}
"""Settings shared by both arms: 16 prompts x 8 images per optimizer step, 60 steps (7,680 images per run). At 100
steps the held-out figure was lower (GCPO +8.6 +- 1.9 vs +10.1 +- 1.1 points, 3 seeds each): the model starts to
memorise the training prompts (docs/RESULTS.md)."""

ARMS: dict[str, dict[str, Any]] = {"GRPO": {"method": "grpo"}, "GCPO": {"method": "gcpo"}}
"""arm label -> its overrides of `SHAPES_RL`."""

SMOKE = {"max_steps": 2, "eval_steps": 1, "gradient_accumulation_steps": 1, "per_device_train_batch_size": 16,
         "save_steps": 2, "credit_steps": 1}
"""`--smoke`: two small steps per arm (CI plumbing check)."""

FINAL_PER_TASK = 256
"""Held-out images per GenEval task for the before / after figures (1,536 images: the overall figure's standard
error is about 1 point; the curves use `shapes_eval.PER_TASK`)."""

GRID_PROMPTS = 12
"""Held-out prompts shown in the before/after image grid (two per GenEval task)."""


def arm_config(arm: str, *, seed: int, out: Path, smoke: bool = False, steps: int | None = None,
               recipe: dict[str, Any] | None = None, arm_table: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """One arm's full override dict: the recipe (default `SHAPES_RL`), the arm's overrides (default `ARMS`)."""
    cfg = {**(recipe or SHAPES_RL), **(arm_table or ARMS)[arm], "seed": seed, "output_dir": str(out), "progress_bar": False}
    if smoke:
        cfg.update(SMOKE)
    if steps is not None:
        cfg["max_steps"] = steps
        cfg["eval_steps"] = max(1, steps // 5)
        cfg["save_steps"] = steps
        cfg["credit_steps"] = max(1, steps // 2)
    return cfg


def _grid_rows(test: list[dict]) -> list[dict]:
    from mmrl.geneval.rules import TASKS

    out = []
    for tag in TASKS:
        out += [r for r in test if r["metadata"]["tag"] == tag][: GRID_PROMPTS // len(TASKS)]
    return out


def _images(policy, rows: list[dict], generation: dict[str, Any] | None = None) -> list:
    from mmrl.tiny_world.shapes_eval import EVAL_GENERATION

    gen = {**EVAL_GENERATION, **(generation or {})}
    return list(policy.sample([r["prompt"] for r in rows], 1, seeds=list(range(len(rows))), **gen).completions)


def run_gcpo_vs_grpo(out: str | Path = "runs/replicate", *, seeds: int = 3, smoke: bool = False, steps: int | None = None,
                     progress: bool = True, per_task: int | None = None) -> dict[str, Any]:
    """Run both arms over `seeds`; returns the results dict also written to `<out>/gcpo-vs-grpo/results.json`."""
    return run_shapes_rl(Path(out) / "gcpo-vs-grpo", list(ARMS), seeds=seeds, smoke=smoke, steps=steps,
                         progress=progress, per_task=per_task, name="gcpo-vs-grpo")


BASE_SMOKE_STEPS = 20
"""Pre-training steps of the base model under `smoke` (a separately cached, untrained-looking model)."""


def run_shapes_rl(root: str | Path, arms: list[str], *, seeds: int = 3, smoke: bool = False, steps: int | None = None,
                  progress: bool = True, per_task: int | None = None, name: str = "shapes-rl", base: str = "shapes",
                  recipe: dict[str, Any] | None = None, arm_table: dict[str, dict[str, Any]] | None = None,
                  eval_generation: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train each arm of `arm_table` (default `ARMS`) named in `arms` over `seeds` from the tiny-world base `base`
    with `recipe` (default `SHAPES_RL`) and report into `root` (replaced if it exists): per-task held-out GenEval
    before and after (sampled with `shapes_eval.EVAL_GENERATION` updated by `eval_generation`), curves, the image
    grid and GCPO's credit picture (when a GCPO arm ran)."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.geneval.rules import TASKS
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, image_grid, markdown_table, mean_std, plot_curves
    from mmrl.tiny_world.shapes_eval import PER_TASK, balanced_rows, geneval_accuracy
    from mmrl.training.trainer import Trainer

    arm_table = arm_table or ARMS
    unknown = sorted(set(arms) - set(arm_table))
    if unknown or not arms:
        raise ValueError(f"unknown arms {unknown or arms}; valid: {list(arm_table)}")
    arm_kw = {"recipe": recipe, "arm_table": arm_table}
    say = print if progress else (lambda *a, **k: None)
    per_task = per_task or (4 if smoke else FINAL_PER_TASK)  # before / after figures
    curve_per_task = 4 if smoke else PER_TASK  # the trainer's evaluations during training (curves)
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t_all = time.perf_counter()
    register()  # the tiny world's tasks and rewards
    base_steps = BASE_SMOKE_STEPS if smoke else None
    t0 = time.perf_counter()
    base_dir = ensure_built(base, progress=progress, steps=base_steps)
    build_s = time.perf_counter() - t0
    task = load_task("shapes")
    eval_rows = balanced_rows(task.test, curve_per_task)
    base_policy = load_base_policy(base, progress=False, steps=base_steps)
    eval_gen = dict(eval_generation or {})
    before, _ = geneval_accuracy(base_policy, task.test, per_task=per_task, **eval_gen)
    say("base model, held-out GenEval: " + "  ".join(f"{k} {v:.3f}" for k, v in before.items()))
    grid_rows = _grid_rows(task.test)
    grid_images = {"base": _images(base_policy, grid_rows, eval_gen)}
    by_arm: dict[str, list[dict]] = {}
    for arm in arms:
        for seed in range(seeds):
            run_dir = root / "runs" / f"{re.sub(r'[^a-z0-9]+', '_', arm.lower())}-seed{seed}"
            cfg = load_config(None, arm_config(arm, seed=seed, out=run_dir, smoke=smoke, steps=steps, **arm_kw))
            say(f"[{name}] {arm}, seed {seed + 1}/{seeds}: {cfg.max_steps} steps of "
                f"{cfg.prompts_per_rollout} prompts x {cfg.num_generations} images")
            policy = load_base_policy(base, progress=False, steps=base_steps)
            t0 = time.perf_counter()
            Trainer(cfg, policy=policy, dataset=task.train, eval_dataset=eval_rows, eval_metric="geneval").train()
            train_s = time.perf_counter() - t0
            after, _ = geneval_accuracy(policy, task.test, per_task=per_task, **eval_gen)
            by_arm.setdefault(arm, []).append({"seed": seed, "after": after, "train_seconds": train_s,
                                             "records": read_metrics(run_dir)})
            if seed == 0:
                grid_images[arm] = _images(policy, grid_rows, eval_gen)
            say(f"      held-out overall {after['overall']:.3f} (base {before['overall']:.3f}), {train_s:.0f} s")
    # ---- report
    header = ["GenEval task", "base"] + [f"{a} ({seeds} seed{'s' if seeds > 1 else ''})" for a in by_arm]
    rows = []
    for key in list(TASKS) + ["overall"]:
        row = [key, fmt(before[key])]
        for runs in by_arm.values():
            m, sd = mean_std([r["after"][key] for r in runs])
            row.append(fmt(m, sd) if seeds > 1 else fmt(m))
        rows.append(row)
    gains = {a: mean_std([r["after"]["overall"] - before["overall"] for r in runs]) for a, runs in by_arm.items()}
    rows.append(["gain, overall (points)", "-"] + [f"{100 * m:+.1f}" + (f" ± {100 * s:.1f}" if seeds > 1 else "")
                                                   for m, s in gains.values()])
    secs = {a: mean_std([r["train_seconds"] for r in runs])[0] for a, runs in by_arm.items()}
    rows.append(["seconds per run", "-"] + [f"{s:.0f}" for s in secs.values()])
    table = markdown_table(header, rows)
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in by_arm.items()}, root / "accuracy.png",
                title="held-out GenEval (shapes), mean over the six tasks", ylabel="accuracy", baseline=before["overall"])
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in by_arm.items()}, root / "reward.png",
                title="training reward (GenEval strict)", ylabel="reward")
    titles, images = [], []
    for label, ims in grid_images.items():
        images += ims
        titles += [f"{label}: {r['prompt'].removeprefix('a photo of ')}" for r in grid_rows]
    image_grid(images, titles, root / "grid.png", cols=len(grid_rows))
    credit = sorted((root / "runs" / "gcpo-seed0" / "credit").glob("*.png"))
    if credit:
        shutil.copy(credit[-1], root / "credit.png")
    total = time.perf_counter() - t_all
    results = {"name": name, "before": before, "seeds": seeds, "seconds": total, "smoke": smoke,
               "build_seconds": build_s, "model": str(base_dir), "per_task_images": per_task, "table": table,
               "eval_generation": eval_gen,
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in by_arm.items()},
               "configs": {a: arm_config(a, seed=0, out=Path("."), smoke=smoke, steps=steps, **arm_kw) for a in arms},
               "grid_prompts": [r["prompt"] for r in grid_rows]}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\n{seeds} seeds per arm, {per_task} held-out images per GenEval task, "
                                   f"{total:.0f} s in all.\n")
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results
