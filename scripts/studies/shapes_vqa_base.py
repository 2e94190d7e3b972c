"""Study (docs/RESULTS.md "Tiny VLM", issue 25 item 5): build a shapes_vqa base (`--base`, default `shapes-vqa`;
cached; a learning curve of greedy per-type accuracy on the VALIDATION split every `--curve-every` steps (default CURVE_EVERY) when it is built
here) and measure whether it reads its image, on the validation split only: greedy accuracy per question type with
its 95% bootstrap interval, against chance and against always answering the type's majority training answer (paired
interval of the difference), and the sampled pass@1 / pass@8. Per-question scores go to OUT/results.json; `reads`
there says whether every type's accuracy - majority interval lies above 0, `margin` the smallest lower bound.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_base.py [OUT=runs/shapes-vqa-base] [--base shapes-vqa-reads]
"""
import argparse
import json
import textwrap
import time
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.models import adapter_class
from mmrl.tiny_world import register
from mmrl.tiny_world.models import ensure_built, spec_for
from mmrl.tiny_world.shapes_vqa import auxiliary_rows
from mmrl.tiny_world.vqa_rl import BASE, base_reading, majority_answers, pass_at_k, vqa_accuracy, vqa_base_option, vqa_items

CURVE_EVERY = 200

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("out", nargs="?", default="runs/shapes-vqa-base", help="report folder (results.json)")
parser.add_argument("--curve-every", type=int, default=CURVE_EVERY, help="steps between two curve points")
parser.add_argument("--base", default=BASE, type=vqa_base_option, help=f"the shapes_vqa base to build and read (default {BASE})")
args = parser.parse_args()
name = args.base
torch.set_num_threads(1)
register()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
spec = spec_for(name)
task = load_task(spec.task)
rows = task.validation
aux_rows = [r for t in spec.data.get("aux_types", []) for r in auxiliary_rows(t, "validation")]


def curve(policy):
    """The evaluation the build runs every `--curve-every` steps, echoed as it lands (a long build can be watched);
    a spec with pre-training-only question types (`aux_types`) also gets their validation accuracy, apart from the
    task's overall."""
    def evaluate_now():
        acc = vqa_accuracy(policy, rows)
        if aux_rows:
            acc.update({t: a for t, a in vqa_accuracy(policy, aux_rows).items() if t != "overall"})
        print(f"curve {time.strftime('%H:%M:%S', time.gmtime())} UTC: " + "  ".join(f"{k} {v:.3f}" for k, v in acc.items()),
              flush=True)
        return acc
    return evaluate_now


path = ensure_built(name, progress=False, curve=curve, curve_every=args.curve_every)
built = json.loads((path / "tiny_spec.json").read_text())
pol = adapter_class(spec.family).from_pretrained(path)
t0 = time.process_time()
acc, scores = vqa_items(pol, rows)
reading = base_reading(rows, scores, majority_answers(task.train))
sampled = pass_at_k(pol, rows)
lows = {t: r["minus_majority"]["low"] for t, r in reading.items() if t != "overall"}
report = {"model": name, "folder": path.name, "split": "validation", "rows": len(rows), "spec": built.get("spec"),
          "build": {x: built.get(x) for x in ("seconds", "cpu_seconds", "final_loss", "curve", "weights_sha256")},
          "eval_cpu_seconds": time.process_time() - t0, "reading": reading, "sampled": sampled,
          "reads": all(v > 0 for v in lows.values()), "margin": min(lows.values()), "items": scores}
(out / "results.json").write_text(json.dumps(report, indent=1))


def answers_grid(per_type: int = 4) -> Path:
    """OUT/answers.png: the first `per_type` validation questions of each type, image, question, the base's greedy
    answer and the true one (a tick where they agree): what "reads its image" looks like."""
    from mmrl.rewards.completions import completion_text
    from mmrl.tiny_world.report import image_grid
    from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES, normalise_answer
    from mmrl.tiny_world.vqa_rl import EVAL_GENERATION, balanced_rows
    from mmrl.training.evaluate import evaluate

    shown = balanced_rows(rows, per_type)
    res = evaluate(pol, shown, "shapes_vqa", progress=False, **EVAL_GENERATION)
    titles = []
    for r, c, ok in zip(shown, res.completions, res.scores):
        said = normalise_answer(completion_text(c))[:12]
        question = "\n".join(textwrap.wrap(r["prompt"]["prompt"], 24))  # the position questions are long
        titles.append(f"{question}\n{'OK' if ok else 'X'}: said {said!r}, truth {r['answer']!r}")
    images = [r["prompt"]["images"][0].resize((144, 144), 0) for r in shown]  # 0: nearest, the cells stay sharp
    return image_grid(images, titles, out / "answers.png", cols=len(QUESTION_TYPES) * per_type // 2)


answers_grid()
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
print(f"every type above its majority answer: {report['reads']} (smallest lower bound {100 * report['margin']:+.1f} points)")
