"""Validation screen of `dllm-countdown3`'s reuse arms (docs/RESULTS.md, "DMPO reuse F > 1 without negative weights"):
each named arm trained from the cached base at one seed for ROLLOUTS rollout batches, validation only (the trainer's
curve: one sampled answer per row on the comparison's validation rows, every ROLLOUTS / POINTS rollout batches, plus
the base's point at step 0 with the same seeds); the test split is never scored. One `metrics.jsonl` per arm under
OUT/<run>/ and a summary line per arm in OUT/screen.jsonl.

    MMRL_CACHE=/work/cache python scripts/studies/dllm_reuse_screen.py OUT ROLLOUTS POINTS SEED ARM_CONSTANT ...
    (e.g. /work/runs/reuse/screen 10 5 0 DMPO_CORRECT_ONLY_F4 DMPO_CORRECT_ONLY_F8 DMPO_CORRECT_ONLY_F8_TR)
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from types import SimpleNamespace


def main(out: str, rollouts: int, points: int, seed: int, arm_names: list[str]) -> None:
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import reasoning_rl as rr
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import load_base_policy
    from mmrl.training.evaluate import evaluate_during_training
    from mmrl.training.trainer import Trainer

    register()
    name = "dllm-countdown3"
    recipe = rr.COMPARISONS[name]["recipe"]
    base = recipe["model_name_or_path"].split(":", 1)[1]
    task = load_task(recipe["task"])
    val_rows = task.validation[: recipe["eval_limit"]]
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for const in arm_names:
        arm = getattr(rr, const) if hasattr(rr, const) else const
        run_dir = root / rr.run_slug(arm, seed)
        if (run_dir / "done.json").exists():
            continue
        cfg = load_config(None, rr.arm_config(name, arm, seed=seed, out=run_dir, rollouts=rollouts, curve_points=points))
        policy = load_base_policy(base, progress=False)
        v0 = evaluate_during_training(policy, val_rows, task.metric, cfg, SimpleNamespace(device="cpu"), 0, 1)
        t0 = time.perf_counter()
        Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs, eval_dataset=val_rows,
                eval_metric=task.metric).train()
        secs = time.perf_counter() - t0
        recs = read_metrics(run_dir)
        val = [(r["step"], r["eval/accuracy"]) for r in recs if "eval/accuracy" in r]
        kl = [r.get("diag/kl_k3", float("nan")) for r in recs]
        summary = {"arm": arm, "seed": seed, "rollouts": rollouts, "F": cfg.num_iterations, "seconds": secs,
                   "validation_step0": v0["eval/accuracy"], "validation": val, "kl_k3_max": max(kl),
                   "reward_first": recs[0].get("reward"), "reward_last": recs[-1].get("reward")}
        (run_dir / "done.json").write_text(json.dumps(summary))
        with open(root / "screen.jsonl", "a") as f:
            f.write(json.dumps(summary) + "\n")
        logging.info("%s: %s", arm, json.dumps(summary))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
