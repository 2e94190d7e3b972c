"""Study (docs/RESULTS.md): one RL run on a tiny reasoning base with `key=value` overrides of TrainConfig, then the
held-out greedy accuracy and the sampled accuracy at temperature 1 (mean over K samples per row) and pass@K.

    BASE=dir K=4 python scripts/studies/reason_run.py OUT_DIR method=grpo task=countdown3 family=causal_lm \
        model_name_or_path=tiny-world:countdown3-ar learning_rate=1e-3 max_steps=60
"""
import json
import os
import shutil
import sys
import time

import torch

from mmrl.config.train_config import load_config
from mmrl.data.tasks import load_task
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy
from mmrl.tiny_world.reasoning_rl import held_out
from mmrl.training.trainer import Trainer

register()
out = sys.argv[1]
over = dict(a.split("=", 1) for a in sys.argv[2:])
cfg = load_config(None, {"output_dir": out, "progress_bar": "false", "save_steps": 0, "credit_steps": 0, **over})
shutil.rmtree(out, ignore_errors=True)
task = load_task(cfg.task)
name = cfg.model_name_or_path.split(":", 1)[1]
pol = adapter_class(cfg.family).from_pretrained(os.environ["BASE"]) if os.environ.get("BASE") else load_base_policy(name, progress=False)
rows = task.test[:256]
k = int(os.environ.get("K", "4"))
before = held_out(pol, rows, task.metric, cfg.family, cfg.max_completion_length, k) if os.environ.get("BEFORE") else None
t0 = time.time()
Trainer(cfg, policy=pol, dataset=task.train, reward_funcs=cfg.reward_funcs or task.reward_funcs, eval_dataset=rows[: cfg.eval_limit],
        eval_metric=task.metric).train()
secs = time.time() - t0
after = held_out(pol, rows, task.metric, cfg.family, cfg.max_completion_length, k)
records = read_metrics(out)
rewards = [round(r["reward"], 3) for r in records if "reward" in r]
print("before", before, "\nafter", after, f"\ntrain {secs:.0f} s")
print("held-out by step", [(r["step"], round(r["eval/accuracy"], 3)) for r in records if "eval/accuracy" in r])
print("training reward", rewards[:: max(1, len(rewards) // 15)])
keys = [k for k in records[-1] if k.startswith(("diag/", "kl", "entropy", "dmpo/", "clip_ratio"))]
for r in records[:: max(1, len(records) // 6)]:
    print(r["step"], {k: round(r[k], 4) for k in keys if k in r})
