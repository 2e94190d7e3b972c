"""Study (docs/RESULTS.md): one RL run of the quickstart recipe with overrides (BASE=dir for another base model).

    BASE=/tmp/bB python scripts/studies/rl_run.py OUT_DIR max_steps=30 learning_rate=3e-4 dmpo_baseline=none
"""
import sys, os, time, json, torch
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE
from mmrl.tiny_world.models import load_base_policy
from mmrl.data.tasks import load_task
from mmrl.config import load_config
from mmrl.trainer import Trainer
from mmrl.metrics_log import read_metrics
import yaml
out = sys.argv[1]
ov = {}
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1); ov[k] = yaml.safe_load(v)
task_name = ov.pop("task_name", "sudoku4")
recipe = {**QUICKSTART_RECIPE, "progress_bar": False, "output_dir": out, "save_steps": 0, "credit_steps": 0, **ov}
import shutil; shutil.rmtree(out, ignore_errors=True)
task = load_task(task_name)
cfg = load_config(None, recipe)
if os.environ.get("BASE"):
    from mmrl.models import adapter_class
    pol = adapter_class("masked_diffusion").from_pretrained(os.environ["BASE"])
else:
    pol = load_base_policy(task_name, progress=False)
t = time.time()
Trainer(cfg, policy=pol, dataset=task.train, reward_funcs=task.reward_funcs, eval_dataset=task.test[:recipe["eval_limit"]], eval_metric=task.metric).train()
recs = read_metrics(out)
ev = [(r["step"], round(r["eval/accuracy"], 3)) for r in recs if "eval/accuracy" in r]
rw = [round(r["reward"], 3) for r in recs if "reward" in r]
print("time", round(time.time() - t), "eval", ev)
print("reward", rw[::max(1, len(rw)//15)])
