"""Diagnostic (docs/RESULTS.md, "Issue 25, item 5"): can the column of an image token be read off the visual features
the text model receives? For a shapes_vqa base (`--base`, default `shapes-vqa-qwen3`), a linear classifier (softmax
regression on standardised features, Adam) is fitted on the merged image tokens of TRAIN_IMAGES training images to
predict each token's column (6 columns of 2 x 2 cells, chance 1/6) and scored on the tokens of the validation images,
split into tokens that hold part of an object and background tokens (same pixels everywhere: their features can
differ only through position). Also prints how much the features change when the vision tower's absolute position
table is zeroed (Qwen3-VL only). Validation images only for the score; nothing is written.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_columns.py [--base shapes-vqa-qwen3]
"""
import argparse

import numpy as np
import torch

from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy
from mmrl.tiny_world.read_out import linear_read_out
from mmrl.tiny_world.shapes_vqa import CELL_PX, GRID
from mmrl.tiny_world.vqa_rl import vqa_base_option

TRAIN_IMAGES, VALIDATION_IMAGES = 400, 80
MERGE = 2
"""Cells per merged image token along each side (4-pixel patches, one per cell, merged 2 x 2)."""
BACKGROUND_TOLERANCE = 30
"""Summed RGB distance from the background grey above which a pixel belongs to an object."""

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--base", default="shapes-vqa-qwen3", type=vqa_base_option)
parser.add_argument("--model", default=None, help="a saved vlm adapter directory instead of --base (e.g. "
                    "shapes_vqa_probe.py --save DIR)")
args = parser.parse_args()
name = args.model or args.base
torch.set_num_threads(1)
torch.manual_seed(0)
register()
if args.model:
    from mmrl.models import adapter_class

    policy = adapter_class("vlm").from_pretrained(args.model)
else:
    policy = load_base_policy(name, progress=False)
task = load_task("shapes_vqa")
side = GRID // MERGE  # merged tokens per row
px = CELL_PX * MERGE  # pixels per merged token


def image_rows(rows, n):
    seen, out = set(), []
    for r in rows:  # one row per scene: the features depend on the image only
        if r["scene"] not in seen:
            seen.add(r["scene"])
            out.append(r)
        if len(out) == n:
            break
    return out


@torch.no_grad()
def tokens(rows):
    """Merged-token features [n * side^2, H], their columns, and whether each holds object pixels."""
    feats, cols, obj = [], [], []
    for r in rows:
        _, extras = policy.encode_prompts([r["prompt"]])[:2]
        out = policy.model.model.get_image_features(pixel_values=extras["pixel_values"][0], image_grid_thw=extras["image_grid_thw"][0])
        f = out.pooler_output[0]  # [side^2, H], raster order of the merged grid
        pixels = np.asarray(r["prompt"]["images"][0].convert("RGB")).astype(float)  # [px*side, px*side, 3]
        grey = pixels[0, 0]
        for k in range(side * side):
            row, col = divmod(k, side)
            block = pixels[row * px : (row + 1) * px, col * px : (col + 1) * px]
            feats.append(f[k])
            cols.append(col)
            obj.append(bool((np.abs(block - grey).sum(-1) > BACKGROUND_TOLERANCE).any()))
    return torch.stack(feats).float(), torch.tensor(cols), torch.tensor(obj)


x_tr, y_tr, _ = tokens(image_rows(task.train, TRAIN_IMAGES))
x_va, y_va, obj = tokens(image_rows(task.validation, VALIDATION_IMAGES))
fit, predicted = linear_read_out(x_tr, y_tr, x_va, side, steps=3000)
hit = predicted.eq(y_va).float()
print(f"{name}: column of a merged image token from its visual features, linear read-out ({side} columns, chance "
      f"{1 / side:.3f}): training tokens {fit:.3f}; validation tokens {hit.mean():.3f}, object tokens {hit[obj].mean():.3f} "
      f"(n={int(obj.sum())}), background tokens {hit[~obj].mean():.3f} (n={int((~obj).sum())})")
visual = policy.model.model.visual
if hasattr(visual, "pos_embed"):  # Qwen3-VL's learned absolute positions
    with torch.no_grad():
        r = image_rows(task.validation, 1)[0]
        _, extras = policy.encode_prompts([r["prompt"]])[:2]
        kw = dict(pixel_values=extras["pixel_values"][0], image_grid_thw=extras["image_grid_thw"][0])
        full = policy.model.model.get_image_features(**kw).pooler_output[0]
        table = visual.pos_embed.weight.clone()
        visual.pos_embed.weight.zero_()
        without = policy.model.model.get_image_features(**kw).pooler_output[0]
        visual.pos_embed.weight.copy_(table)
        patches = visual.patch_embed(kw["pixel_values"])
    print(f"position table std {float(table.std()):.3f} against the patch embeddings' {float(patches.std()):.3f}; zeroing it "
          f"moves the merged features by {float((full - without).abs().mean()):.3f} on average (their mean size "
          f"{float(full.abs().mean()):.3f})")
