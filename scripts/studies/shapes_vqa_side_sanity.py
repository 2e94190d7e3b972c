"""Study (docs/RESULTS.md, "Issue 25, item 5": one object): can the tiny Qwen3-VL of the `shapes-vqa-qwen3` bases learn
where a single object is at all? Every scene holds ONE object (random shape, colour and place on the 12 x 12 grid) and
gets one question, true labels:

    side    "side of the red one?"   -> "left" / "right" (the object's half of the image)
    column  "column of the red one?" -> "0" .. "9" (its leftmost cell column)
    colour  "colour of the circle?"  -> one of 7 colours (the control: a content read the bases do learn)

The model is `shapes-vqa-qwen3`'s (vision 4 blocks, text 4 layers x 64), its vision position table times `--pos-scale`
(50: the table of the `*50` bases, whose image features carry the column), fresh; `vlm_sft` as in its build (batch 32,
lr 2e-3, seed 0). Greedy accuracy on 200 held-out one-object scenes (their own seed stream; the task's splits are not
read; training scenes equal to a held-out one are dropped) every `--every` steps. With one object nothing has to be
found: a model that learns the colour control but not the side has no usable column on the way from its image to its
answer.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_side_sanity.py OUT.json --question side --steps 2000
"""
import argparse
import dataclasses
import json
import random
import time

import torch

from mmrl.tiny_world import register
from mmrl.tiny_world.models import SHAPES_VQA_QWEN3_DEEP_ARCH, build_untrained, spec_for
from mmrl.tiny_world.shapes import CLASSIC_COLORS, CLASSIC_SHAPES, GRID, PATTERN, Scene, SceneObject
from mmrl.tiny_world.shapes_vqa import CELL_PX
from mmrl.tiny_world.vlm_pretrain import vlm_sft
from mmrl.tiny_world.vqa_rl import vqa_items

QUESTIONS = ("side", "column", "colour")
TRAIN_SEED, HELD_OUT_SEED = 505, 606  # streams of their own: no scene of the task's splits is drawn from them

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("out", help="results file (json)")
parser.add_argument("--question", choices=QUESTIONS, default="side")
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--every", type=int, default=250, help="evaluation every this many steps")
parser.add_argument("--scenes", type=int, default=3000, help="training scenes (one question each)")
parser.add_argument("--pos-scale", type=float, default=50.0, help="the vision position table's init times this")
parser.add_argument("--text-first", action="store_true", help="the question before the image")
args = parser.parse_args()


def one_object_rows(n: int, seed: int, exclude: frozenset = frozenset()) -> list[dict]:
    """`n` one-object scenes with the `--question` question each, drawn from `seed`'s stream, less those whose object
    (shape, colour, place) is in `exclude` (with one object there are only 3 x 7 x 10 x 10 scenes: the streams meet)."""
    rng, rows = random.Random(seed), []
    last = GRID - PATTERN
    for i in range(n):
        o = SceneObject(rng.choice(CLASSIC_SHAPES), rng.choice(CLASSIC_COLORS), rng.randint(0, last), rng.randint(0, last))
        if (o.shape, o.color, o.row, o.col) in exclude:
            continue
        q, a = {"side": (f"side of the {o.color} one?", "left" if 2 * o.col + PATTERN < GRID else "right"),
                "column": (f"column of the {o.color} one?", str(o.col)),
                "colour": (f"colour of the {o.shape}?", o.color)}[args.question]
        rows.append({"prompt": {"prompt": q, "images": [Scene([o], GRID).render(CELL_PX)]}, "answer": a, "qtype": args.question,
                     "object": (o.shape, o.color, o.row, o.col)})
    return rows


torch.set_num_threads(1)
register()
arch = dict(SHAPES_VQA_QWEN3_DEEP_ARCH, position_table_scale=args.pos_scale, **({"text_first": True} if args.text_first else {}))
policy = build_untrained(dataclasses.replace(spec_for("shapes-vqa-qwen3"), name="side-sanity", arch=arch))
held_out = one_object_rows(200, HELD_OUT_SEED)
held_objects = frozenset(r["object"] for r in held_out)
rows = one_object_rows(args.scenes, TRAIN_SEED, exclude=held_objects)  # no held-out scene is trained on
answers = [r["answer"] for r in held_out]
majority = max(answers.count(a) for a in set(answers)) / len(answers)
print(f"{args.question}: {len(rows)} training scenes ({len({r['object'] for r in rows})} distinct), {len(held_out)} "
      f"held out ({len(held_objects)} distinct, none trained on), held-out majority answer {majority:.3f}", flush=True)


def evaluate() -> dict:
    acc = {name: sum(vqa_items(policy, part)[1]) / len(part) for name, part in (("held_out", held_out), ("train", rows[:200]))}
    print(time.strftime("%H:%M:%S"), {k: round(x, 3) for k, x in acc.items()}, flush=True)
    return acc


history = vlm_sft(policy, [r["prompt"] for r in rows], [r["answer"] for r in rows], steps=args.steps, batch_size=32,
                  lr=2e-3, seed=0, eval_fn=evaluate, eval_every=args.every, progress=False)
report = {"args": vars(args), "held_out_majority": majority,
          "evals": [{"step": h["step"], **h["eval"]} for h in history if "eval" in h],
          "loss_every_50": [round(sum(h["loss"] for h in history[i:i + 50]) / len(history[i:i + 50]), 4)
                            for i in range(0, len(history), 50)]}
with open(args.out, "w") as f:
    json.dump(report, f, indent=1)
