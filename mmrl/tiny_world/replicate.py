"""`mmrl replicate NAME`: a paper's comparison at toy scale, every arm with the same rollout budget, over seeds.

    mmrl replicate dmpo-vs-d1         # DMPO vs diffu-GRPO (F = 1) beside clean SFT, RFT and best-of-n, sudoku4
    mmrl replicate dmpo-reuse-sudoku4 # DMPO with buffer reuse F = 1 / 8 / 24 vs diffu-GRPO, same rollouts
    mmrl replicate sudoku-rewards     # diffu-GRPO and DMPO with the solved 1/0, verifier and d1 cell rewards
    mmrl replicate dmpo-small-batch   # WDCE with no / group / individual / model baseline vs WDDO at a small batch
    mmrl replicate sudoku-authors     # diffu-GRPO and DMPO each with its authors' settings beside dmpo-vs-d1's arms
    mmrl replicate sudoku-batch16     # dmpo-vs-d1's arms at 16x the batch (128 puzzles x 16 answers per step)

Each arm starts from the same cached tiny base model, trains with the quickstart's settings under the reasoning
comparisons' stable recipe (`STABLE`), sees the same number of rollouts (prompts x generations x rollout batches)
and is scored once, at the end, by greedy decoding (steps = length) on the test puzzles (`mmrl.training.evaluate`;
the training curves use the validation puzzles). Writes `<out>/<name>/results.json` (every run's per-puzzle test
scores), `table.md` (paired-bootstrap 95% intervals over puzzles and seeds) and `accuracy.png` / `reward.png`.

    mmrl replicate gcpo-vs-grpo       # GCPO vs GRPO on the shapes world (tiny Janus, GenEval), mmrl/tiny_world/shapes_rl.py
    mmrl replicate gcpo-vs-grpo-lr    # its learning rate chosen on the validation prompts only (test never scored)
    mmrl replicate gcpo-vs-grpo-vqa   # GCPO vs GRPO on shapes questions (tiny Qwen2.5-VL), mmrl/tiny_world/vqa_rl.py
    mmrl replicate dmpo-vs-grpo-masked  # DMPO vs GRPO on the tiny aMUSEd (masked image tokens), mmrl/tiny_world/masked_image_rl.py

Reasoning RL on Countdown with the tiny causal LM (mmrl/tiny_world/reasoning_rl.py: sampled and greedy held-out
accuracy, pass@k, KL to the base), and the overfit check (mmrl/tiny_world/overfit_pool.py):

    mmrl replicate dgpo-vs-grpo            # GRPO vs DAPO's loss vs DGPO
    mmrl replicate dmpo-vs-d1-countdown3   # DMPO vs diffu-GRPO, same rollouts
    mmrl replicate dmpo-kl-countdown3      # {DMPO, diffu-GRPO} x {no KL, KL 0.1} on one optimizer setting
    mmrl replicate dmpo-authors-countdown3 # the same two methods, each with its authors' settings
    mmrl replicate dmpo-reuse-countdown3   # DMPO with buffer reuse F = 1 / 8 / 24 vs diffu-GRPO, same rollouts
    mmrl replicate overfit-pool            # every method x family on 8 fixed training prompts

The masked-diffusion Countdown base is not competent enough to compare on (docs/RESULTS.md), so the Countdown
comparisons use the causal LM, where DMPO's likelihoods are exact.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from mmrl.checkpointing.run_lock import remove_unfinished_run
from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE
from mmrl.tiny_world.report import cutoff_time

logger = logging.getLogger(__name__)

STABLE: dict[str, Any] = {"learning_rate": 5e-4, "lr_scheduler_type": "cosine", "warmup_ratio": 0.1, "beta": 0.1,
                          "dmpo_target": "behaviour"}
"""The stable recipe of the reasoning comparisons (mmrl/tiny_world/reasoning_rl.py, docs/RESULTS.md "What makes the
reasoning updates stable here") over the quickstart's settings: warm-up, cosine decay, KL 0.1 at lr 5e-4 (the
quickstart's lr 1e-4 moves nothing in 20 rollouts; 1e-3 without warm-up collapses)."""

DMPO_SOLVED_ONLY = "dmpo, solved 1/0, weight on solved grids only"
"""`sudoku-rewards`' arm of DMPO with `dmpo_baseline: correct_only` on the fully-solved 1 / 0 reward."""

COMPARISONS: dict[str, dict[str, dict[str, Any]]] = {
    # DMPO vs diffu-GRPO at the same rollouts, one optimizer step per rollout batch, under the protocol (issue 23),
    # with the clean-SFT, RFT and best-of-n rows beside them (`run_comparison`)
    "dmpo-vs-d1": {
        "diffu-grpo (d1), F=1": {"method": "diffu_grpo"},
        "dmpo, F=1": {"method": "dmpo", "dmpo_baseline": "group"},
    },
    # dmpo-vs-d1's arms at 16x its batch (`SIZES`): the same rollouts per optimizer step as 16 of its steps
    "sudoku-batch16": {
        "diffu-grpo (d1), F=1": {"method": "diffu_grpo"},
        "dmpo, F=1": {"method": "dmpo", "dmpo_baseline": "group"},
    },
    # DMPO's buffer reuse (F optimizer steps per rollout batch; the paper's F = 24) vs diffu-GRPO, same rollouts: the
    # arms of the old-protocol `dmpo-vs-d1` (docs/RESULTS.md "DMPO buffer reuse on Sudoku")
    "dmpo-reuse-sudoku4": {
        "diffu-grpo (d1), F=1": {"method": "diffu_grpo"},
        "dmpo, F=1": {"method": "dmpo", "dmpo_baseline": "group"},
        "dmpo, F=8": {"method": "dmpo", "dmpo_baseline": "group", "num_iterations": 8},
        "dmpo, F=24": {"method": "dmpo", "dmpo_baseline": "group", "num_iterations": 24},
    },
    # issue 24 item 5: the arms differ only in the reward (`reward_funcs`), on the STABLE recipe, the same rollouts
    # and one optimizer setting; the validation curves and the test rows score cell accuracy (the task's metric) for
    # every arm. Listed in priority order (`--arm` picks a subset; a cutoff now leaves whole seeds out, `run_comparison`).
    "sudoku-rewards": {
        "diffu-grpo, solved 1/0": {"method": "diffu_grpo", "reward_funcs": ["sudoku4_solved"]},
        "dmpo, solved 1/0": {"method": "dmpo", "dmpo_baseline": "group", "reward_funcs": ["sudoku4_solved"]},
        "diffu-grpo, verifier": {"method": "diffu_grpo", "reward_funcs": ["sudoku4_valid"]},
        "dmpo, verifier": {"method": "dmpo", "dmpo_baseline": "group", "reward_funcs": ["sudoku4_valid"]},
        "diffu-grpo, cells (d1)": {"method": "diffu_grpo", "reward_funcs": ["sudoku4"]},
        "dmpo, cells (d1)": {"method": "dmpo", "dmpo_baseline": "group", "reward_funcs": ["sudoku4"]},
        # the DMPO variant that gained on masked-diffusion Countdown and masked image tokens (`dmpo_baseline:
        # correct_only`, weights >= 0, none on wrong answers) with the 1 / 0 reward: weight on solved grids only
        DMPO_SOLVED_ONLY: {"method": "dmpo", "dmpo_baseline": "correct_only", "reward_funcs": ["sudoku4_solved"]},
    },
    # issue 24 item 3(b): DMPO's weight baselines at a small batch (the paper's Fig. 4 failure mode of plain WDCE),
    # and item 5's control, WDCE on the correctly filled cells only (`dmpo_token_mask`), each beside the same arm
    # without it; in priority order (`--arm` picks a subset)
    "dmpo-small-batch": {
        "wdce, no baseline": {"method": "dmpo", "dmpo_baseline": "none"},
        "wdce, no baseline, correct cells only": {"method": "dmpo", "dmpo_baseline": "none", "dmpo_token_mask": "correct_cells"},
        "wdce, group baseline": {"method": "dmpo", "dmpo_baseline": "group"},
        "wdce, individual baseline": {"method": "dmpo", "dmpo_baseline": "individual"},
        "wdce, model baseline": {"method": "dmpo", "dmpo_baseline": "model", "dmpo_target": "reference"},
        "wdce, group baseline, correct cells only": {"method": "dmpo", "dmpo_baseline": "group", "dmpo_token_mask": "correct_cells"},
        "wddo": {"method": "dmpo", "dmpo_loss": "wddo", "dmpo_target": "reference"},
    },
}
"""comparison -> arm label -> overrides of the shared recipe (`QUICKSTART_RECIPE` + `STABLE`)."""

D1_AUTHORS_SUDOKU = "diffu-grpo, d1's settings, lr 5e-4/12"
DMPO_AUTHORS_SUDOKU = "dmpo, its authors' settings, lr 5e-4/8"
SHARED_SETTING_LR = 5e-4
"""`STABLE`'s lr: the shared setting's one optimizer step per rollout batch at 5e-4 (the lr rule of `sudoku-authors`)."""


def _authors_arm(values: dict[str, Any]) -> dict[str, Any]:
    """An authors'-settings arm for `sudoku-authors`: `values` (`reasoning_rl.D1_AUTHORS_ARM` or `DMPO_AUTHORS_ARM`)
    with the lr fixed before any run by the Countdown rule (docs/RESULTS.md, "diffu-GRPO with d1's settings on the
    masked-diffusion base"): lr x optimizer steps per rollout batch = the shared setting's 5e-4 x 1."""
    return {**values, "learning_rate": SHARED_SETTING_LR / values["num_iterations"]}


def _sudoku_authors() -> dict[str, dict[str, Any]]:
    from mmrl.tiny_world.reasoning_rl import D1_AUTHORS_ARM, DMPO_AUTHORS_ARM

    return {
        # the shared setting, exactly `dmpo-vs-d1`'s two arms (first: the clean-SFT row takes the first arm's 10
        # optimizer steps of 128 sequences, as in `dmpo-vs-d1`)
        "diffu-grpo (d1), F=1": dict(COMPARISONS["dmpo-vs-d1"]["diffu-grpo (d1), F=1"]),
        D1_AUTHORS_SUDOKU: _authors_arm(D1_AUTHORS_ARM),  # mu = 12: 120 optimizer steps over the 10 rollout batches
        "dmpo, F=1": dict(COMPARISONS["dmpo-vs-d1"]["dmpo, F=1"]),
        DMPO_AUTHORS_SUDOKU: _authors_arm(DMPO_AUTHORS_ARM),  # F = 8: 80 optimizer steps
    }


# issue 24 item 2 on Sudoku: each method with its authors' settings (`D1_AUTHORS_ARM`, `DMPO_AUTHORS_ARM`, the
# Countdown arms' values) beside the shared setting of `dmpo-vs-d1`, the same 10 rollout batches of 8 x 16, base and
# test puzzles. Differs from the authors' code: the lr (theirs 3e-6 on LLaDA-8B: here 5e-4 / 12 and 5e-4 / 8, fixed
# beforehand), 8 puzzles x 16 answers per rollout batch (d1: 6 answers per prompt), 16 answer tokens decoded one per
# step in one block (d1: 256 in blocks of 32), full fine-tuning of a 0.6M-parameter model (d1: LoRA), the reward
# (the task's d1 cell reward for both; the DMPO authors ran no Sudoku)
COMPARISONS["sudoku-authors"] = _sudoku_authors()

CONTRASTS: dict[str, list[tuple[str, str]]] = {
    "sudoku-rewards": [("diffu-grpo, solved 1/0", "diffu-grpo, cells (d1)"), ("diffu-grpo, verifier", "diffu-grpo, cells (d1)"),
                       ("dmpo, solved 1/0", "dmpo, cells (d1)"), ("dmpo, verifier", "dmpo, cells (d1)"),
                       ("dmpo, solved 1/0", "diffu-grpo, solved 1/0"), ("dmpo, verifier", "diffu-grpo, verifier"),
                       ("dmpo, cells (d1)", "diffu-grpo, cells (d1)"), (DMPO_SOLVED_ONLY, "dmpo, cells (d1)"),
                       (DMPO_SOLVED_ONLY, "diffu-grpo, cells (d1)"), (DMPO_SOLVED_ONLY, "dmpo, solved 1/0")],
    "dmpo-small-batch": [("wdce, group baseline", "wdce, no baseline"), ("wdce, individual baseline", "wdce, no baseline"),
                         ("wdce, model baseline", "wdce, no baseline"), ("wdce, individual baseline", "wdce, group baseline"),
                         ("wdce, model baseline", "wdce, group baseline"), ("wdce, model baseline", "wdce, individual baseline"),
                         ("wdce, no baseline, correct cells only", "wdce, no baseline"),
                         ("wdce, group baseline, correct cells only", "wdce, group baseline"),
                         ("wddo", "wdce, no baseline")],
    "sudoku-authors": [(D1_AUTHORS_SUDOKU, "diffu-grpo (d1), F=1"), (DMPO_AUTHORS_SUDOKU, "dmpo, F=1"),
                       (DMPO_AUTHORS_SUDOKU, D1_AUTHORS_SUDOKU), ("dmpo, F=1", "diffu-grpo (d1), F=1")],
}
"""comparison -> the (a, b) pairs whose difference a - b the table reports (default: every pair of RL arms); a
pair with an arm left out by the cutoff is skipped."""

SIZES: dict[str, dict[str, Any]] = {
    # 8 puzzles x 16 answers per rollout batch, 10 batches (an F = 24 run is 240 optimizer steps, ~6 min on one core)
    "dmpo-vs-d1": {"rollouts": 10, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1},
    "dmpo-reuse-sudoku4": {"rollouts": 10, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1},
    "sudoku-rewards": {"rollouts": 10, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1},
    "sudoku-authors": {"rollouts": 10, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 1},
    # 16x dmpo-vs-d1's batch: 128 puzzles x 16 answers per optimizer step (16 micro-batches of 128), 20 batches (the
    # batch was the one lever that lifted diffu-GRPO's validation curve on sudoku4-mid; docs/RESULTS.md)
    "sudoku-batch16": {"rollouts": 20, "num_generations": 16, "per_device_train_batch_size": 128, "gradient_accumulation_steps": 16},
    # the paper's failure mode of plain WDCE needs a small batch: 4 prompts x 8 responses per rollout
    "dmpo-small-batch": {"rollouts": 30, "num_generations": 8, "per_device_train_batch_size": 32, "gradient_accumulation_steps": 1},
}
"""comparison -> rollout budget and batch shape shared by its arms."""

SUDOKU_BASES = ("sudoku4", "sudoku4-mid", "sudoku4-strong")
"""The masked-diffusion Sudoku bases the Sudoku comparisons can start from (`mmrl.tiny_world.models.TINY_MODELS`):
the shipped 150-step base, and the same recipe at 300 and 1,200 steps."""

ONE_OPTIMIZER = ("dmpo-vs-d1", "dmpo-reuse-sudoku4", "sudoku-rewards", "sudoku-authors", "sudoku-batch16")
"""Comparisons whose arms run on one optimizer setting (`mmrl.tiny_world.reasoning_rl.SHARED_OPTIMIZER`: AdamW
(0.9, 0.999), clip 1.0, no weight decay), so that DMPO's method defaults (clip 0.2, beta2 0.99, weight decay 0.1)
do not make its arm differ from diffu-GRPO's in more than the method (in `sudoku-authors` the authors' arms set their
own optimizer, which overrides this)."""

SMOKE = {"per_device_train_batch_size": 32, "num_generations": 4, "eval_limit": 16, "gradient_accumulation_steps": 1}
"""`--smoke`: 8 puzzles x 4 answers per rollout batch, 16 validation and test puzzles, a 20-step base (CI plumbing)."""

CLEAN_SFT_ROW = "clean SFT, same compute"
RFT_ROW = "RFT, same rollouts"
BASELINE_ROWS = ("dmpo-vs-d1", "dmpo-reuse-sudoku4", "sudoku-rewards", "sudoku-authors", "sudoku-batch16")
"""Comparisons that get the baseline rows (`run_comparison`): clean SFT on the training puzzles' true solutions at
the first arm's optimizer steps and sequences per step, RFT on the base's fully solved samples at the same
rollouts, best-of-n from the base at the arms' samples per puzzle."""
NO_BEST_OF_N = ("sudoku-authors",)
"""Comparisons of `BASELINE_ROWS` without the best-of-n rows (a base-only measurement; `sudoku-authors` leaves its
~3 CPU-minutes to the seeds: docs/RESULTS.md, its budget)."""


def arm_config(name: str, arm: str, *, seed: int, rollouts: int, out: Path, smoke: bool = False,
               lr: float | None = None, base: str | None = None) -> dict[str, Any]:
    """The full override dict of one arm: the quickstart recipe with `STABLE` (its lr replaced by `lr` if given),
    the comparison's batch (and its one optimizer setting, `ONE_OPTIMIZER`), the arm's settings (an arm that sets
    its own lr, e.g. an authors'-settings arm, keeps it); the number of optimizer steps is rollouts x
    num_iterations, so every arm samples the same number of rollouts."""
    size = dict(SIZES[name])
    size.pop("rollouts")
    if name in ONE_OPTIMIZER:
        from mmrl.tiny_world.reasoning_rl import SHARED_OPTIMIZER

        size.update(SHARED_OPTIMIZER)
    over = dict(COMPARISONS[name][arm])
    f = int(over.get("num_iterations", 1))
    shared_lr = {"learning_rate": lr} if lr is not None else {}
    cfg = {**QUICKSTART_RECIPE, **STABLE, **shared_lr, **size, **over, "seed": seed, "num_iterations": f, "max_steps": rollouts * f,
           "eval_steps": max(1, rollouts * f // 3), "save_steps": 0, "credit_steps": 0, "output_dir": str(out),
           "progress_bar": False}
    if base is not None:  # the runner loads the policy itself; the config records which base it was
        cfg["model_name_or_path"] = f"tiny-world:{base}"
    if smoke:
        cfg.update(SMOKE)
    return cfg


def import_stored_runs(results_file: str | Path, root: Path, *, name: str, base_model: str, digest: str | None,
                       lr: float, rollouts: int) -> dict[str, list[int]]:
    """Seed `root`, the report folder of the Sudoku comparison `name`, with the runs an earlier report saved in
    `results_file` (its results.json: every run's per-puzzle test scores, finished seeds and "incomplete" ones, the
    base's scores and best-of-n), so that a resume skips them and the next report pools them with new seeds; returns
    {row: [seeds imported]}. A run folder lost with its machine is then no loss: the seeds of one session's report and
    of the next pool into one table.

    The stored report must be of `name` on `base_model`, on the same build (its `base_weights_sha256` equal to
    `digest`, the cached build's), at the same lr and rollout batches, and not a smoke run: another build is another
    model, another lr or budget another arm. Writes `root/base.json`, `root/best_of_n.json` and
    `root/runs/<run>/result.json` per stored run, marked `STORED_FROM` (no metrics.jsonl: the report's curves and
    training diagnostics cover the runs trained here); a file already there is kept when it holds the same scores,
    otherwise ValueError (never overwritten)."""
    from functools import partial

    from mmrl.tiny_world.reasoning_rl import STORED_FROM, put_stored, run_slug

    res = json.loads(Path(results_file).read_text())
    if res.get("name") != name or res.get("base_model", "sudoku4") != base_model:
        raise ValueError(f"{results_file} is a report of {res.get('name')!r} on {res.get('base_model', 'sudoku4')!r}, "
                         f"not {name!r} on {base_model!r}")
    theirs = res.get("base_weights_sha256")
    if not theirs or digest is None or theirs != digest:
        raise ValueError(f"{results_file}: its base build {(theirs or 'unknown')[:12]} is not the build in use "
                         f"{(digest or 'unknown')[:12]}: its runs are not paired with new ones")
    if res.get("lr") != lr or res.get("rollouts") != rollouts:
        raise ValueError(f"{results_file} holds runs at lr {res.get('lr')} and {res.get('rollouts')} rollout batches, "
                         f"not lr {lr} and {rollouts}: pass those --lr / --rollouts or another report")
    if res.get("smoke"):
        raise ValueError(f"{results_file} is a smoke report")

    put = partial(put_stored, source=results_file)
    put(root / "base.json", {"base": res["base"], "base_items": res["base_items"], "weights_sha256": theirs,
                             "base_model": base_model, "lr": lr, "base_validation": res["base_validation"]},
        ("base_items", "weights_sha256"))
    if res.get("best_of_n"):
        put(root / "best_of_n.json", res["best_of_n"], ("items",))
    done: dict[str, list[int]] = {}
    for group in ("arms", "incomplete"):
        for row, runs in (res.get(group) or {}).items():
            for r in runs:
                put(root / "runs" / run_slug(row, int(r["seed"])) / "result.json", {**r, STORED_FROM: str(results_file)},
                    ("seed", "items"))
                done.setdefault(row, []).append(int(r["seed"]))
    return {row: sorted(seeds) for row, seeds in done.items()}


def run_comparison(name: str, out: str | Path = "runs/replicate", *, seeds: int = 5, rollouts: int | None = None,
                   smoke: bool = False, progress: bool = True, baselines: bool = True,
                   cutoff: str | None = None, arms: list[str] | None = None, resume: bool = False,
                   report_only: bool = False, base: str = "sudoku4", lr: float | None = None,
                   stored: str | Path | None = None) -> dict[str, Any]:
    """Run every arm of the Sudoku comparison `name` (or those named in `arms`) over `seeds` from the cached
    masked-diffusion Sudoku base `base` (`SUDOKU_BASES`; default `sudoku4`), at the shared learning rate `lr`
    (default `STABLE`'s; the clean-SFT and RFT rows take the first arm's); report into `<out>/<name>`
    (results.json with every run's per-puzzle test scores, table.md,
    the validation curves).

    The protocol (issue 23): curves on `task.validation`, the test puzzles scored once per run at the end (greedy,
    steps = length), paired-bootstrap 95% intervals over puzzles and seeds (`mmrl.tiny_world.stats`) for every gain
    and every difference. With `baselines` (`BASELINE_ROWS`), beside the RL arms, the same seeds:

    - clean SFT at the same compute: the base trained further on the training puzzles' true solutions (the base is
      not degraded on purpose, so "clean" is the true labels), with the first arm's optimizer steps and sequences
      per step (`max_steps` x `per_device_train_batch_size`), its lr and AdamW with its clipping (`fit_batches`);
    - RFT at the same rollouts: the base's own samples, the same sampler and number (rollout batches x puzzles x
      answers), fully solved ones kept, one step per rollout batch, the same loss and optimizer as the clean SFT
      row (`mmrl.tiny_world.rft`);
    - best-of-n from the base: n = the arms' answers per puzzle, sampled as in training, the puzzle scored by its
      best answer (the reward as the verifier: it reads the solution, so an oracle reranker's ceiling), and the same
      n answers reranked as a user could: the one with the fewest violated constraints (`sudoku4_verifier`, which
      reads only the puzzle).

    Runs go seed-major (seed 0 of every arm, clean SFT and RFT, then seed 1, ...) and each writes
    `runs/<run>/result.json` when it finishes (the base's scores: `base.json`, best-of-n: `best_of_n.json`);
    `resume` keeps `<out>/<name>` and skips the runs already saved, `report_only` runs nothing and builds the
    report from the saved runs. `cutoff` ("HH:MM", UTC): start no run after that clock time. The table uses the
    seeds every row has finished (`complete_seeds`); the other finished runs are kept in results.json under
    "incomplete". An arm's `reward_funcs` replaces the task's reward for training only (validation and test score
    the task's metric). `stored`: an earlier report's results.json whose runs are imported first
    (`import_stored_runs`; same comparison, build, lr and rollouts), then the call resumes: new seeds pool with them."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.models import load_base_policy
    from mmrl.tiny_world.quickstart import evaluate_items
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS
    from mmrl.tiny_world.reasoning_rl import build_digest, complete_seeds, held_out_items, run_slug, sampled_generation
    from mmrl.tiny_world.rft import fit_batches, masked_diffusion_nll, rejection_sampling_ft, truth_batches
    from mmrl.tiny_world.stats import difference_interval, mean_interval
    from mmrl.tiny_world.tasks import sudoku4_verifier
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.training.trainer import Trainer

    if name not in COMPARISONS:
        raise ValueError(f"unknown comparison {name!r}; implemented: {sorted(COMPARISONS)}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if base not in SUDOKU_BASES:
        raise ValueError(f"unknown Sudoku base {base!r}; the masked-diffusion sudoku4 bases are {list(SUDOKU_BASES)}")
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    base_model = base  # `base` is the base's test accuracy below, as in the other runners' tables
    bad = sorted(set(arms or []) - set(COMPARISONS[name]))
    if bad:
        raise ValueError(f"unknown arms {bad} of {name}; valid: {list(COMPARISONS[name])}")
    rollouts = rollouts or (2 if smoke else SIZES[name]["rollouts"])
    baselines = baselines and name in BASELINE_ROWS
    stop = cutoff_time(cutoff)
    root = Path(out) / name
    base_file, best_file = root / "base.json", root / "best_of_n.json"
    if report_only and stored is None and not base_file.exists():
        raise ValueError(f"--report-only: no saved runs in {root} (base.json missing)")
    resume = resume or stored is not None  # imported runs are saved runs to keep
    if root.exists() and not (resume or report_only):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    register()  # the tiny world's tasks and rewards
    task = load_task("sudoku4")
    test = task.test[: 16 if smoke else QUICKSTART_RECIPE["eval_limit"]]  # once per run, at the end
    val = task.validation[: len(test)]  # the curves
    base_steps = SMOKE_BASE_STEPS if smoke else None
    selected = [a for a in COMPARISONS[name] if not arms or a in arms]
    settings = {"rollouts": rollouts, "smoke": smoke, "lr": lr, "base": base_model}  # every arm's, for `arm_config`
    shape = load_config(None, arm_config(name, selected[0], seed=0, out=root, **settings))
    n_best = shape.num_generations  # best-of-n: the arms' answers per puzzle
    t_all = time.perf_counter()
    digest = build_digest(base_model, base_steps)  # the cached build's weights (tiny_spec.json), None if not built yet
    if stored is not None:
        if digest is None:  # the stored report names its build: build this one to compare, before anything else
            load_base_policy(base_model, progress=progress, steps=base_steps)
            digest = build_digest(base_model, base_steps)
        imported = import_stored_runs(stored, root, name=name, base_model=base_model, digest=digest,
                                      lr=shape.learning_rate, rollouts=rollouts)
        logger.info(f"[{name}] imported from {stored}: " + ", ".join(f"{a} seeds {s}" for a, s in imported.items()))
    # one worker scores the base (and builds it if it is not cached) while the others wait, then they read its files
    with (nullcontext() if report_only else claimed(root / "claims" / "base", wait=True)):
        if base_file.exists() and (resume or report_only):
            saved_base = json.loads(base_file.read_text())
            if saved_base.get("base_model", "sudoku4") != base_model:  # a base.json of before `base` was saved: sudoku4's
                raise ValueError(f"{base_file} was scored on the base {saved_base.get('base_model', 'sudoku4')!r}, not "
                                 f"{base_model!r}: pass --base {saved_base.get('base_model', 'sudoku4')} or another --out")
            if saved_base.get("lr", STABLE["learning_rate"]) != shape.learning_rate:  # saved runs at another lr
                raise ValueError(f"{root} holds runs at lr {saved_base.get('lr', STABLE['learning_rate'])}, not "
                                 f"{shape.learning_rate}: pass that --lr or another --out")
            if saved_base.get("weights_sha256") and digest and saved_base["weights_sha256"] != digest:
                raise ValueError(f"{base_file} was scored on build {saved_base['weights_sha256'][:12]}, the cached "
                                 f"{base_model} is {digest[:12]}: its runs are not paired with new ones")
            saved_base.setdefault("weights_sha256", digest)  # a base.json written before the digest was saved
        else:
            base_policy = load_base_policy(base_model, progress=progress, steps=base_steps)
            b_acc, b_items = evaluate_items(base_policy, test, task.metric)
            saved_base = {"base": b_acc, "base_items": b_items, "weights_sha256": build_digest(base_model, base_steps),
                          "base_model": base_model, "lr": shape.learning_rate,
                          "base_validation": evaluate_items(base_policy, val, task.metric)[0]}  # the curves' start
            write_atomic(base_file, json.dumps(saved_base))
        base, base_items, base_val = (saved_base[k] for k in ("base", "base_items", "base_validation"))
        best = None
        if baselines and name not in NO_BEST_OF_N and not best_file.exists() and not report_only:
            t0 = time.perf_counter()
            best = held_out_items(load_base_policy(base_model, progress=False, steps=base_steps), test, task.metric,
                                  "masked_diffusion", 16, k=n_best, verifier=sudoku4_verifier)
            write_atomic(best_file, json.dumps({**best[0], "items": best[1], "seconds": time.perf_counter() - t0}))
        if baselines and name not in NO_BEST_OF_N and best_file.exists():
            best = json.loads(best_file.read_text())
    row_arms = selected + ([CLEAN_SFT_ROW, RFT_ROW] if baselines else [])

    def one_run(label: str, seed: int, run_dir: Path) -> dict[str, Any]:
        """Train one row (an RL arm, clean SFT or RFT) at one seed from the base, score the test puzzles once."""
        remove_unfinished_run(run_dir)  # an unfinished run of an earlier, stopped call (RunLocked if live)
        policy = load_base_policy(base_model, progress=False, steps=base_steps)
        t0 = time.perf_counter()
        extra: dict[str, Any]
        if label == CLEAN_SFT_ROW:  # the first arm's compute (F = 1 there)
            steps, per_step = shape.max_steps, shape.step_batch_size  # the answers of one optimizer step
            if progress:
                logger.info(f"[{name}] {CLEAN_SFT_ROW}, seed {seed + 1}/{seeds}: {steps} steps of {per_step} true solutions")
            batches = truth_batches(policy, task.train, steps=steps, batch_size=per_step, gen_length=shape.max_completion_length, seed=seed)
            losses = fit_batches(policy, batches, masked_diffusion_nll(seed), lr=shape.learning_rate, max_grad_norm=shape.max_grad_norm)
            extra = {"loss": losses, "steps": steps, "rollouts": 0, "trained_sequences": steps * per_step}
        elif label == RFT_ROW:
            if progress:
                logger.info(f"[{name}] {RFT_ROW}, seed {seed + 1}/{seeds}: {rollouts} rollout batches of "
                            f"{shape.prompts_per_rollout} x {shape.num_generations}")
            rft = rejection_sampling_ft(policy, task.train, task.metric, rollouts=rollouts, prompts_per_rollout=shape.prompts_per_rollout,
                                        group_size=shape.num_generations, lr=shape.learning_rate, seed=seed,
                                        max_grad_norm=shape.max_grad_norm, loss_fn=masked_diffusion_nll(seed),
                                        generation=sampled_generation("masked_diffusion", shape.max_completion_length))
            extra = {"rft_accepted": sum(rft["accepted"]), "rft_sampled": rft["sampled"], "steps": len(rft["accepted"]),
                     "rollouts": int(rft["sampled"]), "trained_sequences": sum(rft["accepted"])}
        else:
            cfg = load_config(None, arm_config(name, label, seed=seed, out=run_dir, **settings))
            if progress:
                logger.info(f"[{name}] {label}, seed {seed + 1}/{seeds}: {cfg.max_steps} optimizer steps, {rollouts} rollout batches")
            Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs or task.reward_funcs, eval_dataset=val,
                    eval_metric=task.metric).train()
            extra = {"steps": cfg.max_steps,
                     "rollouts": cfg.max_steps // cfg.steps_per_rollout * cfg.prompts_per_rollout * cfg.num_generations}
        secs = time.perf_counter() - t0
        acc, items = evaluate_items(policy, test, task.metric)  # the test rows, once per run
        run_dir.mkdir(parents=True, exist_ok=True)
        if progress:
            logger.info(f"      test cell accuracy {100 * acc:.1f}% (base {100 * base:.1f}%), {secs:.0f} s")
        return {"seed": seed, "accuracy": acc, "items": items, "seconds": secs, **extra}

    done: dict[str, dict[int, dict]] = {}
    stopped = False
    for seed in range(seeds):  # seed-major: a stopped run leaves whole seeds
        for label in row_arms:
            saved = root / "runs" / run_slug(label, seed) / "result.json"
            if saved.exists() and (resume or report_only):
                done.setdefault(label, {})[seed] = json.loads(saved.read_text())
            elif not report_only and not stopped:
                if stop is not None and time.time() > stop:
                    logger.info(f"[{name}] cutoff {cutoff} UTC passed: {label}, seed {seed} and later runs not started")
                    stopped = True
                    continue
                with claimed(root / "claims" / run_slug(label, seed)) as mine:
                    if not mine:  # another worker on this folder (the same command with --resume) is running it
                        logger.info(f"[{name}] {label}, seed {seed}: another worker is running it; skipped")
                        continue
                    if saved.exists():  # finished by another worker since this one looked
                        res = json.loads(saved.read_text())
                    else:
                        res = one_run(label, seed, saved.parent)
                        write_atomic(saved, json.dumps(res))
                done.setdefault(label, {})[seed] = res
    for seed in range(seeds):  # runs other workers finished while this one ran its own
        for label in row_arms:
            saved = root / "runs" / run_slug(label, seed) / "result.json"
            if seed not in done.get(label, {}) and saved.exists():
                done.setdefault(label, {})[seed] = json.loads(saved.read_text())
    total = time.perf_counter() - t_all
    use = complete_seeds({a: set(d) for a, d in done.items()}, row_arms, seeds)
    if not use:
        raise ValueError(f"no seed has finished every row of {name} in {root} ({ {a: sorted(d) for a, d in done.items()} })")
    if len(use) < seeds:
        logger.info(f"[{name}] the report uses the {len(use)} seeds every row has finished: {use}")
    incomplete = {a: [d[s] for s in sorted(d) if s not in use] for a, d in done.items()}
    incomplete = {a: runs for a, runs in incomplete.items() if runs}
    arms_runs: dict[str, list[dict]] = {}
    for label in row_arms:
        for seed in use:
            r = dict(done[label][seed])
            r["records"] = read_metrics(root / "runs" / run_slug(label, seed)) if label in COMPARISONS[name] else []
            arms_runs.setdefault(label, []).append(r)
    seeds = len(use)
    arms = arms_runs
    base_m = [base_items]
    rows = [["base model", mean_interval(base_m).fmt(), "-", fmt(base_val), "-", "-", "-", "-"]]
    gains: dict[str, Any] = {}
    best_label = f"best-of-{n_best} (base)"
    if best is not None:
        gains[best_label] = difference_interval([best["items"]["best"]], base_m)
        rows.append([f"{best_label}: {n_best} sampled answers per puzzle, the best by the reward",
                     mean_interval([best["items"]["best"]]).fmt(), gains[best_label].fmt(signed=True), "-", "-",
                     "0", f"0 ({n_best} per test puzzle)", f"{best['seconds']:.0f}"])
        verified_label = f"best-of-{n_best} (base), constraint verifier"
        gains[verified_label] = difference_interval([best["items"]["verified"]], base_m)
        rows.append([f"{verified_label}: the answer with the fewest violated Sudoku constraints (reads only the puzzle)",
                     mean_interval([best["items"]["verified"]]).fmt(), gains[verified_label].fmt(signed=True), "-", "-",
                     "0", f"0 ({n_best} per test puzzle)", "-"])
        rows.append([f"base, one sampled answer (T = 1, mean of {n_best})", mean_interval([best["items"]["sampled"]]).fmt(),
                     difference_interval([best["items"]["sampled"]], base_m).fmt(signed=True), "-", "-", "0",
                     f"0 ({n_best} per test puzzle)", "-"])
    with_logs = {a: [r for r in runs if r["records"]] for a, runs in arms.items()}  # imported runs keep no training log
    for arm, runs in arms.items():
        items = [r["items"] for r in runs]
        gains[arm] = difference_interval(items, base_m)
        logged = with_logs[arm]
        last_val = (mean_std([([y for _, y in curve(r["records"], "eval/accuracy")] or [float("nan")])[-1] for r in logged])
                    if logged else None)
        rew = [[y for _, y in curve(r["records"], "reward")] for r in logged]
        rew_cell = (f"{100 * mean_std([mean_std(y[:5])[0] for y in rew])[0]:.1f} / {100 * mean_std([mean_std(y[-5:])[0] for y in rew])[0]:.1f}"
                    if rew and all(rew) else "-")
        label = f"{arm} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
        if arm == RFT_ROW:
            label += f", kept {sum(r['rft_accepted'] for r in runs)} of {sum(r['rft_sampled'] for r in runs)} samples"
        sampled = compute_cell([r.get("rollouts") for r in runs])
        if arm == CLEAN_SFT_ROW:
            sampled += f" ({compute_cell([r.get('trained_sequences') for r in runs])} true solutions)"
        rows.append([label, mean_interval(items).fmt(), gains[arm].fmt(signed=True),
                     fmt(*last_val) if logged else "-", rew_cell, compute_cell([r.get("steps") for r in runs]),
                     sampled, f"{mean_std([r['seconds'] for r in runs])[0]:.0f}"])
    table = markdown_table(["model", "test cell accuracy (%) [95% CI]", "gain over the base (points) [95% CI]",
                            "validation cell accuracy, last eval (%)", "train reward, first / last 5 steps (%)",
                            "optimizer steps", "training rollouts sampled per run", "s per run"], rows)
    rl = [a for a in COMPARISONS[name] if a in arms]
    refs = [r for r in (CLEAN_SFT_ROW, RFT_ROW) if r in arms] + ([best_label, verified_label] if best is not None else [])
    ref_items = {**{r: [x["items"] for x in arms[r]] for r in refs if r in arms},
                 **({best_label: [best["items"]["best"]], verified_label: [best["items"]["verified"]]}
                    if best is not None else {})}
    diffs: dict[str, Any] = {}
    pairs = CONTRASTS.get(name) or [(b, a) for i, a in enumerate(rl) for b in rl[i + 1:]]
    for b, a in pairs:
        if a in arms and b in arms:
            diffs[f"{b} - {a}"] = difference_interval([r["items"] for r in arms[b]], [r["items"] for r in arms[a]])
    for a in rl:
        for b in refs:
            diffs[f"{a} - {b}"] = difference_interval([r["items"] for r in arms[a]], ref_items[b])
    if CLEAN_SFT_ROW in arms and RFT_ROW in arms:
        diffs[f"{CLEAN_SFT_ROW} - {RFT_ROW}"] = difference_interval(ref_items[CLEAN_SFT_ROW], ref_items[RFT_ROW])
    if diffs:
        table += "\n\n" + markdown_table(["difference, test cell accuracy (points)", "estimate [95% CI]", "claimed (interval excludes 0)"],
                                          [[k, v.fmt(signed=True), "yes" if v.excludes_zero else "no"] for k, v in diffs.items()])
    with_logs = {a: runs for a, runs in with_logs.items() if runs}
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in with_logs.items()},
                root / "accuracy.png", title=f"{name}: validation Sudoku cell accuracy", ylabel="cell accuracy")
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in with_logs.items()},
                root / "reward.png", title=f"{name}: training reward", ylabel="reward")
    results = {"name": name, "protocol": "curves on validation, test once per run; paired bootstrap 95% CI over test puzzles and seeds",
               "base": base, "base_model": base_model, "base_weights_sha256": saved_base["weights_sha256"],
               "base_items": base_items,
               "base_validation": base_val, "test_puzzles": [r["puzzle"] for r in test],
               "validation_puzzles": len(val), "best_of_n": best, "n_best": n_best,
               "gains": {a: iv.to_dict() for a, iv in gains.items()},
               "differences": {k: v.to_dict() for k, v in diffs.items()}, "table": table,
               "seeds": seeds, "seeds_used": use, "rollouts": rollouts, "seconds": total, "smoke": smoke,
               "run_seconds": sum(r["seconds"] for runs in arms.values() for r in runs),
               "compute": {"optimizer_steps": shape.max_steps, "sequences_per_step": shape.step_batch_size,
                           "rollouts_per_run": rollouts * shape.rollout_batch_size},
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in arms.items()},
               "incomplete": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in incomplete.items()},
               "cutoff": cutoff,
               "lr": shape.learning_rate,
               "configs": {a: arm_config(name, a, seed=0, out=Path("."), **settings) for a in rl}}
    diag = {a: [run_diagnostics(r["records"]) for r in runs] for a, runs in with_logs.items()}
    results["diagnostics"] = diag
    if diag:
        (root / "diagnostics.md").write_text(diagnostics_table(diag) + "\n\nMeans over seeds of each run's first 5 and last 5 "
                                             "training steps (`run_diagnostics`); KL [min, max] over seeds of the last 5.\n")
    partial = {a: [r["seed"] for r in with_logs.get(a, [])] for a in rl if len(with_logs.get(a, [])) < len(arms[a])}
    logs_note = ("\nValidation column, training reward, curves and diagnostics over the runs with training logs (the others "
                 "were imported from a stored report's per-puzzle scores): " + "; ".join(
                     f"{a} seeds {s or 'none'}" for a, s in partial.items()) + ".\n") if partial else ""
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\nBase `{base_model}` (weights {(saved_base['weights_sha256'] or 'unknown')[:12]}), "
                                   f"{seeds} seeds ({', '.join(map(str, use))}), {rollouts} rollout batches per "
                                   f"arm at lr {shape.learning_rate:g}, {len(test)} test puzzles, {results['run_seconds']:.0f} s of training and "
                                   f"scoring over the reported runs.\n" + logs_note)
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results


@contextlib.contextmanager
def claimed(path: Path, *, wait: bool = False) -> Iterator[bool]:
    """An exclusive claim on `path` among the workers sharing a run folder (`RunLock`'s flock: a dead worker's claim
    frees itself). Yields True when this worker holds it, False when another does (`wait`: poll until it is free)."""
    from mmrl.checkpointing.run_lock import RunLock, RunLocked

    lock = RunLock(path)
    while True:
        try:
            lock.acquire()
            break
        except RunLocked:
            if not wait:
                yield False
                return
            time.sleep(2.0)
    try:
        yield True
    finally:
        lock.release()


def write_atomic(path: Path, text: str) -> None:
    """`path.write_text(text)` that a reader in another process never sees half written."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def compute_cell(values: list[Any]) -> str:
    """A table cell for one per-run count over a row's seeds (optimizer steps, rollouts): the value when every
    seed has the same, "lo-hi" otherwise, "-" when a run did not record it."""
    if any(v is None for v in values) or not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


DIAGNOSTIC_KEYS = {"kl": "KL to the base", "diag/neg_weight_frac": "negative weight share", "dmpo/masked_ce": "masked CE",
                   "dmpo/token_mask_frac": "tokens fitted", "frac_reward_zero_std": "zero-variance groups"}
"""metrics.jsonl keys of the per-run diagnostics (`run_diagnostics`) -> their column names."""


def run_diagnostics(records: list[dict]) -> dict[str, float]:
    """One run's training diagnostics from its metric records (those with a `reward`, in step order): the training
    reward, KL to the base (`kl`, the k3 token mean of the KL term's estimator), the negative share of the
    loss's weight mass (`diag/neg_weight_frac`: sum of |w| over below-baseline responses / sum of |w|), DMPO's
    masked CE of its rollouts and the share of response tokens its WDCE fits, each as the mean of the first and of
    the last 5 steps (`<key>/first`, `<key>/last`); a key the run did not log is absent."""
    train = [r for r in records if "reward" in r]
    out: dict[str, float] = {}
    for key in ("reward", *DIAGNOSTIC_KEYS):
        ys = [float(r[key]) for r in train if r.get(key) is not None]
        if ys:
            out[f"{key}/first"], out[f"{key}/last"] = sum(ys[:5]) / len(ys[:5]), sum(ys[-5:]) / len(ys[-5:])
    return out


def diagnostics_table(diag: dict[str, list[dict[str, float]]]) -> str:
    """Markdown: per arm (`diag`: arm -> one `run_diagnostics` dict per seed), the mean over seeds of each
    diagnostic, first 5 -> last 5 steps; the last KL also as [min, max] over seeds."""
    from mmrl.tiny_world.report import markdown_table

    keys = ["reward", *DIAGNOSTIC_KEYS]
    rows = []
    for arm, runs in diag.items():
        row = [f"{arm} ({len(runs)} seeds)"]
        for key in keys:
            first = [r[f"{key}/first"] for r in runs if f"{key}/first" in r]
            last = [r[f"{key}/last"] for r in runs if f"{key}/last" in r]
            if len(last) < len(runs) or not runs:
                row.append("-")
                continue
            pct = key != "kl" and key != "dmpo/masked_ce"
            k, d = (100.0, 1) if pct else (1.0, 3)
            cell = f"{k * sum(first) / len(first):.{d}f} -> {k * sum(last) / len(last):.{d}f}"
            if key == "kl":
                cell += f" [{min(last):.3f}, {max(last):.3f}]"
            row.append(cell)
        rows.append(row)
    heads = ["arm", "train reward (%)"] + [DIAGNOSTIC_KEYS[k] + (" (%)" if k not in ("kl", "dmpo/masked_ce") else "")
                                             for k in DIAGNOSTIC_KEYS]
    return markdown_table([h + ", first 5 -> last 5 steps" if i else h for i, h in enumerate(heads)], rows)


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
    parser.add_argument("--n-samples", type=int, default=None, help="gcpo-vs-grpo, dmpo-vs-grpo-masked: test images per prompt (default 4)")
    parser.add_argument("--no-baselines", action="store_true", help="gcpo-vs-grpo, dmpo-vs-grpo-masked, the Countdown and the "
                        "Sudoku comparisons: skip the clean-data / clean-SFT, best-of-n and rejection-sampling rows")
    parser.add_argument("--rollouts", type=int, default=None, help="rollout batches per arm (default: the comparison's)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (the shapes comparisons; default: the recipe's)")
    parser.add_argument("--base", default=None, help="the Countdown comparisons: another tiny causal Countdown base "
                        "(default: the recipe's; e.g. countdown3-ar, the base trained on right answers only); "
                        "gcpo-vs-grpo: shapes (default, noisy captions) or shapes-clean; gcpo-vs-grpo-vqa: a shapes_vqa "
                        "base (default shapes-vqa; e.g. shapes-vqa-reads); the Sudoku comparisons: sudoku4 (default), "
                        "sudoku4-mid or sudoku4-strong (the same recipe at 150 / 300 / 1,200 steps)")
    parser.add_argument("--lr", type=float, default=None, help="gcpo-vs-grpo: the learning rate (default: the recipe's "
                        "5e-4; pass the one `gcpo-vs-grpo-lr` chose on validation); the Sudoku comparisons: the shared "
                        "lr of every arm that sets none of its own, and of the clean-SFT and RFT rows (default 5e-4)")
    parser.add_argument("--arm", action="append", default=None, help="the Countdown and Sudoku comparisons, dmpo-vs-grpo-masked and gcpo-vs-grpo-vqa: "
                        "run only this arm "
                        "(repeat for several; default: every arm)")
    parser.add_argument("--resume", action="store_true", help="the Countdown and Sudoku comparisons and gcpo-vs-grpo-vqa: keep "
                        "OUT/NAME and skip the runs already saved (runs/<run>/result.json); the Sudoku comparisons: "
                        "the same command with --resume started in several shells shares the runs out (each run is "
                        "claimed by one worker, OUT/NAME/claims/)")
    parser.add_argument("--report-only", action="store_true", help="the Countdown and Sudoku comparisons and gcpo-vs-grpo-vqa: "
                        "run nothing, build the "
                        "report from the saved runs (the seeds every row has finished)")
    parser.add_argument("--import-results", default=None, metavar="RESULTS_JSON", help="the Countdown and Sudoku "
                        "comparisons: first import the runs of an earlier report's results.json (its per-item scores; "
                        "same comparison and base build, and for Sudoku the same --lr and --rollouts) into OUT/NAME, "
                        "then resume: new seeds pool with them")
    parser.add_argument("--cutoff", default=None, help="gcpo-vs-grpo-vqa, dmpo-vs-grpo-masked and the Sudoku comparisons: "
                        "start no run after this UTC clock time (HH:MM, its occurrence nearest to now: 00:55 given at 23:20 is "
                        "the coming night's); the report uses the seeds that finished")
    parser.add_argument("--smoke", action="store_true", help="2 rollouts per arm, 16 test puzzles, a "
                        "20-step base (plumbing check)")


def run(args: argparse.Namespace) -> int:
    from mmrl.tiny_world.reasoning_rl import COMPARISONS as REASONING, run_reasoning_comparison

    if args.base is not None and args.name not in REASONING and args.name not in COMPARISONS \
            and args.name not in ("gcpo-vs-grpo", "gcpo-vs-grpo-lr", "gcpo-vs-grpo-vqa"):
        raise SystemExit(f"--base applies to gcpo-vs-grpo, gcpo-vs-grpo-vqa, the Countdown comparisons "
                         f"{sorted(REASONING)} and the Sudoku comparisons {sorted(COMPARISONS)}, not {args.name!r}")
    if args.base is not None and args.name in COMPARISONS and args.base not in SUDOKU_BASES:
        raise SystemExit(f"{args.name} --base must be one of {list(SUDOKU_BASES)}, got {args.base!r}")
    if args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    if args.import_results is not None and args.name not in REASONING and args.name not in COMPARISONS:
        raise SystemExit(f"--import-results applies to the Countdown comparisons {sorted(REASONING)} and the Sudoku "
                         f"comparisons {sorted(COMPARISONS)}, not {args.name!r}")
    if args.import_results is not None and not Path(args.import_results).is_file():
        raise SystemExit(f"--import-results {args.import_results!r}: no such file (an earlier report's results.json)")
    if args.cutoff is not None and args.name not in ("gcpo-vs-grpo-vqa", "dmpo-vs-grpo-masked") and args.name not in COMPARISONS:
        raise SystemExit(f"--cutoff applies to gcpo-vs-grpo-vqa, dmpo-vs-grpo-masked and the Sudoku comparisons only, "
                         f"not {args.name!r}")
    if args.lr is not None and args.name != "gcpo-vs-grpo" and args.name not in COMPARISONS:
        raise SystemExit(f"--lr applies to gcpo-vs-grpo and the Sudoku comparisons {sorted(COMPARISONS)}, not {args.name!r}")
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
    if args.name == "gcpo-vs-grpo-vqa":
        from mmrl.tiny_world.vqa_rl import BASE, run_gcpo_vs_grpo_vqa

        try:
            run_gcpo_vs_grpo_vqa(args.out, seeds=args.seeds, smoke=args.smoke, steps=args.steps,
                                 baselines=not args.no_baselines, only=args.arm, resume=args.resume,
                                 report_only=args.report_only, cutoff=args.cutoff, base=args.base or BASE)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        return 0
    masked_arms = args.name == "dmpo-vs-grpo-masked" and not (args.resume or args.report_only)  # takes --arm only
    if (args.arm or args.resume or args.report_only) and args.name not in REASONING and not masked_arms \
            and args.name not in COMPARISONS:
        raise SystemExit(f"--arm, --resume and --report-only apply to the Countdown comparisons {sorted(REASONING)} "
                         f"and the Sudoku comparisons {sorted(COMPARISONS)}, not {args.name!r}")
    if args.name in REASONING:
        try:
            run_reasoning_comparison(args.name, args.out, seeds=args.seeds, smoke=args.smoke, rollouts=args.rollouts,
                                     base=args.base, baselines=not args.no_baselines, arms=args.arm, resume=args.resume,
                                     report_only=args.report_only, stored=args.import_results)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        return 0
    if args.name in RUNNERS:
        import importlib

        module, func = RUNNERS[args.name].split(":")
        kw = ({"cutoff": args.cutoff, "n_samples": args.n_samples, "arms": args.arm, "baselines": not args.no_baselines}
              if args.name == "dmpo-vs-grpo-masked" else {})
        try:
            getattr(importlib.import_module(module), func)(args.out, seeds=args.seeds, smoke=args.smoke, steps=args.steps, **kw)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        return 0
    try:
        run_comparison(args.name, args.out, seeds=args.seeds, rollouts=args.rollouts, smoke=args.smoke,
                       baselines=not args.no_baselines, cutoff=args.cutoff, arms=args.arm, resume=args.resume,
                       report_only=args.report_only, base=args.base or "sudoku4", lr=args.lr, stored=args.import_results)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    return 0
