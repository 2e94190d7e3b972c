"""`mmrl replicate NAME`: a paper's comparison at toy scale, every arm with the same rollout budget, over seeds.

    mmrl replicate dmpo-vs-d1         # DMPO with buffer reuse F = 1 / 8 / 24 vs diffu-GRPO vs the base model, sudoku4
    mmrl replicate dmpo-small-batch   # WDCE with no / group / individual / model baseline vs WDDO at a small batch

Each arm starts from the same cached tiny base model, trains with the quickstart's settings under the reasoning
comparisons' stable recipe (`STABLE`), sees the same number of rollouts (prompts x generations x rollout batches)
and is scored by greedy d1-style decoding on held-out puzzles (`mmrl.training.evaluate`). Writes
`<out>/<name>/results.json`, `table.md` (mean ± std over seeds) and `accuracy.png` / `reward.png`.

    mmrl replicate gcpo-vs-grpo       # GCPO vs GRPO on the shapes world (tiny Janus, GenEval), mmrl/tiny_world/shapes_rl.py
    mmrl replicate gcpo-vs-grpo-lr    # its learning rate chosen on the validation prompts only (test never scored)
    mmrl replicate gcpo-vs-grpo-vqa   # GCPO vs GRPO on shapes questions (tiny Qwen2.5-VL), mmrl/tiny_world/vqa_rl.py
    mmrl replicate dmpo-vs-grpo-masked  # DMPO vs GRPO on the tiny aMUSEd (masked image tokens), mmrl/tiny_world/masked_image_rl.py

Reasoning RL on Countdown with the tiny causal LM (mmrl/tiny_world/reasoning_rl.py: sampled and greedy held-out
accuracy, pass@k, KL to the base), and the overfit check (mmrl/tiny_world/overfit_pool.py):

    mmrl replicate dgpo-vs-grpo            # GRPO vs DAPO vs DGPO
    mmrl replicate dmpo-vs-d1-countdown3   # DMPO vs diffu-GRPO, same rollouts
    mmrl replicate dmpo-kl-countdown3      # {DMPO, diffu-GRPO} x {no KL, KL 0.1} on one optimizer setting
    mmrl replicate dmpo-reuse-countdown3   # DMPO with buffer reuse F = 1 / 8 / 24 vs diffu-GRPO, same rollouts
    mmrl replicate overfit-pool            # every method x family on 8 fixed training prompts

The masked-diffusion Countdown base is not competent enough to compare on (docs/RESULTS.md), so the Countdown
comparisons use the causal LM, where DMPO's likelihoods are exact.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any

from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE

logger = logging.getLogger(__name__)

STABLE: dict[str, Any] = {"learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "beta": 0.1,
                          "dmpo_target": "behaviour"}
"""The stable recipe of the reasoning comparisons (mmrl/tiny_world/reasoning_rl.py, docs/RESULTS.md "What makes the
reasoning updates stable here") over the quickstart's settings: warm-up, cosine decay, KL 0.1 at lr 5e-4 (the
quickstart's lr 1e-4 moves nothing in 20 rollouts; 1e-3 without warm-up collapses)."""

COMPARISONS: dict[str, dict[str, dict[str, Any]]] = {
    # DMPO's buffer reuse (F optimizer steps per rollout batch; the paper's F = 24) vs diffu-GRPO, same rollouts
    "dmpo-vs-d1": {
        "diffu-grpo (d1), F=1": {"method": "diffu_grpo"},
        "dmpo, F=1": {"method": "dmpo", "dmpo_baseline": "group"},
        "dmpo, F=8": {"method": "dmpo", "dmpo_baseline": "group", "num_iterations": 8},
        "dmpo, F=24": {"method": "dmpo", "dmpo_baseline": "group", "num_iterations": 24},
    },
    "dmpo-small-batch": {
        "wdce, no baseline": {"method": "dmpo", "dmpo_baseline": "none"},
        "wdce, group baseline": {"method": "dmpo", "dmpo_baseline": "group"},
        "wdce, individual baseline": {"method": "dmpo", "dmpo_baseline": "individual"},
        "wdce, model baseline": {"method": "dmpo", "dmpo_baseline": "model", "dmpo_target": "reference"},
        "wddo": {"method": "dmpo", "dmpo_loss": "wddo", "dmpo_target": "reference"},
    },
}
"""comparison -> arm label -> overrides of the shared recipe (`QUICKSTART_RECIPE` + `STABLE`)."""

SIZES: dict[str, dict[str, Any]] = {
    # 8 puzzles x 16 answers per rollout batch, 10 batches: an F = 24 run is 240 optimizer steps, ~6 min on one core
    "dmpo-vs-d1": {"rollouts": 10, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1},
    # the paper's failure mode of plain WDCE needs a small batch: 4 prompts x 8 responses per rollout
    "dmpo-small-batch": {"rollouts": 30, "num_generations": 8, "per_device_train_batch_size": 32, "gradient_accumulation_steps": 1},
}
"""comparison -> rollout budget and batch shape shared by its arms."""


def arm_config(name: str, arm: str, *, seed: int, rollouts: int, out: Path, smoke: bool = False) -> dict[str, Any]:
    """The full override dict of one arm: the quickstart recipe with `STABLE`, the comparison's batch, the arm's settings; the
    number of optimizer steps is rollouts x num_iterations, so every arm samples the same number of rollouts."""
    size = dict(SIZES[name])
    size.pop("rollouts")
    over = dict(COMPARISONS[name][arm])
    f = int(over.get("num_iterations", 1))
    cfg = {**QUICKSTART_RECIPE, **STABLE, **size, **over, "seed": seed, "max_steps": rollouts * f, "eval_steps": max(1, rollouts * f // 3),
           "save_steps": 0, "credit_steps": 0, "output_dir": str(out), "progress_bar": False}
    if smoke:
        cfg.update(eval_limit=16, gradient_accumulation_steps=1)
    return cfg


def run_comparison(name: str, out: str | Path = "runs/replicate", *, seeds: int = 5, rollouts: int | None = None,
                   smoke: bool = False, progress: bool = True) -> dict[str, Any]:
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.models import load_base_policy
    from mmrl.tiny_world.quickstart import evaluate_items
    from mmrl.tiny_world.stats import difference_interval
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.training.trainer import Trainer

    if name not in COMPARISONS:
        raise ValueError(f"unknown comparison {name!r}; implemented: {sorted(COMPARISONS)}")
    rollouts = rollouts or (2 if smoke else SIZES[name]["rollouts"])
    root = Path(out) / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    register()  # the tiny world's tasks and rewards
    task = load_task("sudoku4")
    test = task.test[: 16 if smoke else QUICKSTART_RECIPE["eval_limit"]]  # once per run, at the end
    val = task.validation[: len(test)]  # the curves
    base, base_items = evaluate_items(load_base_policy("sudoku4", progress=progress), test, task.metric)
    t_all = time.perf_counter()
    arms: dict[str, list[dict]] = {}
    for arm in COMPARISONS[name]:
        for seed in range(seeds):
            run_dir = root / "runs" / f"{re.sub(r'[^a-z0-9]+', '_', arm.lower()).strip('_')}-seed{seed}"
            cfg = load_config(None, arm_config(name, arm, seed=seed, rollouts=rollouts, out=run_dir, smoke=smoke))
            if progress:
                logger.info(f"[{name}] {arm}, seed {seed + 1}/{seeds}: {cfg.max_steps} optimizer steps, {rollouts} rollout batches")
            policy = load_base_policy("sudoku4", progress=False)
            t0 = time.perf_counter()
            Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=task.reward_funcs, eval_dataset=val,
                    eval_metric=task.metric).train()
            acc, items = evaluate_items(policy, test, task.metric)  # the test rows, once per run
            records = read_metrics(run_dir)
            arms.setdefault(arm, []).append({"seed": seed, "accuracy": acc, "items": items, "seconds": time.perf_counter() - t0,
                                             "records": records})
            if progress:
                logger.info(f"      held-out cell accuracy {100 * acc:.1f}% (base {100 * base:.1f}%)")
    rows = [["base model", fmt(base), "-", "-", "-"]]
    gains = {}
    for arm, runs in arms.items():
        m, s = mean_std([r["accuracy"] for r in runs])
        g = mean_std([r["accuracy"] - base for r in runs])
        rew = mean_std([mean_std([y for _, y in curve(r["records"], "reward")][-5:])[0] for r in runs])
        gains[arm] = difference_interval([r["items"] for r in runs], [base_items])
        rows.append([arm, fmt(m, s), f"{100 * g[0]:+.1f} ± {100 * g[1]:.1f}", gains[arm].fmt(signed=True), fmt(*rew)])
    table = markdown_table(["arm", "test cell accuracy (%)", "gain (points, mean ± std)",
                            "gain, per-puzzle mean [95% CI]", "train reward, last 5 steps (%)"], rows)
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in arms.items()}, root / "accuracy.png",
                title=f"{name}: validation Sudoku cell accuracy", ylabel="cell accuracy")
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in arms.items()}, root / "reward.png",
                title=f"{name}: training reward", ylabel="reward")
    total = time.perf_counter() - t_all
    results = {"name": name, "base": base, "base_items": base_items, "test_puzzles": [r["puzzle"] for r in test],
               "gains": {a: iv.to_dict() for a, iv in gains.items()},
               "seeds": seeds, "rollouts": rollouts, "seconds": total, "smoke": smoke,
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in arms.items()},
               "configs": {a: arm_config(name, a, seed=0, rollouts=rollouts, out=Path("."), smoke=smoke) for a in arms}}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\n{seeds} seeds, {rollouts} rollout batches per arm, {total:.0f} s in all.\n")
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results


