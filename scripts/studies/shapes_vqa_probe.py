"""Study (docs/RESULTS.md, "Issue 25, item 5": the probes): which question types can the tiny VLM learn at all?
Trains a fresh `shapes-vqa-reads-deep`-shaped model (or the narrow one) on chosen question types with TRUE labels
(no label noise), optionally with a curriculum and config overrides, and prints the greedy accuracy per type on the
VALIDATION split (and on 300 training rows, to tell under- from over-fitting) every `--every` steps. The test split
is never read. Writes OUT (json): the eval points and the loss every 50 steps.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_probe.py OUT.json --arch deep --steps 2000 --types shape
    ... --types count,colour,shape,position --rope-theta 10 --phases '[[["shape", "colour"], 2500]]'
"""
import argparse
import copy
import dataclasses
import json
import time

import torch

from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import SHAPES_VQA_ARCH, SHAPES_VQA_DEEP_ARCH, SHAPES_VQA_QWEN3_ARCH, build_untrained, spec_for
from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES
from mmrl.tiny_world.vlm_pretrain import vlm_sft
from mmrl.tiny_world.vqa_rl import vqa_accuracy, vqa_items

ARCHS = {"narrow": SHAPES_VQA_ARCH, "deep": SHAPES_VQA_DEEP_ARCH, "qwen3": SHAPES_VQA_QWEN3_ARCH}
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("out", help="results file (json)")
parser.add_argument("--arch", choices=sorted(ARCHS), default="deep")
parser.add_argument("--steps", type=int, default=2000)
parser.add_argument("--lr", type=float, default=2e-3)
parser.add_argument("--types", default="shape", help=f"comma-separated question types among {QUESTION_TYPES}")
parser.add_argument("--every", type=int, default=250, help="evaluation every this many steps")
parser.add_argument("--rope-theta", type=float, default=None, help="the text model's RoPE base (default the arch's, 1e4)")
parser.add_argument("--text-layers", type=int, default=None, help="text decoder layers (default the arch's, 2)")
parser.add_argument("--text-first", action="store_true", help="put the question before the image in the user turn")
parser.add_argument("--all-position-pairs", action="store_true",
                    help="train on every position question each training scene supports, not the task's one per scene")
parser.add_argument("--position-by-colour", action="store_true",
                    help="position questions name each object by its colour alone ('red one left or right of blue one?', "
                         "both colours unique in the scene), in training and validation: the shape questions' form")
parser.add_argument("--aux-side", action="store_true",
                    help="add to the TRAINING rows one auxiliary question per training scene, 'side of the red one?' -> "
                         "'left' / 'right' (the object's half of the image; colours unique in the scene, objects "
                         "clear of the middle): a one-hop column read, like the shape questions' colour lookup")
parser.add_argument("--pos-scale", type=float, default=None,
                    help="Qwen3-VL: multiply the vision tower's initial absolute position table by this (its init std is "
                         "0.02 against about 3.3 for the patch embeddings; scripts/studies/shapes_vqa_columns.py)")
parser.add_argument("--phases", default="[]", help='curriculum, json: [[["shape", "colour"], 2500], ...]')
parser.add_argument("--save", default=None, help="save the trained model here (a vlm adapter directory: "
                    "shapes_vqa_columns.py --model DIR reads its columns)")
args = parser.parse_args()
types = args.types.split(",")
if bad := [t for t in types if t not in QUESTION_TYPES]:
    raise SystemExit(f"--types must be among {QUESTION_TYPES}, got {bad}")
torch.set_num_threads(1)
register()
arch = copy.deepcopy(ARCHS[args.arch])
if args.rope_theta is not None:
    arch["text_config"]["rope_parameters"] = {**arch["text_config"]["rope_parameters"], "rope_theta": args.rope_theta}
if args.text_layers is not None:
    arch["text_config"]["num_hidden_layers"] = args.text_layers
policy = build_untrained(dataclasses.replace(spec_for("shapes-vqa-reads-deep"), arch=arch))
if args.pos_scale is not None:
    visual = policy.model.model.visual
    if not hasattr(visual, "pos_embed"):
        raise SystemExit(f"--pos-scale needs a vision tower with an absolute position table (--arch qwen3), not {args.arch}")
    with torch.no_grad():
        visual.pos_embed.weight.mul_(args.pos_scale)
task = load_task("shapes_vqa")
rows = [r for r in task.train if r["qtype"] in types]
val = [r for r in task.validation if r["qtype"] in types]


def text_first(row: dict) -> dict:
    """The row with its question before the image (one user turn: text block, then image block)."""
    p = row["prompt"]
    content = [{"type": "text", "text": p["prompt"]}, {"type": "image"}]
    return {**row, "prompt": {"prompt": [{"role": "user", "content": content}], "images": p["images"]}}


def shuffled(rows: list[dict]) -> list[dict]:
    """`rows` in a fixed random order, so that the training probe (the first 300 rows) draws from every type."""
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
    return [rows[i] for i in order]


