"""`mmrl replicate overfit-pool`: does each method raise its reward on a fixed pool of training prompts?

A check that separates "the update is wrong" from "the task needs more budget" (the reasoning-RL issue's first
diagnostic): every method x family cell trains from its cached tiny base on the same 8 training prompts, over and
over, for 30 steps with one optimizer step per rollout batch. A correct update
raises the reward on prompts it has seen; a cell whose reward does not rise points at the update, not the budget.
The 4 x 4 method-by-family matrix (GRPO, GCPO, DGPO, DMPO on causal LM, masked diffusion, Janus, VLM) plus the other
methods on their own family (DAPO, Dr.GRPO, GSPO on the causal LM, diffu-GRPO on masked diffusion).
Writes `<out>/overfit-pool/results.json`, `table.md` and `reward.png`.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from mmrl.tiny_world.models import SMOKE_BASE_STEPS

logger = logging.getLogger(__name__)

FAMILIES: dict[str, dict[str, Any]] = {
    "causal_lm": {"task": "countdown3", "model_name_or_path": "tiny-world:countdown3-ar",
                  "reward_funcs": ["countdown3_accuracy"], "max_completion_length": 16},
    "masked_diffusion": {"task": "sudoku4", "model_name_or_path": "tiny-world:sudoku4", "reward_funcs": ["sudoku4"],
                         "max_completion_length": 16, "block_length": 16, "diffusion_steps": 16, "sampler": "low_confidence"},
    "janus": {"task": "shapes", "model_name_or_path": "tiny-world:shapes", "reward_funcs": ["geneval_strict"], "cfg_scale": 1.0},
    "vlm": {"task": "shapes_vqa", "model_name_or_path": "tiny-world:shapes-vqa", "reward_funcs": ["shapes_vqa"],
            "max_completion_length": 10, "negative_instruction": "Note: Intentionally generate an incorrect answer."},
}
"""family -> its task, base and generation settings."""

MATRIX = ("grpo", "gcpo", "dgpo", "dmpo")
EXTRA = {"causal_lm": ("dapo", "dr_grpo", "gspo"), "masked_diffusion": ("diffu_grpo",), "janus": ("stage",)}
"""The four methods run on every family; the others on their own family."""

POOL = 8
"""Training prompts in the pool (the first rows of the task's training split)."""

SHARED: dict[str, Any] = {
    "num_generations": 8,
    "per_device_train_batch_size": 64,  # the whole pool, 8 samples each, every step
    "gradient_accumulation_steps": 1,
    "num_iterations": 1,
    "max_steps": 30,
    "temperature": 1.0,
    "learning_rate": 5e-4,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "beta": 0.1,
    "dynamic_sampling": False,
    "dmpo_target": "behaviour",
    "dmpo_baseline": "group",
    "eval_steps": 0,
    "save_steps": 0,
    "credit_steps": 0,
    "progress_bar": False,
}
"""Settings every cell shares: the stable recipe of the reasoning comparisons (warm-up, cosine, KL 0.1, lr 5e-4;
at lr 1e-3 constant with no warm-up and no KL, 6 of the 20 cells lost reward in at least one seed, docs/RESULTS.md),
nothing evaluated held-out."""

SMOKE = {"max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 4}
"""`--smoke`: two steps of 2 prompts x 2 samples per cell (CI plumbing check)."""

def cells() -> list[tuple[str, str]]:
    """(family, method) pairs in table order."""
    return [(f, m) for f in FAMILIES for m in MATRIX + EXTRA.get(f, ())]


def cell_config(family: str, method: str, *, seed: int, out: Path, smoke: bool = False) -> dict[str, Any]:
    cfg = {**SHARED, **FAMILIES[family], "family": family, "method": method, "seed": seed, "output_dir": str(out)}
    return {**cfg, **(SMOKE if smoke else {})}


def run_overfit_pool(out: str | Path = "runs/replicate", *, seeds: int = 3, smoke: bool = False, steps: int | None = None,
                     progress: bool = True, only: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """Train every cell over `seeds`; the reward at the start (mean of the first 3 steps) and end (last 3)."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import load_base_policy
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.training.trainer import Trainer

    say = print if progress else (lambda *a, **k: None)
    root = Path(out) / "overfit-pool"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    register()
    t_all = time.perf_counter()
    results: dict[str, list[dict]] = {}
    for family, method in only or cells():
        spec = FAMILIES[family]
        task = load_task(spec["task"])
        pool = task.train[:POOL]
        for seed in range(seeds):
            run_dir = root / "runs" / f"{family}-{method}-seed{seed}"
            over = cell_config(family, method, seed=seed, out=run_dir, smoke=smoke)
            if steps:
                over["max_steps"] = steps
            cfg = load_config(None, over)
            policy = load_base_policy(spec["model_name_or_path"].split(":", 1)[1], progress=False,
                                      steps=SMOKE_BASE_STEPS if smoke else None)
            t0 = time.perf_counter()
            Trainer(cfg, policy=policy, dataset=pool, reward_funcs=cfg.reward_funcs).train()
            rewards = [y for _, y in curve(read_metrics(run_dir), "reward")]
            n = min(3, max(1, len(rewards) // 2))
            start, end = mean_std(rewards[:n])[0], mean_std(rewards[-n:])[0]
            results.setdefault(f"{family} / {method}", []).append(
                {"seed": seed, "start": start, "end": end, "rewards": rewards, "seconds": time.perf_counter() - t0})
            say(f"[overfit-pool] {family:16s} {method:10s} seed {seed}: reward {start:.3f} -> {end:.3f}")
    rows = []
    for cell, runs in results.items():
        gain = mean_std([r["end"] - r["start"] for r in runs])
        rose = sum(r["end"] > r["start"] for r in runs)
        rows.append([cell, fmt(*mean_std([r["start"] for r in runs])), fmt(*mean_std([r["end"] for r in runs])),
                     f"{100 * gain[0]:+.1f} ± {100 * gain[1]:.1f}", f"{rose} / {len(runs)}",
                     f"{mean_std([r['seconds'] for r in runs])[0]:.0f}"])
    table = markdown_table(["family / method", "reward, first 3 steps (%)", "reward, last 3 steps (%)", "rise (points)",
                            "seeds that rose", "s per run"], rows)
    plot_curves({c: [list(enumerate(r["rewards"], 1)) for r in runs] for c, runs in results.items()}, root / "reward.png",
                title=f"overfit-pool: training reward on {POOL} fixed prompts", ylabel="reward")
    total = time.perf_counter() - t_all
    (root / "results.json").write_text(json.dumps({"seeds": seeds, "seconds": total, "smoke": smoke, "pool": POOL,
                                                   "shared": SHARED, "families": FAMILIES, "cells": results, "table": table},
                                                  indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\n{seeds} seeds per cell, {total:.0f} s in all.\n")
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return {"cells": results, "table": table, "seconds": total}
