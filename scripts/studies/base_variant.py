"""Study (docs/RESULTS.md): pre-train a variant of a tiny base (TinySpec fields replaced) into SAVE_DIR and print
its held-out greedy accuracy, sampled accuracy at temperature 1 and pass@K (`mmrl.tiny_world.reasoning_rl.held_out`).

    K=16 python scripts/studies/base_variant.py countdown3-ar SAVE_DIR steps=600 lr=2e-3
"""
import ast
import dataclasses
import sys
import time

from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import TINY_MODELS, pretrain
from mmrl.tiny_world.reasoning_rl import held_out
import os

register()
name, save = sys.argv[1], sys.argv[2]
over = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])}
spec = dataclasses.replace(TINY_MODELS[name], **over)
t0 = time.time()
pol, hist = pretrain(spec, progress=False)
secs = time.time() - t0
pol.save_pretrained(save)
task = load_task(spec.task)
res = held_out(pol, task.test[:256], task.metric, spec.family, spec.gen_length, int(os.environ.get("K", "16")))
print(name, over, f"built in {secs:.0f} s, loss {hist[-1]['loss']:.3f}", {k: round(v, 3) for k, v in res.items()})
