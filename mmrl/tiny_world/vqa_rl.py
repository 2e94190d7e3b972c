"""Visual question answering RL on the shapes world: GCPO vs GRPO on the tiny Qwen2.5-VL (`mmrl replicate
gcpo-vs-grpo-vqa`).

Both arms start from the cached `shapes-vqa` base (`mmrl pretrain-tiny shapes-vqa`, pre-trained on 30% wrong
answers, so it is partly right and its samples spread over answers; `--base` picks another shapes_vqa base, e.g.
`shapes-vqa-reads`, the one that beats the majority answer on every question type), train on the `shapes_vqa` training rows with
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
import logging
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.tiny_world.report import cutoff_time

logger = logging.getLogger(__name__)

NAME = "gcpo-vs-grpo-vqa"
"""The comparison's name (`mmrl replicate NAME`, the output folder)."""
BASE = "shapes-vqa"
"""The tiny-world base model both arms start from by default (`base=` / `--base`: another of `vqa_bases()`)."""

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
RFT_ARM, SFT_ARM = "RFT", "clean SFT"
"""The baseline rows: rejection-sampling fine-tuning at the RL arms' rollouts (`mmrl.tiny_world.rft`: the base's own
right answers among 60 x 8 questions x 8 samples, one AdamW step per rollout batch at the arms' lr), and supervised
fine-tuning of the base on the training questions' true answers at the same optimizer steps and answers per step
(60 steps of 64 rows, `vlm_sft`, lr 3e-4: the labels RL's reward is computed from, given directly)."""
ROWS = (*ARMS, RFT_ARM, SFT_ARM)
"""Every trained row, in the order one seed runs them (seed-major)."""

SMOKE = {"max_steps": 2, "eval_steps": 1, "per_device_train_batch_size": 16, "save_steps": 2}
"""`smoke=True`: two small steps per arm (CI plumbing check)."""

CURVE_PER_TYPE = 40
"""Validation rows per question type in the evaluations during training (the final one uses every test row)."""
PASS_K = 8
"""k of the base model's sampled pass@k diagnostic (the group size)."""
EVAL_GENERATION = {"temperature": 1.0, "top_k": 1}
"""Held-out answers are greedy (d1's evaluation decoding for autoregressive models)."""


def vqa_bases() -> list[str]:
    """The tiny-world bases pre-trained on shapes_vqa (the ones this comparison can start from)."""
    from mmrl.tiny_world.models import TINY_MODELS

    return sorted(name for name, spec in TINY_MODELS.items() if spec.task == "shapes_vqa")


def check_vqa_base(name: str) -> str:
    """`name` if it is one of `vqa_bases()`, else a one-line ValueError naming it and the bases allowed."""
    if name not in vqa_bases():
        raise ValueError(f"base must be a shapes_vqa base, one of {vqa_bases()}, got {name!r}")
    return name


