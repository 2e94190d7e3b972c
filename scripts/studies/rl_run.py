"""Study (docs/RESULTS.md): one RL run of the quickstart preset with `key=value` overrides (BASE=dir: another base).

    BASE=/tmp/bB python scripts/studies/rl_run.py OUT_DIR max_steps=30 learning_rate=3e-4 dmpo_baseline=none
"""
import os
import shutil
import sys
from pathlib import Path

import torch

from mmrl.config.train_config import load_config
from mmrl.data.tasks import load_task
from mmrl.tiny_world import register as register_tiny_world
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.tiny_world.models import load_base_policy
from mmrl.training.trainer import Trainer

register_tiny_world()  # the tiny world's tasks and rewards (the engine does not import it)

torch.set_num_threads(int(os.environ.get("THREADS", "1")))
out = sys.argv[1]
preset = Path(__file__).resolve().parents[2] / "configs" / "tiny_dmpo_sudoku4.yaml"
cfg = load_config(preset, [f"output_dir={out}", "progress_bar=false", "save_steps=0", "credit_steps=0", *sys.argv[2:]])
shutil.rmtree(out, ignore_errors=True)
task = load_task(cfg.task)
pol = adapter_class(cfg.family).from_pretrained(os.environ["BASE"]) if os.environ.get("BASE") else load_base_policy(cfg.task, progress=False)
Trainer(cfg, policy=pol, dataset=task.train, reward_funcs=task.reward_funcs, eval_dataset=task.test[: cfg.eval_limit],
        eval_metric=task.metric).train()
records = read_metrics(out)
print("held-out accuracy by step", [(r["step"], round(r["eval/accuracy"], 3)) for r in records if "eval/accuracy" in r])
rewards = [round(r["reward"], 3) for r in records if "reward" in r]
print("training reward", rewards[:: max(1, len(rewards) // 15)])
