"""Study (docs/RESULTS.md): pre-train a sudoku4 base variant and print its held-out greedy cell accuracy.

    python scripts/studies/pretrain_variant.py SAVE_DIR STEPS MIN_BLANKS MAX_BLANKS [LR]
"""
import sys, os, time, json, torch, dataclasses
torch.set_num_threads(int(os.environ.get("THREADS", "1")))
from mmrl.tiny_world.models import TINY_MODELS, pretrain
from mmrl.data.tasks import load_task
from mmrl.tiny_world import register as register_tiny_world
from mmrl.training.evaluate import evaluate, d1_generation

register_tiny_world()  # the tiny world's tasks and rewards (the engine does not import it)
save, steps, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lr = float(sys.argv[5]) if len(sys.argv) > 5 else 2e-3
spec = dataclasses.replace(TINY_MODELS["sudoku4"], steps=steps, pretrain_filter={"blanks": [lo, hi]}, lr=lr)
t = time.time(); pol, hist = pretrain(spec, progress=False); tt = time.time() - t
pol.save_pretrained(save)
task = load_task("sudoku4"); gen = d1_generation("masked_diffusion", 16, 16, 16)
a = evaluate(pol, task.test[:256], task.metric, batch_size=128, progress=False, **gen).accuracy
# best-of-16 at temperature 1 on 32 test puzzles
rows = task.test[:32]


print(save, "train s", round(tt), "loss", round(hist[-1]["loss"], 3), "greedy test", round(a, 3))
