"""`mmrl quickstart`: mmrl's main job end to end on a laptop CPU, in minutes, without downloads.

Default (`--world shapes`), text-to-image RL, where mmrl's gain is clearest at this scale:

    tiny Janus base on the shapes world (built once, about 3 minutes, cached)  ->  GCPO with the GenEval reward
    ->  held-out GenEval per task before / after  ->  a report folder: table, accuracy and reward curves, the same
    held-out prompts' images before and after, GCPO's token credit over the images

`--world sudoku`: the masked-diffusion job (DMPO on sudoku4; d1's Sudoku cell accuracy on held-out puzzles whose
solution grids never appear in training). At this scale DMPO does not yet beat the base there (docs/RESULTS.md).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

QUICKSTART_RECIPE: dict[str, Any] = {
    # DMPO on the tiny Sudoku model; the same values as configs/tiny_dmpo_sudoku4.yaml (a test checks it)
    "method": "dmpo",
    "family": "masked_diffusion",
    "task": "sudoku4",
    "model_name_or_path": "tiny-world:sudoku4",
    "num_generations": 16,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 4,
    "num_iterations": 1,
    "max_steps": 60,
    "max_completion_length": 16,
    "block_length": 16,
    "diffusion_steps": 16,
    "sampler": "low_confidence",
    "temperature": 1.0,
    "learning_rate": 1e-4,
    "dmpo_baseline": "group",
    "dmpo_target": "behaviour",
    "dmpo_alpha": 0.04,
    "eval_steps": 20,
    "eval_limit": 256,
    "save_steps": 60,
    "credit_steps": 20,
}
"""The quickstart's RL settings (see docs/RESULTS.md for how they were chosen)."""

SMOKE = {"max_steps": 2, "eval_steps": 1, "eval_limit": 32, "gradient_accumulation_steps": 1, "credit_steps": 1, "save_steps": 2}
"""`--smoke` overrides: a few steps to check the pipeline end to end (CI)."""


def evaluate_base(policy, rows, metric: str) -> float:
    return evaluate_items(policy, rows, metric)[0]


def evaluate_items(policy, rows, metric: str) -> tuple[float, list[float]]:
    """(accuracy, per-row scores) under greedy low-confidence decoding with steps = length (Sudoku: the accuracy
    weighs puzzles by their blank cells, the per-row score is the puzzle's fraction of blanks filled correctly)."""
    from mmrl.training.evaluate import dmpo_generation, evaluate

    gen = dmpo_generation("masked_diffusion", 16, 16)  # steps = length
    res = evaluate(policy, rows, metric, batch_size=128, progress=False, **gen)
    return res.accuracy, [float(x) for x in res.scores]