RUNNERS: dict[str, str] = {"gcpo-vs-grpo": "mmrl.tiny_world.shapes_rl:run_gcpo_vs_grpo",
                           "gcpo-vs-grpo-lr": "mmrl.tiny_world.shapes_rl:choose_lr",
                           "gcpo-vs-grpo-vqa": "mmrl.tiny_world.vqa_rl:run_gcpo_vs_grpo_vqa",
                           "overfit-pool": "mmrl.tiny_world.overfit_pool:run_overfit_pool",
                           "dmpo-vs-grpo-masked": "mmrl.tiny_world.masked_image_rl:run_dmpo_vs_grpo_masked"}
"""Comparisons with their own runner (other families and tasks): name -> "module:function"."""


def configure(parser: argparse.ArgumentParser) -> None:
    from mmrl.tiny_world.reasoning_rl import COMPARISONS as REASONING

    parser.add_argument("name", choices=sorted(COMPARISONS) + sorted(RUNNERS) + sorted(REASONING), help="the comparison to run")
    parser.add_argument("--out", default="runs/replicate", help="results go to OUT/NAME (replaced if it exists)")
    parser.add_argument("--seeds", type=int, default=5, help="training seeds per arm (the intervals resample them)")
    parser.add_argument("--n-samples", type=int, default=None, help="gcpo-vs-grpo: test images per prompt (default 4)")
    parser.add_argument("--no-baselines", action="store_true", help="gcpo-vs-grpo and the Countdown comparisons: "
                        "skip the clean-data base, best-of-n and rejection-sampling rows")
    parser.add_argument("--rollouts", type=int, default=None, help="rollout batches per arm (default: the comparison's)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (the shapes comparisons; default: the recipe's)")
    parser.add_argument("--base", default=None, help="the Countdown comparisons: another tiny causal Countdown base "
                        "(default: the recipe's; e.g. countdown3-ar, the base trained on right answers only); "
                        "gcpo-vs-grpo: shapes (default, noisy captions) or shapes-clean")
    parser.add_argument("--lr", type=float, default=None, help="gcpo-vs-grpo: the learning rate (default: the recipe's "
                        "5e-4; pass the one `gcpo-vs-grpo-lr` chose on validation)")
    parser.add_argument("--smoke", action="store_true", help="2 rollouts per arm, 16 test puzzles (plumbing check)")


