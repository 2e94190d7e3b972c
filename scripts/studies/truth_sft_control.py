"""Study (docs/RESULTS.md): continue a base with supervised training on the true solutions (the ceiling RL is
compared with), 16 puzzles per step, fresh AdamW, for each learning rate.

    python scripts/studies/truth_sft_control.py BASE_DIR 1e-4,1e-3 STEPS
"""
import sys, os, torch
torch.set_num_threads(1)
from mmrl.models import adapter_class
from mmrl.data.tasks import load_task
from mmrl.tiny_world import register as register_tiny_world
from mmrl.training.evaluate import evaluate, d1_generation
from mmrl.tiny_world.pretrain import masked_diffusion_sft

register_tiny_world()  # the tiny world's tasks and rewards (the engine does not import it)
task = load_task("sudoku4"); gen = d1_generation("masked_diffusion", 16, 16, 16)
for lr in [float(x) for x in sys.argv[2].split(",")]:
    pol = adapter_class("masked_diffusion").from_pretrained(sys.argv[1])
    rows = task.train
    masked_diffusion_sft(pol, [r["prompt"] for r in rows], [r["solution"] for r in rows], gen_length=16, steps=int(sys.argv[3]), batch_size=16, lr=lr, progress=False)
    print(lr, evaluate(pol, task.test[:256], task.metric, batch_size=128, progress=False, **gen).accuracy)
