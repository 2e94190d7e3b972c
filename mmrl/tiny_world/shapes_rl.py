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

from mmrl.tiny_world.models import SMOKE_BASE_STEPS

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


def run_gcpo_vs_grpo(out: str | Path = "runs/replicate", *, seeds: int = 5, smoke: bool = False, steps: int | None = None,
                     progress: bool = True, n_samples: int | None = None, base: str = "shapes",
                     baselines: bool = True, lr: float | None = None) -> dict[str, Any]:
    """Run both arms over `seeds` from `base`, beside the baselines; returns the results dict also written to
    `<out>/gcpo-vs-grpo[-<base>]/results.json`. `lr` overrides the recipe's learning rate (the value chosen on
    validation by `choose_lr`)."""
    name = "gcpo-vs-grpo" if base == "shapes" else f"gcpo-vs-grpo-{base}"
    recipe = None if lr is None else {**SHAPES_RL, "learning_rate": float(lr)}
    return run_shapes_rl(Path(out) / name, list(ARMS), seeds=seeds, smoke=smoke, steps=steps, progress=progress,
                         n_samples=n_samples, name=name, base=base, baselines=baselines, recipe=recipe)


LR_CHOICES = (2.5e-4, 5e-4)
"""The learning rates `choose_lr` compares (the recipe's 5e-4 and half of it)."""


def choose_lr(out: str | Path = "runs/replicate", *, lrs: tuple[float, ...] = LR_CHOICES, seeds: int = 1,
              base: str = "shapes", smoke: bool = False, steps: int | None = None, progress: bool = True,
              n_samples: int | None = None) -> dict[str, Any]:
    """Choose `gcpo-vs-grpo`'s learning rate on the validation prompts only (`mmrl replicate gcpo-vs-grpo-lr`).

    Both arms train at every lr in `lrs` over `seeds` from `base`, each scored once at the end on all the
    validation prompts (`n_samples` images each; the test prompts are never touched); the chosen lr is the one with
    the highest validation GenEval averaged over the two arms (one recipe for both, so the choice favours neither).
    Writes `<out>/gcpo-vs-grpo-lr[-<base>]/choice.json` and `table.md`; returns the choice dict."""
    from mmrl.tiny_world.report import markdown_table

    if not lrs or any(float(x) <= 0 for x in lrs):
        raise ValueError(f"lrs must be positive learning rates, got {lrs!r}")
    name = "gcpo-vs-grpo-lr" if base == "shapes" else f"gcpo-vs-grpo-lr-{base}"
    root = Path(out) / name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t0 = time.perf_counter()
    figures: dict[str, dict[str, float]] = {}
    base_val = None
    for lr in lrs:
        res = run_shapes_rl(root / f"lr{lr:g}", list(ARMS), seeds=seeds, smoke=smoke, steps=steps, progress=progress,
                            n_samples=n_samples, name=f"{name} lr {lr:g}", base=base, split="validation",
                            recipe={**SHAPES_RL, "learning_rate": float(lr)})
        base_val = res["before"]["overall"]
        per_arm = {a: sum(r["after"]["overall"] for r in runs) / len(runs) for a, runs in res["arms"].items()}
        figures[f"{lr:g}"] = {**per_arm, "mean of the arms": sum(per_arm.values()) / len(per_arm)}
    chosen = max(figures, key=lambda k: figures[k]["mean of the arms"])
    head = ["lr"] + list(next(iter(figures.values())))
    table = markdown_table(head, [[k] + [f"{100 * v:.1f}" for v in row.values()] for k, row in figures.items()])
    table += (f"\n\nValidation GenEval overall (points), base `{base}` {100 * base_val:.1f}; {seeds} seed(s) per arm and lr, "
              f"all validation prompts x {n_samples or 'the default'} images. Chosen: lr {chosen} (highest mean of the arms).\n")
    choice = {"name": name, "split": "validation", "base": base, "seeds": seeds, "lrs": [float(x) for x in lrs],
              "validation_overall": figures, "base_validation_overall": base_val, "chosen_lr": float(chosen),
              "seconds": time.perf_counter() - t0, "smoke": smoke}
    (root / "choice.json").write_text(json.dumps(choice, indent=2))
    (root / "table.md").write_text(table)
    logger.info("\n" + table)
    return choice



CLEAN_REFERENCE = "shapes-clean"
"""The base pre-trained on correct captions at the same compute: the reference of "share of the gap closed"."""

RFT_ARM = "RFT"
"""The rejection-sampling fine-tuning baseline (`mmrl.tiny_world.rft`) at the RL arms' rollouts."""