def run_quickstart(out: str | Path = "runs/quickstart", *, seeds: int = 1, smoke: bool = False, steps: int | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """Run the quickstart; returns the results dict also written to `<out>/results.json`."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.training.trainer import Trainer

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t_start = time.perf_counter()
    say = print if progress else (lambda *a, **k: None)
    say("[1/4] tiny base model (masked diffusion, sudoku4): built once, then cached")
    t0 = time.perf_counter()
    base_steps = SMOKE_BASE_STEPS if smoke else None  # --smoke checks the pipeline: a separately cached smoke base
    path = ensure_built("sudoku4", progress=progress, steps=base_steps)
    build_s = time.perf_counter() - t0
    register()  # the tiny world's tasks and rewards
    task = load_task("sudoku4")
    d1_task = load_task("sudoku4_d1")
    recipe = dict(QUICKSTART_RECIPE)
    if smoke:
        recipe.update(SMOKE)
    if steps is not None:
        recipe["max_steps"] = steps
    test = task.test[: recipe["eval_limit"]]
    d1_test = d1_task.test[: recipe["eval_limit"]]
    say("[2/4] base model accuracy on held-out puzzles")
    base = load_base_policy("sudoku4", progress=progress, steps=base_steps)
    before = evaluate_base(base, test, task.metric)
    before_d1 = evaluate_base(base, d1_test, task.metric)
    say(f"      sudoku4 test {100 * before:.1f}%   d1 test {100 * before_d1:.1f}%")
    runs = []
    for seed in range(seeds):
        say(f"[3/4] DMPO, seed {seed + 1}/{seeds}")
        run_dir = out / f"dmpo-seed{seed}"
        cfg = load_config(None, {**recipe, "seed": seed, "output_dir": str(run_dir), "progress_bar": progress})
        policy = load_base_policy("sudoku4", progress=False, steps=base_steps)
        t0 = time.perf_counter()
        Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=task.reward_funcs,
                eval_dataset=task.validation[: recipe["eval_limit"]], eval_metric=task.metric).train()  # curves: validation
        train_s = time.perf_counter() - t0
        after = evaluate_base(policy, test, task.metric)
        after_d1 = evaluate_base(policy, d1_test, task.metric)
        records = read_metrics(run_dir)
        runs.append({"seed": seed, "after": after, "after_d1": after_d1, "train_seconds": train_s, "records": records})
        say(f"      after: sudoku4 test {100 * after:.1f}%   d1 test {100 * after_d1:.1f}%   ({train_s:.0f} s)")
    say("[4/4] report")
    m, s = mean_std([r["after"] for r in runs])
    m1, s1 = mean_std([r["after_d1"] for r in runs])
    gains = [r["after"] - before for r in runs]
    gm, gs = mean_std(gains)
    rows = [
        ["sudoku4 held-out grids (cell acc., %)", fmt(before), fmt(m, s), f"{100 * gm:+.1f} ± {100 * gs:.1f}"],
        ["d1 4x4 test set (cell acc., %)", fmt(before_d1), fmt(m1, s1), f"{100 * (m1 - before_d1):+.1f}"],
    ]
    table = markdown_table(["evaluation", "base model", f"after DMPO ({seeds} seed{'s' if seeds > 1 else ''})", "gain"], rows)
    plot_curves({"DMPO": [curve(r["records"], "eval/accuracy") for r in runs]}, out / "accuracy.png",
                title="validation Sudoku cell accuracy during DMPO", ylabel="cell accuracy")
    plot_curves({"DMPO": [curve(r["records"], "reward", smooth=5) for r in runs]}, out / "reward.png",
                title="training reward (d1 Sudoku reward, sampled)", ylabel="reward")
    credit = sorted((out / "dmpo-seed0" / "credit").glob("*.html")) if (out / "dmpo-seed0" / "credit").is_dir() else []
    if credit:
        shutil.copy(credit[-1], out / "token_credit.html")
    samples = _samples(base, load_base_policy("sudoku4", progress=False, steps=base_steps), runs, out, test[:8])
    total = time.perf_counter() - t_start
    results = {"before": before, "before_d1": before_d1, "after": [r["after"] for r in runs], "after_d1": [r["after_d1"] for r in runs],
               "gain_mean": gm, "gain_std": gs, "seeds": seeds, "recipe": recipe, "seconds": total, "build_seconds": build_s,
               "model": str(path), "smoke": smoke}
    (out / "results.json").write_text(json.dumps(results, indent=2))
    md = [f"# mmrl quickstart: DMPO on tiny Sudoku\n", table, "",
          f"Total time {total:.0f} s (model build {build_s:.0f} s, cached afterwards).", "",
          "![accuracy](accuracy.png)", "![reward](reward.png)", "",
          "Token credit of the last logged step: [token_credit.html](token_credit.html)." if credit else "",
          "", "## Sample answers (first test puzzles)", samples]
    (out / "README.md").write_text("\n".join(md) + "\n")
    logger.info("\n" + table + f"\n\nreport: {out}/README.md  ({total:.0f} s)")
    return results


def _samples(base, fresh, runs, out: Path, rows) -> str:
    """Greedy answers of the base model and of the trained model of seed 0 on a few test puzzles."""
    from mmrl.checkpointing.checkpoint import latest_checkpoint, load_model_weights
    from mmrl.training.evaluate import dmpo_generation

    ck = latest_checkpoint(out / "dmpo-seed0")
    if ck is None:
        return ""
    load_model_weights(fresh.unwrapped, ck / "model")
    gen = dmpo_generation("masked_diffusion", 16, 16)  # steps = length
    a = base.sample([r["prompt"] for r in rows], 1, seeds=list(range(len(rows))), **gen).completions
    b = fresh.sample([r["prompt"] for r in rows], 1, seeds=list(range(len(rows))), **gen).completions
    lines = ["| puzzle | solution | base | after DMPO |", "|---|---|---|---|"]
    for r, x, y in zip(rows, a, b):
        lines.append(f"| `{r['puzzle']}` | `{r['solution']}` | `{x}` | `{y}` |")
    return "\n".join(lines)


def run_shapes_quickstart(out: str | Path = "runs/quickstart", *, seeds: int = 1, smoke: bool = False,
                          steps: int | None = None, progress: bool = True) -> dict[str, Any]:
    """GCPO on the shapes world from the cached tiny Janus base; writes `<out>/README.md` with the before/after
    table and the pictures (`mmrl.tiny_world.shapes_rl.run_shapes_rl`)."""
    from mmrl.tiny_world.shapes_rl import run_shapes_rl

    out = Path(out)
    res = run_shapes_rl(out, ["GCPO"], seeds=seeds, smoke=smoke, steps=steps, progress=progress, name="quickstart")
    md = ["# mmrl quickstart: GCPO on the tiny shapes world (text-to-image)\n",
          "Test GenEval accuracy on held-out compositions (colour-shape pairings, count-shape pairs and shape pairs that "
          "no training prompt names, under any wording; images sampled at temperature 1, "
          f"{res['n_samples']} per prompt, scored by the GenEval rules through the exact shapes detector), the base model "
          "against the model after GCPO, with paired-bootstrap 95% intervals over the test prompts "
          "(and seeds, with more than one):\n",
          res["table"], "",
          f"Total time {res['seconds']:.0f} s (base model build {res['build_seconds']:.0f} s, cached afterwards). "
          "The training curves are on the validation prompts; the test prompts are scored once, at the end.", "",
          "![validation accuracy](accuracy.png)", "![training reward](reward.png)", "",
          "The same test prompts and random seeds, base model (top row) and after GCPO (bottom row):", "",
          "![images before and after](grid.png)", ""]
    if (out / "credit.png").is_file():
        md += ["GCPO's token credit (advantage x token weight) laid over each image's 4 x 4 slot grid:", "",
               "![token credit](credit.png)", ""]
    (out / "README.md").write_text("\n".join(md) + "\n")
    logger.info(f"report: {out}/README.md")
    return res


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world", choices=("shapes", "sudoku"), default="shapes",
                        help="shapes: GCPO text-to-image on the tiny Janus (default); sudoku: DMPO on the masked-diffusion model")
    parser.add_argument("--out", default="runs/quickstart", help="report folder (replaced if it exists)")
    parser.add_argument("--seeds", type=int, default=1, help="RL runs with different seeds (the gain is reported as mean ± std; "
                        "docs/RESULTS.md uses 3)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the recipe's)")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a 20-step smoke base (cached apart), to check the pipeline (CI)")


def run(args: argparse.Namespace) -> int:
    seeds = 1 if args.smoke else args.seeds
    if args.world == "shapes":
        run_shapes_quickstart(args.out, seeds=seeds, smoke=args.smoke, steps=args.steps)
    else:
        run_quickstart(args.out, seeds=seeds, smoke=args.smoke, steps=args.steps)
    return 0
