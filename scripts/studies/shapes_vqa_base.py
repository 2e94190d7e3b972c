"""Study (docs/RESULTS.md "Tiny VLM", issue 25 item 5): build the `shapes-vqa` base (cached; a learning curve of
greedy per-type accuracy on the VALIDATION split every CURVE_EVERY steps when it is built here) and measure whether it
reads its image, on the validation split only: greedy accuracy per question type with its 95% bootstrap interval,
against chance and against always answering the type's majority training answer (paired interval of the
difference), and the sampled pass@1 / pass@8. Per-question scores go to OUT/results.json.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_base.py [OUT=runs/shapes-vqa-base]
"""
import json
import sys
import time
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.models import adapter_class
from mmrl.tiny_world import register
from mmrl.tiny_world.models import ensure_built, spec_for
from mmrl.tiny_world.vqa_rl import BASE, base_reading, majority_answers, pass_at_k, vqa_accuracy, vqa_items

CURVE_EVERY = 200

torch.set_num_threads(1)
register()
out = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/shapes-vqa-base")
out.mkdir(parents=True, exist_ok=True)
spec = spec_for(BASE)
task = load_task(spec.task)
rows = task.validation


def curve(policy):
    return lambda: vqa_accuracy(policy, rows)


path = ensure_built(BASE, progress=False, curve=curve, curve_every=CURVE_EVERY)
built = json.loads((path / "tiny_spec.json").read_text())
pol = adapter_class(spec.family).from_pretrained(path)
t0 = time.process_time()
acc, scores = vqa_items(pol, rows)
reading = base_reading(rows, scores, majority_answers(task.train))
sampled = pass_at_k(pol, rows)
report = {"model": BASE, "folder": path.name, "split": "validation", "rows": len(rows),
          "build": {x: built.get(x) for x in ("seconds", "cpu_seconds", "final_loss", "curve", "weights_sha256")},
          "eval_cpu_seconds": time.process_time() - t0, "reading": reading, "sampled": sampled, "items": scores}
(out / "results.json").write_text(json.dumps(report, indent=1))
for h in built.get("curve") or []:
    print(f"curve step {h['step']}: " + "  ".join(f"{k} {v:.3f}" for k, v in h["eval"].items()))
print(f"{path.name}: built in {built['cpu_seconds']:.0f} CPU s (final loss {built['final_loss']:.3f}, weights "
      f"{built.get('weights_sha256')}); {len(rows)} validation questions, greedy:")
for t, r in reading.items():
    a, d = r["accuracy"], r["minus_majority"]
    ch = f"chance {r['chance']:.3f}, " if r["chance"] else ""
    print(f"  {t:9s} n={r['rows']:3d}  {a['estimate']:.3f} [{a['low']:.3f}, {a['high']:.3f}]  {ch}majority "
          f"{r['majority']:.3f} ({r['majority_answer']}), minus majority {100 * d['estimate']:+.1f} "
          f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] points")
print("sampled pass@1 " + "  ".join(f"{k} {v:.3f}" for k, v in sampled["pass@1"].items()))
print("sampled pass@8 " + "  ".join(f"{k} {v:.3f}" for k, v in sampled["pass@8"].items()))
