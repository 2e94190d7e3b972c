"""Study (docs/RESULTS.md, "Keeping the pre-training optimizer state"): the size of the first RL updates of
`dllm-countdown3` arms with a fresh AdamW and with the base's pre-training AdamW state (`init_optimizer_from_base`),
on the same seed: `diag/update_abs_mean` (mean |delta w| per weight) divided by the learning rate the step used,
with the gradient norm and the seconds per step. The arms train on the training split only, with no validation
curve and no test scoring (a diagnostic, not a reported run), for the first ROLLOUTS rollout batches of a run of
TOTAL batches (the same lr schedule as the full runs: `max_steps` = TOTAL, stopped after ROLLOUTS steps).

    MMRL_CACHE=... python scripts/studies/optstate_update_size.py OUT.json SEED ROLLOUTS TOTAL ARM_CONSTANT...
    (e.g. /work/runs/optstate/update_size.json 0 6 30 DIFFU_GRPO DIFFU_GRPO_BASE_STATE DMPO_CORRECT_ONLY DMPO_CORRECT_ONLY_BASE_STATE)

ARM_CONSTANT: a label constant of `mmrl.tiny_world.reasoning_rl`, or DIFFU_GRPO for its "diffu-GRPO" arm.
"""
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

from mmrl.config.train_config import load_config
from mmrl.data.tasks import load_task
from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world import reasoning_rl as rr
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy
from mmrl.training.trainer import Trainer

NAME = "dllm-countdown3"


def first_steps(arm: str, seed: int, rollouts: int, total: int) -> list[dict]:
    """Per-step records of the first `rollouts` optimizer steps of `arm` at `seed` (schedule of `total` steps)."""
    task = load_task(rr.COMPARISONS[NAME]["recipe"]["task"])
    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(None, rr.arm_config(NAME, arm, seed=seed, out=Path(d), rollouts=total, curve_points=0))
        trainer = Trainer(cfg, policy=load_base_policy("countdown3-md", progress=False), dataset=task.train,
                          reward_funcs=cfg.reward_funcs)
        lr0 = trainer.scheduler.get_last_lr()[0]  # the lr of step 1
        trainer.cfg.max_steps = rollouts  # stop early, keeping the scheduler built for `total` steps
        t0 = time.perf_counter()
        trainer.train()
        secs = time.perf_counter() - t0
        recs = read_metrics(Path(d))
    used = [lr0] + [r["learning_rate"] for r in recs[:-1]]  # the logged lr is the next step's
    return [{"step": r["step"], "lr": lr, "update_abs_mean": r.get("diag/update_abs_mean"),
             "update_over_lr": (r["diag/update_abs_mean"] / lr) if lr > 0 else None, "grad_norm": r.get("grad_norm"),
             "kl_k3": r.get("diag/kl_k3"), "reward": r.get("rewards/countdown3_accuracy/mean"),
             "seconds_per_step": secs / len(recs)} for r, lr in zip(recs, used)]


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    register()
    out, seed, rollouts, total, names = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3]), argv[4:]
    res = json.loads(out.read_text()) if out.exists() else {}
    for const in names:
        arm = "diffu-GRPO" if const == "DIFFU_GRPO" else getattr(rr, const)
        key = f"{arm} | seed {seed}"
        if key in res:
            continue
        res[key] = first_steps(arm, seed, rollouts, total)
        out.write_text(json.dumps(res, indent=1))
        print(key + ": " + "  ".join(f"step {r['step']}: |dw|/lr {r['update_over_lr'] if r['update_over_lr'] is None else round(r['update_over_lr'], 3)}"
                                     for r in res[key]) + f"  ({res[key][0]['seconds_per_step']:.1f} s per step)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