def vqa_base_option(name: str) -> str:
    """`check_vqa_base` as an argparse `type=`: a bad `--base` is refused by the parser, before any work."""
    import argparse

    try:
        return check_vqa_base(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def arm_config(arm: str, *, seed: int, out: Path, smoke: bool = False, steps: int | None = None,
               base: str = BASE) -> dict[str, Any]:
    """The training config of one RL arm at one seed (the presets `VQA_RL`, the arm's overrides, the base)."""
    cfg = {**VQA_RL, **ARMS[arm], "seed": seed, "output_dir": str(out), "progress_bar": False,
           "model_name_or_path": f"tiny-world:{base}"}
    if smoke:  # the smoke base (`SMOKE_BASE_STEPS` steps, its own cache folder): --smoke checks the pipeline
        from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir

        cfg.update(SMOKE, model_name_or_path=str(model_dir(base, SMOKE_BASE_STEPS)))
    if steps is not None:
        cfg.update(max_steps=steps, eval_steps=max(1, steps // 6), save_steps=steps)
    return cfg


def balanced_rows(rows: Sequence[dict], per_type: int) -> list[dict]:
    """The first `per_type` rows of every question type, type by type."""
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES

    return [r for t in QUESTION_TYPES for r in [r for r in rows if r["qtype"] == t][:per_type]]


def per_type_accuracy(rows: Sequence[dict], scores: Sequence[float]) -> dict[str, float]:
    """Accuracy per question type (the task's types in their order, then any pre-training-only type present) and
    `overall`, the mean over all rows."""
    from mmrl.tiny_world.shapes_vqa import AUX_QUESTION_TYPES, QUESTION_TYPES

    acc: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(rows, scores):
        acc[r["qtype"]].append(float(s))
    out = {t: sum(v) / len(v) for t in QUESTION_TYPES + AUX_QUESTION_TYPES if (v := acc.get(t))}
    out["overall"] = sum(float(s) for s in scores) / max(1, len(scores))
    return out


def majority_answers(rows: Sequence[dict]) -> dict[str, str]:
    """question type -> its most frequent answer in `rows` (the training split: the prior a model that ignores the
    image would answer; ties broken by the answer's text)."""
    from collections import Counter

    counts: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        counts[r["qtype"]][r["answer"]] += 1
    return {t: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for t, c in counts.items()}


CHANCE = {"count": None, "colour": 1 / 7, "shape": 1 / 3, "position": 1 / 2}
"""Accuracy of a uniform guess over a type's answers (count: None, its 5 answers are far from equally likely)."""


def base_reading(rows: Sequence[dict], scores: Sequence[float], majority: dict[str, str]) -> dict[str, dict]:
    """Per question type (and overall): the accuracy of `scores` (0 / 1 per row) with its 95% bootstrap interval over
    rows, the accuracy of always answering the type's `majority` answer on the same rows, and the paired interval
    of the difference (accuracy - majority): whether the model answers better than the prior, i.e. reads the image."""
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES
    from mmrl.tiny_world.stats import difference_interval, mean_interval

    out = {}
    for t in [t for t in QUESTION_TYPES if any(r["qtype"] == t for r in rows)] + ["overall"]:
        idx = [i for i, r in enumerate(rows) if t == "overall" or r["qtype"] == t]
        x = [float(scores[i]) for i in idx]
        maj = [float(rows[i]["answer"] == majority.get(rows[i]["qtype"])) for i in idx]
        out[t] = {"rows": len(idx), "accuracy": mean_interval(x).to_dict(), "majority": sum(maj) / len(maj),
                  "majority_answer": majority.get(t), "chance": CHANCE.get(t),
                  "minus_majority": difference_interval(x, maj).to_dict()}
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


def _past(cutoff: str | None) -> bool:
    """Whether the UTC clock time `cutoff` ("HH:MM", its occurrence nearest to now: `report.cutoff_time`) has passed."""
    return cutoff is not None and time.time() >= cutoff_time(cutoff)


def run_gcpo_vs_grpo_vqa(out: str | Path = "runs/replicate", seeds: int = 5, smoke: bool = False, steps: int | None = None,
                         progress: bool = True, baselines: bool = True, only: Sequence[str] | None = None,
                         resume: bool = False, report_only: bool = False, cutoff: str | None = None,
                         base: str = BASE) -> dict[str, Any]:
    """GRPO vs GCPO on the shapes_vqa base `base` (default `shapes-vqa`; one of `vqa_bases()`) under the evaluation
    protocol; returns the results dict also written to `<out>/gcpo-vs-grpo-vqa/results.json`.

    The base is measured on the validation split (per-type accuracy against chance and the majority answer,
    `base_reading`; sampled pass@1 / pass@8) and once on the test split. Every run (`ROWS`: GRPO, GCPO, and with
    `baselines` RFT and clean SFT; `only` restricts them) trains from the base, draws its curves on validation
    (`CURVE_PER_TYPE` rows per type) and is scored once on every test row; per-question scores go to
    `runs/<row>-seed<k>/result.json` and results.json. Runs go seed-major; `resume` keeps the saved runs, `cutoff`
    ("HH:MM" UTC) starts no run after that time, `report_only` runs nothing. The report uses, per row, the seeds
    that finished (`n_seeds` says how many) with paired bootstrap 95% intervals (`mmrl.tiny_world.stats`)."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.tiny_world.rft import rejection_sampling_ft
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES
    from mmrl.tiny_world.stats import difference_interval, mean_interval
    from mmrl.tiny_world.vlm_pretrain import vlm_sft
    from mmrl.training.trainer import Trainer

    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be an integer >= 1 or None, got {steps!r}")
    rows_run = [r for r in ROWS if baselines or r in ARMS]
    if only is not None:
        if bad := [a for a in only if a not in ROWS]:
            raise ValueError(f"only= must name rows among {list(ROWS)}, got {bad}")
        rows_run = [r for r in rows_run if r in only]
    if cutoff is not None:
        cutoff_time(cutoff)
    base_name = check_vqa_base(base)
    say = logger.info if progress else (lambda *a, **k: None)
    root = Path(out) / NAME
    if root.exists() and not (resume or report_only):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    base_file = root / "base.json"
    saved_base = json.loads(base_file.read_text()) if base_file.is_file() else None
    if saved_base is not None and saved_base.get("model", BASE) != base_name:  # before a build of the wrong base
        raise ValueError(f"{base_file} was scored on base {saved_base.get('model', BASE)}, not on {base_name}: "
                         f"another --out, or no --resume / --report-only")
    t_all = time.perf_counter()
    base_steps = SMOKE_BASE_STEPS if smoke else None  # --smoke never builds the full base
    ensure_built(base_name, progress=progress, steps=base_steps)
    from mmrl.tiny_world import register
    from mmrl.tiny_world.reasoning_rl import build_digest

    register()  # the tiny world's tasks and rewards
    task = load_task("shapes_vqa")
    test = balanced_rows(task.test, 2) if smoke else task.test
    val = balanced_rows(task.validation, 2) if smoke else task.validation
    curve_rows = balanced_rows(task.validation, 1 if smoke else CURVE_PER_TYPE)  # curves on validation; test once per run
    majority = majority_answers(task.train)
    digest = build_digest(base_name, base_steps)
    if saved_base is not None:
        base = saved_base  # a base.json from before the "model" and "weights_sha256" fields: shapes-vqa, unchecked
        if base.get("weights_sha256") and digest and base["weights_sha256"] != digest:
            raise ValueError(f"{base_file} was scored on build {base['weights_sha256'][:12]} of {base_name}, the cached "
                             f"build is {digest[:12]}: another --out, or no --resume / --report-only")
    else:
        base_policy = load_base_policy(base_name, progress=False, steps=base_steps)
        val_acc, val_items = vqa_items(base_policy, val)
        test_acc, test_items = vqa_items(base_policy, test)
        base = {"model": base_name, "weights_sha256": digest,
                "validation": base_reading(val, val_items, majority), "validation_items": val_items,
                "validation_pass_at_k": pass_at_k(base_policy, val), "test": test_acc, "test_items": test_items,
                "curve_level": vqa_accuracy(base_policy, curve_rows)["overall"]}
        base_file.write_text(json.dumps(base, indent=1))
    for t, r in base["validation"].items():
        a = r["accuracy"]
        say(f"[{NAME}] base, validation {t}: {a['estimate']:.3f} [{a['low']:.3f}, {a['high']:.3f}], majority {r['majority']:.3f}")
    rl_steps = steps if steps is not None else (SMOKE["max_steps"] if smoke else VQA_RL["max_steps"])
    shape = load_config(None, arm_config("GRPO", seed=0, out=root, smoke=smoke, steps=steps, base=base_name))
    q_per_step, group = shape.prompts_per_rollout, shape.num_generations

    def one_run(row: str, seed: int, run_dir: Path) -> dict[str, Any]:
        """Train one row at one seed from the base, score every test row once; the saved result."""
        if run_dir.exists():
            shutil.rmtree(run_dir)  # an unfinished run of an earlier, stopped call
        policy = load_base_policy(base_name, progress=False, steps=base_steps)
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if row == RFT_ARM:
            rft = rejection_sampling_ft(policy, task.train, "shapes_vqa", rollouts=rl_steps, prompts_per_rollout=q_per_step,
                                        group_size=group, lr=shape.learning_rate, seed=seed,
                                        generation={"temperature": shape.temperature, "top_k": 0})
            extra = {"rft_accepted": sum(rft["accepted"]), "rollouts": rft["sampled"]}
        elif row == SFT_ARM:
            hist = vlm_sft(policy, [r["prompt"] for r in task.train], [r["answer"] for r in task.train], steps=rl_steps,
                           batch_size=q_per_step * group, lr=shape.learning_rate, seed=seed, progress=False)
            extra = {"loss_first_last": [hist[0]["loss"], hist[-1]["loss"]]}
        else:
            cfg = load_config(None, arm_config(row, seed=seed, out=run_dir, smoke=smoke, steps=steps, base=base_name))
            Trainer(cfg, policy=policy, dataset=task.train, eval_dataset=curve_rows, eval_metric="shapes_vqa").train()
        secs = time.perf_counter() - t0
        after, items = vqa_items(policy, test)
        run_dir.mkdir(parents=True, exist_ok=True)
        res = {"row": row, "seed": seed, "after": after, "items": items, "train_seconds": secs, **extra}
        (run_dir / "result.json").write_text(json.dumps(res))
        say(f"[{NAME}] {row}, seed {seed + 1}/{seeds}: test " + "  ".join(f"{k} {v:.3f}" for k, v in after.items())
            + f" ({secs:.0f} s)")
        return res

    def run_dir_of(row: str, seed: int) -> Path:
        return root / "runs" / f"{row.lower().replace(' ', '-')}-seed{seed}"

    results_of: dict[str, list[dict]] = {r: [] for r in rows_run}
    stopped = None
    for seed in range(seeds):
        for row in rows_run:
            run_dir = run_dir_of(row, seed)
            saved = run_dir / "result.json"
            if saved.is_file() and (resume or report_only):
                results_of[row].append(json.loads(saved.read_text()))
                continue
            if report_only:
                continue
            if _past(cutoff):
                stopped = stopped or f"cut-off {cutoff} UTC reached before {row} seed {seed}"
                continue
            results_of[row].append(one_run(row, seed, run_dir))
    if stopped:
        say(f"[{NAME}] {stopped}: the report uses the seeds that finished")
    for row in results_of:
        for r in results_of[row]:
            run_dir = run_dir_of(row, r["seed"])
            r["records"] = read_metrics(run_dir) if row in ARMS and (run_dir / "metrics.jsonl").exists() else []
    done = {row: runs for row, runs in results_of.items() if runs}
    # ---- report
    base_items = base["test_items"]
    maj_items = [float(r["answer"] == majority[r["qtype"]]) for r in test]
    types = [t for t in QUESTION_TYPES if any(r["qtype"] == t for r in test)]
    idx_of = {t: [i for i, r in enumerate(test) if r["qtype"] == t] for t in types}
    pick = lambda items, t: [items[i] for i in idx_of[t]]  # noqa: E731

    def row_cells(mat: list[list[float]]) -> list[str]:
        return [fmt(sum(sum(pick(m, t)) / len(idx_of[t]) for m in mat) / len(mat)) for t in types] + [
            mean_interval(mat).fmt()]

    header = ["row", "seeds", *types, "overall [95% CI]", "gain over base (points) [95% CI]"]
    table_rows = [["base (greedy)", "-", *row_cells([base_items]), "-"],
                  [f"majority answer per type ({', '.join(majority[t] for t in types)})", "-", *row_cells([maj_items]), "-"]]
    gains = {}
    for row, runs in done.items():
        mat = [r["items"] for r in runs]
        gains[row] = difference_interval(mat, [base_items])
        table_rows.append([row, str(len(runs)), *row_cells(mat), gains[row].fmt(signed=True)])
    table = markdown_table(header, table_rows)
    diffs = {}
    pairs = [("GCPO", "GRPO"), ("GRPO", RFT_ARM), ("GCPO", RFT_ARM), ("GRPO", SFT_ARM), ("GCPO", SFT_ARM)]
    for a, b in pairs:
        if a in done and b in done:
            diffs[f"{a} - {b}"] = difference_interval([r["items"] for r in done[a]], [r["items"] for r in done[b]])
    if "GCPO" in done and "GRPO" in done:
        for t in types:
            diffs[f"GCPO - GRPO, {t}"] = difference_interval([pick(r["items"], t) for r in done["GCPO"]],
                                                             [pick(r["items"], t) for r in done["GRPO"]])
    for row, runs in done.items():
        for t in ("count", "position"):
            if t in idx_of:
                diffs[f"{row} - majority answer, {t}"] = difference_interval([pick(r["items"], t) for r in runs],
                                                                             [pick(maj_items, t)])
    if diffs:
        table += "\n\n" + markdown_table(["difference, test accuracy (points)", "estimate [95% CI]", "claimed (interval excludes 0)"],
                                          [[k, v.fmt(signed=True), "yes" if v.excludes_zero else "no"] for k, v in diffs.items()])
    secs = {row: mean_std([r["train_seconds"] for r in runs])[0] for row, runs in done.items()}
    rl_done = {a: runs for a, runs in done.items() if a in ARMS and runs[0]["records"]}
    if rl_done:
        plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in rl_done.items()}, root / "accuracy.png",
                    title=f"validation shapes VQA accuracy (greedy, {len(curve_rows)} questions)", ylabel="accuracy",
                    baseline=base["curve_level"])
        plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in rl_done.items()}, root / "reward.png",
                    title="training reward (exact match, sampled at T=1)", ylabel="reward")
    total = time.perf_counter() - t_all
    results = {"name": NAME, "base": base_name, "base_weights_sha256": base.get("weights_sha256"), "protocol": "base read on validation; curves on validation; test once per run; "
               "paired bootstrap 95% CI over test questions and seeds", "base_measures": base, "majority": majority,
               "majority_items": maj_items, "test_qtypes": [r["qtype"] for r in test], "test_answers": [r["answer"] for r in test],
               "gains": {a: iv.to_dict() for a, iv in gains.items()}, "differences": {k: v.to_dict() for k, v in diffs.items()},
               "seeds": seeds, "seeds_done": {row: len(runs) for row, runs in done.items()}, "stopped": stopped,
               "seconds": total, "seconds_per_run": secs, "smoke": smoke, "test_rows": len(test), "task_info": task.info,
               "table": table, "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in done.items()},
               "configs": {a: arm_config(a, seed=0, out=Path("."), smoke=smoke, steps=steps, base=base_name) for a in ARMS}}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\nBase `{base_name}` (weights {str(base.get('weights_sha256'))[:12]}). "
                                   f"Seeds finished per row: {results['seeds_done']} (of {seeds}); "
                                   f"{len(test)} test questions (greedy answers, exact match), {total:.0f} s in this call."
                                   + (f" {stopped}." if stopped else "") + "\n")
    say("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results