def run(args: argparse.Namespace) -> int:
    from mmrl.tiny_world.reasoning_rl import COMPARISONS as REASONING, run_reasoning_comparison

    if args.base is not None and args.name not in REASONING and args.name not in ("gcpo-vs-grpo", "gcpo-vs-grpo-lr"):
        raise SystemExit(f"--base applies to gcpo-vs-grpo and the Countdown comparisons {sorted(REASONING)}, not {args.name!r}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    if args.lr is not None and args.name != "gcpo-vs-grpo":
        raise SystemExit(f"--lr applies to gcpo-vs-grpo only, not {args.name!r}")
    if args.lr is not None and not args.lr > 0:
        raise SystemExit(f"--lr must be > 0, got {args.lr}")
    if args.name in ("gcpo-vs-grpo", "gcpo-vs-grpo-lr"):
        from mmrl.tiny_world.shapes_rl import choose_lr, run_gcpo_vs_grpo

        if args.base not in (None, "shapes", "shapes-clean"):
            raise SystemExit(f"{args.name} --base must be shapes or shapes-clean, got {args.base!r}")
        if args.name == "gcpo-vs-grpo-lr":
            choose_lr(args.out, seeds=args.seeds, smoke=args.smoke, steps=args.steps, n_samples=args.n_samples,
                      base=args.base or "shapes")
            return 0
        run_gcpo_vs_grpo(args.out, seeds=args.seeds, smoke=args.smoke, steps=args.steps, n_samples=args.n_samples,
                         base=args.base or "shapes", baselines=not args.no_baselines, lr=args.lr)
        return 0
    if args.name in REASONING:
        run_reasoning_comparison(args.name, args.out, seeds=args.seeds, smoke=args.smoke, rollouts=args.rollouts,
                                 base=args.base, baselines=not args.no_baselines)
        return 0
    if args.name in RUNNERS:
        import importlib

        module, func = RUNNERS[args.name].split(":")
        getattr(importlib.import_module(module), func)(args.out, seeds=args.seeds, smoke=args.smoke, steps=args.steps)
        return 0
    run_comparison(args.name, args.out, seeds=args.seeds, rollouts=args.rollouts, smoke=args.smoke)
    return 0