RFT_REWARD = "geneval"
"""The reward whose 1s RFT keeps by default (the GenEval rule; the Janus comparison's choice)."""


def _rft(policy, cfg, rows: list[dict], reward: str = RFT_REWARD) -> dict[str, Any]:
    """RFT with an RL arm's budget: its rollout batches (prompts x images), sampler, learning rate and seed; the
    images `reward` scores 1 are fitted, by the exact NLL (Janus) or the pre-training loss (masked image tokens,
    `masked_image_nll`)."""
    from mmrl.tiny_world.rft import masked_image_nll, rejection_sampling_ft

    per_rollout = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    loss_fn = masked_image_nll(cfg.seed) if policy.family == "masked_image" else None
    return rejection_sampling_ft(policy, rows, reward, rollouts=cfg.max_steps, prompts_per_rollout=per_rollout // cfg.num_generations,
                                 group_size=cfg.num_generations, lr=cfg.learning_rate, seed=cfg.seed, loss_fn=loss_fn,
                                 generation={"cfg_scale": cfg.cfg_scale, "temperature": cfg.temperature})


def run_order(labels: list[str], seeds: int, *, seed_major: bool = False) -> list[tuple[str, int]]:
    """The (arm, seed) runs in the order they train: arm by arm (every seed of the first arm, then the next), or with
    `seed_major` seed by seed (every arm of seed 0, then of seed 1), so that a cutoff leaves whole seeds."""
    if seed_major:
        return [(a, s) for s in range(seeds) for a in labels]
    return [(a, s) for a in labels for s in range(seeds)]


def training_diagnostics(runs: list[list[dict]], reward_key: str, k: int = 5) -> dict[str, float]:
    """Mean over runs (each a list of per-step metric records) of: the training reward's mean over the first and
    the last `k` logged steps (`reward_first`, `reward_last`), the last logged `diag/kl_k3` (KL to the base,
    nats/token, `kl_last`) and the mean over steps of `diag/neg_weight_frac` (the share of the loss's weight mass
    that is negative). A key a run never logged gives nan."""
    from mmrl.tiny_world.report import curve, mean_std

    def per_run(f) -> float:
        vals = [f(r) for r in runs]
        vals = [v for v in vals if v == v]
        return mean_std(vals)[0]

    def ys(r: list[dict], key: str) -> list[float]:
        return [y for _, y in curve(r, key)]

    def head_tail(r, tail: bool) -> float:
        y = ys(r, reward_key)
        return mean_std(y[-k:] if tail else y[:k])[0]

    return {"reward_first": per_run(lambda r: head_tail(r, False)), "reward_last": per_run(lambda r: head_tail(r, True)),
            "kl_last": per_run(lambda r: (ys(r, "diag/kl_k3") or [float("nan")])[-1]),
            "neg_weight_frac": per_run(lambda r: mean_std(ys(r, "diag/neg_weight_frac"))[0])}


def base_weights_digest(base_dir: str | Path) -> str:
    """The SHA-256 weights digest a tiny base build recorded in its `tiny_spec.json` ("unknown" if absent)."""
    spec = Path(base_dir) / "tiny_spec.json"
    if not spec.is_file():
        return "unknown"
    return str(json.loads(spec.read_text()).get("weights_sha256") or "unknown")


