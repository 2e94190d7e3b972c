"""Study (docs/RESULTS.md, issue 25 item 1): build the `countdown4-steps-ar` base (cached; a learning curve of greedy
accuracy on the first CURVE validation problems when it is built here) and measure it on the VALIDATION split:
greedy accuracy, sampled pass@1 and pass@K at temperature 1 (the training sampler), mean answer length in tokens,
each with a paired-bootstrap 95% interval over problems (`mmrl.tiny_world.stats`); per-problem scores and the
answers go to OUT/results.json.

    OMP_NUM_THREADS=1 python scripts/studies/countdown4_steps_base.py [OUT=runs/countdown4-steps-base] [K=16] [STEPS]

STEPS: the smoke variant pre-trained for only that many steps (a pipeline check; `smoke_spec`).
"""
import json
import sys
import time
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import ensure_built, spec_for
from mmrl.tiny_world.reasoning_rl import sampled_generation
from mmrl.tiny_world.stats import mean_interval
from mmrl.training.evaluate import d1_generation, evaluate
from mmrl.models import adapter_class

NAME, CURVE, CURVE_EVERY = "countdown4-steps-ar", 100, 300

torch.set_num_threads(1)
register()
out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/countdown4-steps-base")
k = int(sys.argv[2]) if len(sys.argv) > 2 else 16
steps = int(sys.argv[3]) if len(sys.argv) > 3 else None
out.mkdir(parents=True, exist_ok=True)
spec = spec_for(NAME)
task = load_task(spec.task)
rows, L = task.validation, spec.gen_length
greedy_opts = d1_generation(spec.family, L, L, L)


def curve(policy):
    return lambda: evaluate(policy, rows[:CURVE], task.metric, batch_size=CURVE, progress=False, **greedy_opts).accuracy


path = ensure_built(NAME, progress=False, steps=steps, curve=curve, curve_every=CURVE_EVERY)
built = json.loads((path / "tiny_spec.json").read_text())
pol = adapter_class(spec.family).from_pretrained(path)
t0 = time.process_time()
n_tokens = lambda texts: [len(pol.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
greedy = evaluate(pol, rows, task.metric, batch_size=150, progress=False, **greedy_opts)
solved = torch.zeros(len(rows), k)  # [R, K]
samples, lengths = [], []
for j in range(k):
    res = evaluate(pol, rows, task.metric, batch_size=150, progress=False, seed=1000 + j, **sampled_generation(spec.family, L))
    solved[:, j] = torch.tensor(res.scores) >= 1
    samples.append(res.completions)
    lengths.append(n_tokens(res.completions))
items = {"greedy": [float(s) for s in greedy.scores], "pass@1": solved.mean(1).tolist(),
         f"pass@{k}": solved.max(1).values.tolist(), "greedy_tokens": [float(x) for x in n_tokens(greedy.completions)],
         "sampled_tokens": torch.tensor(lengths, dtype=torch.float).mean(0).tolist()}
summary = {name: mean_interval(v).to_dict() for name, v in items.items()}
report = {"model": NAME, "split": "validation", "rows": len(rows), "k": k, "build": {x: built.get(x) for x in ("seconds", "cpu_seconds", "final_loss", "curve")},
          "eval_cpu_seconds": time.process_time() - t0, "summary": summary, "items": items,
          "answers": [{"prompt": r["prompt"], "greedy": g, "samples": [s[i] for s in samples[:4]]}
                      for i, (r, g) in enumerate(zip(rows, greedy.completions))]}
(out / "results.json").write_text(json.dumps(report, indent=1))
for h in built.get("curve") or []:
    print(f"curve step {h['step']}: greedy {h['eval']:.3f} on the first {CURVE} validation problems")
print(f"{NAME}: built in {built['cpu_seconds']:.0f} CPU s (final loss {built['final_loss']:.3f}); {len(rows)} validation problems:")
for name, iv in summary.items():
    print(f"  {name}: {iv['estimate']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]")
for a in report["answers"][:3]:
    print(" ", a["prompt"], "->", a["greedy"])
