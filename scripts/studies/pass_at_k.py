"""Study (docs/RESULTS.md): is a tiny base in the regime where RL can help? Greedy accuracy, sampled pass@1 and
pass@k at temperature 1 with the training sampler, on the first N held-out rows.

    python scripts/studies/pass_at_k.py countdown3-ar [N=256] [K=16]   # BASE=dir: another model directory
"""
import os
import sys

import torch

from mmrl.data.tasks import load_task
from mmrl.training.evaluate import d1_generation, evaluate
from mmrl.models import adapter_class
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy, spec_for

register()
name = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 256
k = int(sys.argv[3]) if len(sys.argv) > 3 else 16
spec = spec_for(name)
pol = adapter_class(spec.family).from_pretrained(os.environ["BASE"]) if os.environ.get("BASE") else load_base_policy(name, progress=False)
task = load_task(spec.task)
rows = task.test[:n]
L = spec.gen_length
greedy = evaluate(pol, rows, task.metric, batch_size=128, progress=False, **d1_generation(spec.family, L, L, L)).accuracy
if spec.family == "masked_diffusion":
    samp = {"gen_length": L, "block_length": L, "steps": L, "temperature": 1.0, "sampler": "low_confidence"}
else:
    samp = {"max_new_tokens": L, "temperature": 1.0}
per_row = torch.zeros(len(rows), k)
for j in range(k):
    res = evaluate(pol, rows, task.metric, batch_size=128, progress=False, seed=1000 + j, **samp)
    per_row[:, j] = torch.tensor(res.scores)
solved = (per_row >= 1.0).float()
print(f"{name}: greedy {greedy:.3f}  sampled mean score {per_row.mean():.3f}  sampled pass@1 {solved.mean():.3f}  "
      f"pass@{k} {solved.max(1).values.mean():.3f}  rows {len(rows)}")