def run_shapes_rl(root: str | Path, arms: list[str], *, seeds: int = 5, smoke: bool = False, steps: int | None = None,
                  progress: bool = True, n_samples: int | None = None, name: str = "shapes-rl", base: str = "shapes",
                  recipe: dict[str, Any] | None = None, arm_table: dict[str, dict[str, Any]] | None = None,
                  eval_generation: dict[str, Any] | None = None, baselines: bool = False,
                  split: str = "test", cutoff: str | None = None, clean_reference: str = CLEAN_REFERENCE,
                  rft_reward: str = RFT_REWARD) -> dict[str, Any]:
    """Train each arm of `arm_table` (default `ARMS`) named in `arms` over `seeds` from the tiny-world base `base`
    with `recipe` (default `SHAPES_RL`) and report into `root` (replaced if it exists).

    The protocol: training curves on the validation prompts (`task.validation`), the test prompts evaluated once per
    run at the end (`shapes_eval.geneval_items`: `n_samples` images per prompt, per-prompt scores in results.json),
    paired-bootstrap 95% intervals over prompts and seeds (`mmrl.tiny_world.stats`, prompts grouped by GenEval
    task) for every gain over the base and for the difference between the first two arms. With `baselines`, the
    table also has the base pre-trained on clean captions at the same compute (`clean_reference`, default
    `CLEAN_REFERENCE`, and each arm's share of the base-to-clean gap), best-of-n from the base (n = `n_samples`, the
    GenEval verifier picking) and rejection-sampling fine-tuning at the arms' rollouts (`RFT_ARM`, over the same
    seeds, keeping the images `rft_reward` scores 1). `split="validation"`
    scores every validation prompt in place of the test prompts (for a choice: `choose_lr`; the test prompts are
    then never evaluated). `cutoff` ("HH:MM" UTC): the runs go seed by seed (every arm of seed 0, then of seed 1,
    ...), none starts after the cutoff, and the report keeps the seeds every arm finished (`seeds_run` in
    results.json; the table names it). The table also has each RL arm's training diagnostics (`training_diagnostics`)
    and the base build's weights digest."""
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.geneval.rules import TASKS
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import ensure_built, load_base_policy
    from mmrl.tiny_world.report import curve, cutoff_time, image_grid, markdown_table, plot_curves
    from mmrl.tiny_world.shapes_eval import N_SAMPLES, PER_TASK, balanced_rows, best_of_n, geneval_items
    from mmrl.tiny_world.stats import difference_interval, gap_closed_interval, mean_interval
    from mmrl.training.trainer import Trainer

    arm_table = arm_table or ARMS
    unknown = sorted(set(arms) - set(arm_table))
    if unknown or not arms:
        raise ValueError(f"unknown arms {unknown or arms}; valid: {list(arm_table)}")
    if int(seeds) < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    if split not in ("test", "validation"):
        raise ValueError(f"split must be 'test' or 'validation', got {split!r}")
    stop_at = cutoff_time(cutoff)
    arm_kw = {"recipe": recipe, "arm_table": arm_table}
    say = print if progress else (lambda *a, **k: None)
    n_samples = n_samples or (1 if smoke else N_SAMPLES)
    curve_per_task = 4 if smoke else PER_TASK // 4  # the trainer's evaluations during training (validation curves)
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t_all = time.perf_counter()
    register()  # the tiny world's tasks and rewards
    base_steps = SMOKE_BASE_STEPS if smoke else None
    t0 = time.perf_counter()
    base_dir = ensure_built(base, progress=progress, steps=base_steps)
    build_s = time.perf_counter() - t0
    base_digest = base_weights_digest(base_dir)
    say(f"base {base}: weights digest {base_digest[:12]}")
    task = load_task("shapes")
    scored = task.test if split == "test" else task.validation
    test = scored[:: max(1, len(scored) // 24)] if smoke else scored  # once per run, at the end
    val_rows = balanced_rows(task.validation, curve_per_task)  # the curves and every choice
    eval_gen = dict(eval_generation or {})

    def test_items(policy) -> dict[str, Any]:
        return geneval_items(policy, test, n_samples=n_samples, **eval_gen)

    base_policy = load_base_policy(base, progress=False, steps=base_steps)
    before = test_items(base_policy)
    say(f"base model, {split} GenEval: " + "  ".join(f"{k} {v:.3f}" for k, v in before["per_task"].items()))
    reference = None
    if baselines:
        ensure_built(clean_reference, progress=progress, steps=base_steps)
        reference = test_items(load_base_policy(clean_reference, progress=False, steps=base_steps))
        say(f"clean-caption base, {split} GenEval: " + "  ".join(f"{k} {v:.3f}" for k, v in reference["per_task"].items()))
    grid_rows = _grid_rows(test)
    grid_images = {"base": _images(base_policy, grid_rows, eval_gen)}
    by_arm: dict[str, list[dict]] = {}
    labels = list(arms) + ([RFT_ARM] if baselines else [])
    stopped = False
    for arm, seed in run_order(labels, seeds, seed_major=stop_at is not None):
        if stop_at is not None and time.time() > stop_at:
            say(f"[{name}] cutoff {cutoff} UTC passed: no run starts after it ({arm}, seed {seed} not run)")
            stopped = True
            break
        run_dir = root / "runs" / f"{re.sub(r'[^a-z0-9]+', '_', arm.lower())}-seed{seed}"
        cfg_arm = arm if arm != RFT_ARM else arms[0]  # RFT takes the first RL arm's budget and sampler
        cfg = load_config(None, arm_config(cfg_arm, seed=seed, out=run_dir, smoke=smoke, steps=steps, **arm_kw))
        say(f"[{name}] {arm}, seed {seed + 1}/{seeds}: {cfg.max_steps} rollout batches of "
            f"{cfg.prompts_per_rollout} prompts x {cfg.num_generations} images")
        policy = load_base_policy(base, progress=False, steps=base_steps)
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if arm == RFT_ARM:
            extra["rft"] = _rft(policy, cfg, task.train, rft_reward)
            records: list[dict] = []
        else:
            Trainer(cfg, policy=policy, dataset=task.train, eval_dataset=val_rows, eval_metric="geneval").train()
            records = read_metrics(run_dir)
        train_s = time.perf_counter() - t0
        after = test_items(policy)
        val_curve = curve(records, "eval/accuracy")
        by_arm.setdefault(arm, []).append({"seed": seed, "after": after["per_task"], "items": after["scores"],
                                         "validation_last": val_curve[-1][1] if val_curve else None,
                                         "train_seconds": train_s, "records": records, **extra})
        if seed == 0:
            grid_images[arm] = _images(policy, grid_rows, eval_gen)
        say(f"      {split} overall {after['per_task']['overall']:.3f} (base {before['per_task']['overall']:.3f}), {train_s:.0f} s")
    seeds_run = min((len(by_arm.get(a, [])) for a in labels), default=0)
    if seeds_run < 1:
        raise RuntimeError(f"[{name}] no seed finished for every arm before the cutoff {cutoff} UTC")
    by_arm = {a: runs[:seeds_run] for a, runs in by_arm.items()}  # the seeds every arm finished
    # ---- intervals (paired over prompts, grouped by GenEval task; seeds resampled per arm)
    groups = before["tags"]
    base_m = [before["scores"]]
    iv = lambda f, *a: f(*a, groups=groups)  # noqa: E731
    rows_out: dict[str, dict[str, Any]] = {"base": {"per_task": before["per_task"], "overall": iv(mean_interval, base_m)}}
    if baselines:
        bon = best_of_n(before)
        rows_out[f"best-of-{n_samples} (base)"] = {"per_task": bon["per_task"], "overall": iv(mean_interval, [bon["scores"]]),
                                                   "gain": iv(difference_interval, [bon["scores"]], base_m)}
        rows_out["clean-caption base (same compute)"] = {"per_task": reference["per_task"],
                                                         "overall": iv(mean_interval, [reference["scores"]]),
                                                         "gain": iv(difference_interval, [reference["scores"]], base_m)}
    for arm, runs in by_arm.items():
        m = [r["items"] for r in runs]
        per_task = {k: sum(r["after"][k] for r in runs) / len(runs) for k in runs[0]["after"]}
        row = {"per_task": per_task, "overall": iv(mean_interval, m), "gain": iv(difference_interval, m, base_m)}
        if baselines:
            ref = [reference["scores"]]
            row["vs clean base"] = iv(difference_interval, m, ref)
            if reference["per_task"]["overall"] != before["per_task"]["overall"]:
                row["gap closed"] = iv(gap_closed_interval, m, base_m, ref)
        rows_out[arm] = row
    # per task, and over the five compositional tasks (single_object names one shape: nothing is held out there)
    def restrict(m, keep):
        return [[row[i] for i in keep] for row in m]

    task_gains: dict[str, dict[str, Any]] = {}
    comp = [i for i, t in enumerate(groups) if t != "single_object"]
    for arm, runs in by_arm.items():
        m = [r["items"] for r in runs]
        gains = {t: difference_interval(restrict(m, k), restrict(base_m, k))
                 for t in TASKS if (k := [i for i, g in enumerate(groups) if g == t])}
        if comp:
            gains["compositional (5 tasks)"] = difference_interval(restrict(m, comp), restrict(base_m, comp),
                                                                   groups=[groups[i] for i in comp])
        task_gains[arm] = gains
    differences = {}
    rl = [a for a in by_arm if a != RFT_ARM]
    pairs = [(rl[1], rl[0])] if len(rl) > 1 else []
    if baselines:
        pairs += [(a, RFT_ARM) for a in rl]
    for a, b in pairs:
        differences[f"{a} - {b}"] = iv(difference_interval, [r["items"] for r in by_arm[a]], [r["items"] for r in by_arm[b]])
    # ---- report
    head = ["model"] + list(TASKS) + ["overall [95% CI]", "gain vs base (points) [95% CI]"]
    if baselines:
        head += ["vs clean-caption base [95% CI]", "share of the gap closed [95% CI]"]
    table_rows = []
    for label, row in rows_out.items():
        shown = label if label in ("base",) or label.startswith(("best-of", "clean")) else f"{label} ({seeds_run} seed{'s' if seeds_run > 1 else ''})"
        cells = [shown] + [f"{100 * row['per_task'].get(t, float('nan')):.1f}" for t in TASKS] + [row["overall"].fmt()]
        cells.append(row["gain"].fmt(signed=True) if "gain" in row else "-")
        if baselines:
            cells.append(row["vs clean base"].fmt(signed=True) if "vs clean base" in row else "-")
            cells.append(row["gap closed"].fmt(scale=1.0, digits=2) if "gap closed" in row else "-")
        table_rows.append(cells)
    table = markdown_table(head, table_rows)
    if differences:
        table += "\n\n" + markdown_table(["difference (points)", "estimate [95% CI]", "claimed (interval excludes 0)"],
                                          [[k, v.fmt(signed=True), "yes" if v.excludes_zero else "no"] for k, v in differences.items()])
    reward_key = f"rewards/{(recipe or SHAPES_RL)['reward_funcs'][0]}/mean"
    diagnostics = {a: training_diagnostics([r["records"] for r in runs], reward_key) for a, runs in by_arm.items()
                   if a != RFT_ARM}
    diagnostics = {a: {**d, "train_seconds": sum(r["train_seconds"] for r in by_arm[a]) / len(by_arm[a])}
                   for a, d in diagnostics.items()}
    table += "\n\n" + markdown_table(
        ["training diagnostics (mean over seeds)", "training reward, first / last 5 steps", "KL to the base (k3, nats/token, last step)",
         "negative weight share (mean over steps)", "train seconds per run"],
        [[a, f"{d['reward_first']:.3f} / {d['reward_last']:.3f}", f"{d['kl_last']:.4f}", f"{d['neg_weight_frac']:.3f}",
          f"{d['train_seconds']:.0f}"] for a, d in diagnostics.items()])
    gain_keys = list(next(iter(task_gains.values())))
    table += "\n\n" + markdown_table(["gain vs base by task (points) [95% CI]"] + gain_keys,
                                      [[a] + [g[k].fmt(signed=True) for k in gain_keys] for a, g in task_gains.items()])
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in by_arm.items() if a != RFT_ARM},
                root / "accuracy.png", title="validation GenEval (shapes), mean over the six tasks", ylabel="accuracy")
    plot_curves({a: [curve(r["records"], "reward", smooth=5) for r in runs] for a, runs in by_arm.items() if a != RFT_ARM},
                root / "reward.png", title="training reward (GenEval strict)", ylabel="reward")
    titles, images = [], []
    for label, ims in grid_images.items():
        images += ims
        titles += [f"{label}: {r['prompt'].removeprefix('a photo of ')}" for r in grid_rows]
    image_grid(images, titles, root / "grid.png", cols=len(grid_rows))
    credit = sorted((root / "runs" / "gcpo-seed0" / "credit").glob("*.png"))
    if credit:
        shutil.copy(credit[-1], root / "credit.png")
    total = time.perf_counter() - t_all
    results = {"name": name, "protocol": "curves on validation, test once per run; paired bootstrap 95% CI over prompts "
                                         "(grouped by GenEval task) and seeds",
               "split": split, "base": base, "base_weights_sha256": base_digest, "seeds": seeds, "seeds_run": seeds_run,
               "cutoff": cutoff, "stopped_at_cutoff": stopped, "diagnostics": diagnostics, "seconds": total, "smoke": smoke, "build_seconds": build_s, "model": str(base_dir),
               "n_samples": n_samples, "table": table, "eval_generation": eval_gen,
               "test_prompts": before["prompts"], "test_tags": groups,
               "before": before["per_task"], "before_items": before["scores"], "before_samples": before["samples"],
               "reference": None if reference is None else {"model": clean_reference, "per_task": reference["per_task"],
                                                            "items": reference["scores"]},
               "rows": {k: {x: (v.to_dict() if hasattr(v, "to_dict") else v) for x, v in row.items()} for k, row in rows_out.items()},
               "differences": {k: v.to_dict() for k, v in differences.items()},
               "task_gains": {a: {k: v.to_dict() for k, v in g.items()} for a, g in task_gains.items()},
               "arms": {a: [{k: v for k, v in r.items() if k != "records"} for r in runs] for a, runs in by_arm.items()},
               "configs": {a: arm_config(a, seed=0, out=Path("."), smoke=smoke, steps=steps, **arm_kw) for a in arms},
               "grid_prompts": [r["prompt"] for r in grid_rows]}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    ran = f"{seeds_run} seeds per arm" + (f" ({seeds} planned, cutoff {cutoff} UTC)" if seeds_run < seeds else "")
    (root / "table.md").write_text(table + f"\n\nBase `{base}` (weights digest {base_digest[:12]}), {ran}, {len(test)} "
                                   f"{split} prompts x {n_samples} images, {total:.0f} s in all.\n")
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results
