"""Study (docs/RESULTS.md, issue 25 item 3): a short RL run on `countdown4_steps` from the `countdown4-steps-ar` base
(default DGPO, its METHOD_DEFAULTS but dynamic sampling off: the base solves few problems, so nearly every group
would be redrawn; and DAPO's overlong penalty off: with it and lr 1e-3 the run collapsed into short, unrewarded
answers within 10 steps, docs/RESULTS.md), `key=value` overrides; the final model goes to OUT/final (for `credit_decisive.py OUT2 OUT/final`).

    OMP_NUM_THREADS=1 python scripts/studies/countdown4_steps_rl.py OUT [method=dgpo] [max_steps=20] [key=value ...]
"""
import shutil
import sys
from pathlib import Path

import torch
import yaml

from mmrl.config.train_config import load_config
from mmrl.data.tasks import load_task
from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy, spec_for
from mmrl.training.trainer import Trainer

NAME = "countdown4-steps-ar"
torch.set_num_threads(1)
register()
out = Path(sys.argv[1])
spec = spec_for(NAME)
values = dict(method="dgpo", family=spec.family, task=spec.task, model_name_or_path=f"tiny-world:{NAME}",
              reward_funcs=["countdown4_steps"], num_generations=8, per_device_train_batch_size=64,
              gradient_accumulation_steps=1, max_completion_length=spec.gen_length, temperature=1.0, learning_rate=2e-4,
              max_steps=20, dynamic_sampling=False, overlong_penalty=False, save_steps=0, credit_steps=0, eval_steps=0,
              progress_bar=False,
              output_dir=str(out), seed=0)
values.update({k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[2:])})  # "20" -> 20, as the CLI
cfg = load_config(None, values)
shutil.rmtree(out, ignore_errors=True)
task = load_task(cfg.task)
trainer = Trainer(cfg, policy=load_base_policy(NAME, progress=False), dataset=task.train, reward_funcs=task.reward_funcs)
trainer.train()
trainer.save_model(out / "final")
records = [r for r in read_metrics(out) if "reward" in r]
print(f"{cfg.method}, {cfg.max_steps} steps: training reward by step", [round(r["reward"], 3) for r in records])
print("entropy by step", [round(r["entropy"], 3) for r in records if "entropy" in r])
print("dgpo weight max by step", [round(r["dgpo/weight_max"], 2) for r in records if "dgpo/weight_max" in r])
