"""Study (docs/RESULTS.md, "dLLM"): the cached `countdown3-md` base under several greedy decodings, on the first 256
validation rows (every choice on validation): low-confidence (LLaDA, top-1 confidence per step = easy-first
without re-masking), left to right (block length 1), blocks of 4, Dream's margin and entropy orders, two tokens per
step, and MGDM's easy-first top-k with re-masking (`sampler="easy_first"`).

    python scripts/studies/md_decodings.py OUT.jsonl
"""
import json
import sys
import time

import torch

torch.set_num_threads(1)

from mmrl.data.tasks import load_task  # noqa: E402
from mmrl.tiny_world import register  # noqa: E402
from mmrl.tiny_world.models import load_base_policy  # noqa: E402
from mmrl.training.evaluate import evaluate  # noqa: E402

register()
task = load_task("countdown3")
rows = task.validation[:256]
policy = load_base_policy("countdown3-md", progress=False)
DECODES = {
    "lowconf16": dict(block_length=16, steps=16, sampler="low_confidence"),
    "l2r": dict(block_length=1, steps=16, sampler="low_confidence"),
    "block4": dict(block_length=4, steps=16, sampler="low_confidence"),
    "margin": dict(block_length=16, steps=16, sampler="topk_margin"),
    "entropy": dict(block_length=16, steps=16, sampler="entropy"),
    "lowconf8": dict(block_length=16, steps=8, sampler="low_confidence"),
    "easy_first16": dict(block_length=None, steps=16, sampler="easy_first"),
    "easy_first8": dict(block_length=None, steps=8, sampler="easy_first"),
}
with open(sys.argv[1], "a") as log:
    for name, gen in DECODES.items():
        c = time.process_time()
        r = evaluate(policy, rows, task.metric, batch_size=128, progress=False, gen_length=16, temperature=0.0, **gen)
        rec = {"decode": name, **gen, "val_acc": r.accuracy, "cpu_s": round(time.process_time() - c, 1)}
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