def all_position_rows() -> list[dict]:
    """Every (ordered pair) position question of every training scene: the task draws one per scene (1,946 rows);
    the same training scenes support about three times as many. Validation and test are untouched."""
    from mmrl.tiny_world import shapes_vqa as sv

    scenes = sv.split_scenes()["train"]
    return [{"prompt": {"prompt": q, "images": [s.render(sv.CELL_PX)]}, "answer": a, "qtype": "position", "scene": f"train-{i}"}
            for i, s in enumerate(scenes) for q, a in sv.scene_questions(s)["position"]]


if args.all_position_pairs:
    rows = shuffled([r for r in rows if r["qtype"] != "position"] + (all_position_rows() if "position" in types else []))
def colour_position_rows(split: str) -> list[dict]:
    """One colour-named position question per scene of `split` ("train" or "validation") that supports one (two
    objects of colours unique in the scene, pattern columns at least MIN_DX apart), drawn with a fixed seed; the
    scenes are the task's own, in its order (the other question types are unchanged)."""
    import random

    from mmrl.tiny_world import shapes_vqa as sv

    scenes = sv.split_scenes()[split]
    rng, out = random.Random(11), []
    for i, scene in enumerate(scenes):
        unique = [o for o in scene.objects if sum(p.color == o.color for p in scene.objects) == 1]
        qa = [(f"{a.color} one left or right of {b.color} one?", "left" if a.col < b.col else "right")
              for a in unique for b in unique if a is not b and abs(a.col - b.col) >= sv.MIN_DX]
        if qa:
            q, ans = rng.choice(qa)
            out.append({"prompt": {"prompt": q, "images": [scene.render(sv.CELL_PX)]}, "answer": ans, "qtype": "position",
                        "scene": f"{split}-{i}"})
    return out


if args.position_by_colour and "position" in types:
    rows = shuffled([r for r in rows if r["qtype"] != "position"] + colour_position_rows("train"))
    val = [r for r in val if r["qtype"] != "position"] + colour_position_rows("validation")
    print(f"colour-named position questions: {sum(r['qtype'] == 'position' for r in rows)} training, "
          f"{sum(r['qtype'] == 'position' for r in val)} validation", flush=True)
def side_rows() -> list[dict]:
    """The `--aux-side` training questions (qtype "side"; never in validation or test)."""
    import random

    from mmrl.tiny_world import shapes_vqa as sv
    from mmrl.tiny_world.shapes import GRID, PATTERN

    scenes = sv.split_scenes()["train"]
    rng, out = random.Random(12), []
    for i, scene in enumerate(scenes):
        qa = [(f"side of the {o.color} one?", "left" if 2 * o.col + PATTERN < GRID else "right")
              for o in scene.objects if sum(p.color == o.color for p in scene.objects) == 1
              and 2 * o.col + PATTERN != GRID]  # an object centred on the middle column has no side
        if qa:
            q, ans = rng.choice(qa)
            out.append({"prompt": {"prompt": q, "images": [scene.render(sv.CELL_PX)]}, "answer": ans, "qtype": "side",
                        "scene": f"train-{i}"})
    return out


if args.aux_side:
    rows = shuffled(rows + side_rows())
    print(f"auxiliary side questions: {sum(r['qtype'] == 'side' for r in rows)} training rows", flush=True)
if args.text_first:
    rows, val = [text_first(r) for r in rows], [text_first(r) for r in val]
train_probe = rows[:300]


side_probe = [r for r in rows if r["qtype"] == "side"][:200]  # --aux-side: is the one-hop column read learnt?


def evaluate() -> dict:
    v, t = vqa_accuracy(policy, val), vqa_accuracy(policy, train_probe)
    if side_probe:
        scores = vqa_items(policy, side_probe)[1]
        t["side"] = sum(scores) / len(scores)
    print(time.strftime("%H:%M:%S"), "validation", {k: round(x, 3) for k, x in v.items()},
          "train", {k: round(x, 3) for k, x in t.items()}, flush=True)
    return {"validation": v, "train": t}


phases = [(t, k) for t, k in json.loads(args.phases)]
history = vlm_sft(policy, [r["prompt"] for r in rows], [r["answer"] for r in rows], steps=args.steps, batch_size=32,
                  lr=args.lr, seed=0, groups=[r["qtype"] for r in rows] if phases else None, phases=phases,
                  eval_fn=evaluate, eval_every=args.every, progress=False)
report = {"args": vars(args), "parameters": sum(p.numel() for p in policy.model.parameters()),
          "evals": [{"step": h["step"], **h["eval"]} for h in history if "eval" in h],
          "loss_every_50": [round(sum(h["loss"] for h in history[i:i + 50]) / len(history[i:i + 50]), 4)
                            for i in range(0, len(history), 50)]}
with open(args.out, "w") as f:
    json.dump(report, f, indent=1)
if args.save:
    policy.save_pretrained(args.save)
