"""Study (docs/RESULTS.md, "RL on a Sudoku base with headroom"): one arm of a Sudoku comparison trained exactly as
`mmrl replicate NAME --base BASE` trains it, scored on the **validation** puzzles only, every `EVERY` rollout
batches: the pilot that chooses a comparison's budget without reading the test split.

    OMP_NUM_THREADS=1 python scripts/studies/sudoku_rl_pilot.py OUT dmpo-vs-d1 "diffu-grpo (d1), F=1" \\
        --base sudoku4-mid --rollouts 60 --every 10 --seed 0 --lr 3e-5

Writes OUT/curve.json: the arm's config, the base's validation cell accuracy and its per-puzzle scores, and one
point per evaluation (rollout batch, validation cell accuracy, per-puzzle scores), plus the training metrics log.
"""
import argparse
import json
import logging
import random
import shutil
import time
from pathlib import Path

import torch

from mmrl.config.train_config import load_config
from mmrl.core.registry import REWARDS
from mmrl.data.tasks import load_task
from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy
from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE, evaluate_items
from mmrl.tiny_world.replicate import COMPARISONS, SUDOKU_BASES, arm_config
from mmrl.tiny_world.stats import difference_interval
from mmrl.training.trainer import Trainer

logger = logging.getLogger("sudoku_rl_pilot")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("name", choices=sorted(COMPARISONS))
    ap.add_argument("arm")
    ap.add_argument("--base", default="sudoku4", choices=SUDOKU_BASES)
    ap.add_argument("--rollouts", type=int, default=60)
    ap.add_argument("--every", type=int, default=10, help="score the validation puzzles every this many rollout batches")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=None, help="the arm's learning rate (default: the comparison's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another config override, e.g. "
                    "gradient_accumulation_steps=4 (4 micro-batches of 128 answers per optimizer step: 32 puzzles)")
    ap.add_argument("--random-reward", action="store_true", help="the control: train on a reward drawn uniformly at "
                    "random, independent of the answer (the update's noise alone; validation still scores the task)")
    args = ap.parse_args()
    if args.arm not in COMPARISONS[args.name]:
        raise SystemExit(f"unknown arm {args.arm!r} of {args.name}; valid: {list(COMPARISONS[args.name])}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    register()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    task = load_task("sudoku4")
    val = task.validation[: QUICKSTART_RECIPE["eval_limit"]]  # the comparison's curve puzzles; test is never read
    policy = load_base_policy(args.base, progress=False)
    base_acc, base_items = evaluate_items(policy, val, task.metric)
    over = {"learning_rate": args.lr} if args.lr else {}
    for kv in args.set:
        key, _, value = kv.partition("=")
        over[key] = json.loads(value)
    if args.random_reward:
        draw = random.Random(args.seed)

        @REWARDS.register("random_uniform_control")
        def random_uniform_control(prompts, completions, **kwargs) -> list[float]:
            """A reward that ignores the answer: U(0, 1) per completion."""
            return [draw.random() for _ in completions]

        over["reward_funcs"] = ["random_uniform_control"]
    cfg = load_config(None, {**arm_config(args.name, args.arm, seed=args.seed, rollouts=args.rollouts, out=out / "run"), **over})
    f = cfg.steps_per_rollout
    points: list[dict] = [{"rollouts": 0, "accuracy": base_acc, "items": base_items}]

    class ValidationTrainer(Trainer):
        """The comparison's trainer; its periodic evaluation scores the validation puzzles per puzzle (greedy, as the
        comparison's test is scored) and keeps every point."""

        def evaluate(self):
            acc, items = evaluate_items(self.policy, val, task.metric)
            gain = difference_interval([items], [base_items])
            points.append({"rollouts": self.step // f, "accuracy": acc, "items": items, "gain": gain.to_dict()})
            logger.info(f"rollout batch {self.step // f}: validation {100 * acc:.1f} (base {100 * base_acc:.1f}), "
                        f"gain {gain.fmt(signed=True)}")
            return {"eval/accuracy": acc}

    cfg.eval_steps = args.every * f
    t0 = time.perf_counter()
    ValidationTrainer(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs or task.reward_funcs,
                      eval_dataset=val, eval_metric=task.metric).train()
    record = {"name": args.name, "arm": args.arm, "base": args.base, "seed": args.seed, "rollouts": args.rollouts,
              "random_reward": args.random_reward,
              "seconds": time.perf_counter() - t0, "points": points, "metrics": read_metrics(out / "run"),
              "config": {**arm_config(args.name, args.arm, seed=args.seed, rollouts=args.rollouts, out=Path(".")), **over}}
    (out / "curve.json").write_text(json.dumps(record, default=str))
    logger.info(f"{out / 'curve.json'}: " + ", ".join(f"{p['rollouts']}: {100 * p['accuracy']:.1f}" for p in points))


if __name__ == "__main__":
    main()
