"""Prompts and rewards for trainer tests on tiny random models of every family (rewards vary on random outputs)."""
from __future__ import annotations

from PIL import Image

import mmrl.methods
import mmrl.models

FAMILIES = list(mmrl.models.FAMILIES)
"""Every registered model family (the adapter table): the method x family matrix grows with it."""
METHODS = list(mmrl.methods.METHODS)
"""Every registered method (the `METHODS` registry)."""
CELLS = [(m, f) for m in METHODS for f in FAMILIES
         if mmrl.methods.METHODS[m].supports_family(mmrl.models.adapter_class(f))]
"""The method x family matrix: every pair whose method runs on the family (`Method.supports_family`)."""


def vowel_reward(prompts, completions, **kwargs):
    """Fraction of vowels in a text completion (varies across random samples)."""
    return [sum(ch in "aeiou" for ch in c) / (1 + len(c)) for c in completions]


def brightness_reward(prompts, completions, **kwargs):
    """Mean brightness of a PIL image in [0, 1]."""
    import numpy as np

    return [float(np.asarray(img.convert("L"), dtype=np.float64).mean() / 255.0) for img in completions]


def dataset_for(family: str, n: int = 16) -> list[dict]:
    if family == "vlm":
        return [{"prompt": f"what colour {i}?", "images": [Image.new("RGB", (28, 28), (10 * i % 255, 80, 160))]} for i in range(n)]
    if family in ("janus", "masked_image"):
        return [{"prompt": f"a red square {i}"} for i in range(n)]
    return [{"prompt": f"say a {i}"} for i in range(n)]


def reward_for(family: str):
    return brightness_reward if family in ("janus", "masked_image") else vowel_reward


def shapes_image_folders(root, n_prompts: int, n_images: int = 2):
    """`n_prompts` shapes-world GenEval prompt folders under `root` (metadata.jsonl + samples/), drawn by the exact
    oracle renderer, `n_images` each; returns `root`."""
    import json

    from mmrl.geneval.prompts import generate_suite, vocabulary
    from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES, OraclePolicy

    names, colors = vocabulary("shapes", {"shapes": (SHAPE_NAMES, COLORS)})
    records = generate_suite(1, 1, names, colors, 4)[:n_prompts]
    oracle = OraclePolicy(seed=0)
    for i, record in enumerate(records):
        folder = root / f"{i:05d}"
        (folder / "samples").mkdir(parents=True)
        (folder / "metadata.jsonl").write_text(json.dumps(record) + "\n")
        for j, im in enumerate(oracle.sample([record["prompt"]], n_images).completions):
            im.save(folder / "samples" / f"{j:04d}.png")
    return root
