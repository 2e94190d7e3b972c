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
import re
import shutil
import time
from pathlib import Path
from typing import Any

SHAPES_RL: dict[str, Any] = {
    # the values of configs/tiny_grpo_shapes.yaml and configs/tiny_gcpo_shapes.yaml (a test checks both)
    "family": "janus",
    "task": "shapes",
    "model_name_or_path": "tiny-world:shapes",
    "reward_funcs": ["geneval_strict"],
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 2,
    "max_steps": 100,
    "cfg_scale": 1.0,
    "temperature": 1.0,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_ratio": 0.1,
    "beta": 0.04,
    "dynamic_sampling": False,
    "loss_type": "dapo",
    "epsilon_high": 0.28,
    "dual_clip": 3.0,
    "eval_steps": 20,
    "eval_limit": None,
    "save_steps": 100,
    "credit_steps": 50,
}
"""Settings shared by both arms: 16 prompts x 8 images per optimizer step, 100 steps (12,800 images per run)."""

ARMS: dict[str, dict[str, Any]] = {"GRPO": {"method": "grpo"}, "GCPO": {"method": "gcpo"}}
"""arm label -> its overrides of `SHAPES_RL`."""

SMOKE = {"max_steps": 2, "eval_steps": 1, "gradient_accumulation_steps": 1, "per_device_train_batch_size": 16,
         "save_steps": 2, "credit_steps": 1}
"""`--smoke`: two small steps per arm (CI plumbing check)."""

GRID_PROMPTS = 12
"""Held-out prompts shown in the before/after image grid (two per GenEval task)."""


def arm_config(arm: str, *, seed: int, out: Path, smoke: bool = False, steps: int | None = None) -> dict[str, Any]:
    cfg = {**SHAPES_RL, **ARMS[arm], "seed": seed, "output_dir": str(out), "progress_bar": False}
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


def _images(policy, rows: list[dict]) -> list:
    from mmrl.tiny_world.shapes_eval import EVAL_GENERATION

    return list(policy.sample([r["prompt"] for r in rows], 1, seeds=list(range(len(rows))), **EVAL_GENERATION).completions)


def run_gcpo_vs_grpo(out: str | Path = "runs/replicate", *, seeds: int = 3, smoke: bool = False, steps: int | None = None,
                     progress: bool = True, per_task: int | None = None) -> dict[str, Any]:
    """Run both arms over `seeds`; returns the results dict also written to `<out>/gcpo-vs-grpo/results.json`."""
    from mmrl.config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.geneval.rules import TASKS
    from mmrl.metrics_log import read_metrics
    from mmrl.tiny_world.models import ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, image_grid, markdown_table, mean_std, plot_curves
    from mmrl.tiny_world.shapes_eval import PER_TASK, balanced_rows, geneval_accuracy
    from mmrl.trainer import Trainer

    say = print if progress else (lambda *a, **k: None)
    per_task = per_task or (8 if smoke else PER_TASK)
    root = Path(out) / "gcpo-vs-grpo"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t_all = time.perf_counter()
    ensure_built("shapes", progress=progress)
    task = load_task("shapes")
    eval_rows = balanced_rows(task.test, per_task)
    base_policy = load_base_policy("shapes", progress=False)
    before, _ = geneval_accuracy(base_policy, task.test, per_task=per_task)
    say("base model, held-out GenEval: " + "  ".join(f"{k} {v:.3f}" for k, v in before.items()))
    grid_rows = _grid_rows(task.test)
    grid_images = {"base": _images(base_policy, grid_rows)}
    arms: dict[str, list[dict]] = {}
    for arm in ARMS:
        for seed in range(seeds):
            run_dir = root / "runs" / f"{re.sub(r'[^a-z0-9]+', '_', arm.lower())}-seed{seed}"
            cfg = load_config(None, arm_config(arm, seed=seed, out=run_dir, smoke=smoke, steps=steps))
            say(f"[gcpo-vs-grpo] {arm}, seed {seed + 1}/{seeds}: {cfg.max_steps} steps of "
                f"{cfg.prompts_per_rollout} prompts x {cfg.num_generations} images")
            policy = load_base_policy("shapes", progress=False)
            t0 = time.perf_counter()
            Trainer(cfg, policy=policy, dataset=task.train, eval_dataset=eval_rows, eval_metric="geneval").train()
            train_s = time.perf_counter() - t0
            after, _ = geneval_accuracy(policy, task.test, per_task=per_task)
            arms.setdefault(arm, []).append({"seed": seed, "after": after, "train_seconds": train_s,
                                             "records": read_metrics(run_dir)})
            if seed == 0:
                grid_images[arm] = _images(policy, grid_rows)
            say(f"      held-out overall {after['overall']:.3f} (base {before['overall']:.3f}), {train_s:.0f} s")
    # ---- report
    header = ["GenEval task", "base"] + [f"{a} ({seeds} seed{'s' if seeds > 1 else ''})" for a in arms]
    rows = []
    for key in list(TASKS) + ["overall"]:
        row = [key, fmt(before[key])]
        for runs in arms.values():
            row.append(fmt(*mean_std([r["after"][key] for r in runs])))
        rows.append(row)
    gains = {a: mean_std([r["after"]["overall"] - before["overall"] for r in runs]) for a, runs in arms.items()}
    rows.append(["gain, overall (points)", "-"] + [f"{100 * m:+.1f} ± {100 * s:.1f}" for m, s in gains.values()])
    secs = {a: mean_std([r["train_seconds"] for r in runs])[0] for a, runs in arms.items()}
    rows.append(["seconds per run", "-"] + [f"{s:.0f}" for s in secs.values()])
    table = markdown_table(header, rows)
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in arms.items()}, root / "accuracy.png",
                title="held-out GenEval (shapes), mean over the six tasks", ylabel="accuracy", baseline=before["overall"])
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in arms.items()}, root / "reward.png",
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
    results = {"name": "gcpo-vs-grpo", "before": before, "seeds": seeds, "seconds": total, "smoke": smoke,
               "per_task_images": per_task,
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in arms.items()},
               "configs": {a: arm_config(a, seed=0, out=Path("."), smoke=smoke, steps=steps) for a in ARMS}}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\n{seeds} seeds per arm, {per_task} held-out images per GenEval task, "
                                   f"{total:.0f} s in all.\n")
    print("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results
