"""Study (docs/RESULTS.md, issue 25 item 2): the per-problem validation items of a `grpo-regime-countdown4-steps`
run folder ROOT (the base and runs/grpo-seed0 at its last step, 80) recomputed from the saved models with the curve's own
rows, seeds and batches, for runs made before the curve saved them (the regime run).

    OMP_NUM_THREADS=1 python scripts/studies/countdown4_steps_val_items.py ROOT
"""
import json, sys, torch
from pathlib import Path
torch.set_num_threads(1)
from mmrl.tiny_world import register; register()
from mmrl.data.tasks import load_task
from mmrl.models import adapter_class
from mmrl.tiny_world.models import load_base_policy
from mmrl.tiny_world.reasoning_rl import held_out_items
root = Path(sys.argv[1]); task = load_task("countdown4_steps"); rows = task.validation[:100]
def items(pol):
    return held_out_items(pol, rows, task.metric, "causal_lm", 170, 16, ks=(4,), stacked=True, batch_size=400)
a, it = items(load_base_policy("countdown4-steps-ar", progress=False)); print("base", a)
(root / "base_validation_items.jsonl").write_text(json.dumps({"step": 0, "items": it}) + "\n")
run = root / "runs" / "grpo-seed0"
a, it = items(adapter_class("causal_lm").from_pretrained(run)); print("final", a)
(run / "validation_items.jsonl").write_text(json.dumps({"step": 80, "items": it}) + "\n")
