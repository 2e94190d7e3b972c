"""Study (docs/RESULTS.md): rejection-sampling fine-tuning by hand, outside the trainer: 16 puzzles x 16 samples
at temperature 1, LLaDA SFT loss on the best sample of each puzzle (`best`) or only on fully solved ones
(`perfect`); prints held-out greedy accuracy every 10 steps.

    python scripts/studies/self_training_control.py BASE_DIR LR STEPS [best|perfect]
"""
import random
import sys

import torch

from mmrl.core.registry import REWARDS
from mmrl.data.tasks import load_task
from mmrl.tiny_world import register as register_tiny_world
from mmrl.training.evaluate import d1_generation, evaluate
from mmrl.models import adapter_class
from mmrl.tiny_world.pretrain import masked_sft_loss

register_tiny_world()  # the tiny world's tasks and rewards (the engine does not import it)

torch.set_num_threads(1)
torch.manual_seed(0)
base, lr, steps = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "best"
task = load_task("sudoku4")
gen = d1_generation("masked_diffusion", 16, 16, 16)
reward = REWARDS["sudoku4"]
pol = adapter_class("masked_diffusion").from_pretrained(base)
opt = torch.optim.AdamW(pol.model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
rnd, g, B, G = random.Random(0), torch.Generator().manual_seed(0), 16, 16
for step in range(steps + 1):
    if step % 10 == 0:
        pol.model.eval()
        print(step, "held-out", round(evaluate(pol, task.test[:256], task.metric, batch_size=128, progress=False, **gen).accuracy, 3), flush=True)
        pol.model.train()
    if step == steps:
        break
    rows = rnd.sample(task.train, B)
    with torch.no_grad():
        ro = pol.sample([r["prompt"] for r in rows], G, seeds=[rnd.randrange(1 << 30) for _ in range(B * G)],
                        gen_length=16, block_length=16, steps=16, temperature=1.0)
    rep = [r for r in rows for _ in range(G)]
    rew = torch.tensor(reward(None, ro.completions, [r["puzzle"] for r in rep], [r["solution"] for r in rep])).view(B, G)
    best = rew.argmax(1) + torch.arange(B) * G  # [B] index of each puzzle's best sample
    if mode == "perfect":
        best = best[rew.max(1).values >= 1.0]
        if len(best) == 0:
            continue
    loss = masked_sft_loss(pol, ro.prompt_ids[best], ro.prompt_mask[best], ro.response_ids[best], ro.extras["fixed"][best], g)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(pol.model.parameters(), 1.0)
    opt.step()
    if step % 5 == 0:
        print(step, "reward mean", round(rew.mean().item(), 3), "best-of-16", round(rew.max(1).values.mean().item(), 3), flush=True)
