"""`shapes_vqa`: visual questions about shapes-world scenes, for the tiny vision-language model (family `vlm`).

A row is a rendered scene (`mmrl.tiny_world.shapes`: 1-4 shapes on the 12 x 12 cell grid, random shapes, colours and
places, `CELL_PX` pixels per cell, so one 4-pixel vision patch of the tiny Qwen2.5-VL is one cell), one question
and its one-word answer, computed from the scene's objects:

    count     "how many circles?"                         -> "0" .. "4"
    colour    "colour of the square?"                     -> "red" (only shapes present exactly once)
    shape     "shape of the blue one?"                    -> "circle" (only colours present exactly once)
    position  "red circle left or right of blue square?"  -> "left" / "right" (both objects unique by colour and
              shape, pattern columns at least `MIN_DX` cells apart)

(short questions: the tiny model's tokenizer is by character, and every token costs in each RL step)

Every scene gets one question of each type it supports (drawn at random among that type's templates), so the
four types are about equally frequent.

Split (leak-free): train and test scenes come from disjoint seed streams, and a training scene whose cell grid
equals that of any test scene is dropped, so no test image is ever seen in training, under any question; the
question templates (type x shape / colour combination) are shared, as a VQA benchmark's are. `info` records the
sizes and the number of dropped duplicates.

Reward `shapes_vqa` (also the metric): 1 when the response, normalised (`normalise_answer`: lower case, outer
spaces and trailing punctuation stripped), equals the answer, else 0.
"""
from __future__ import annotations

import random
import re
from functools import lru_cache

import numpy as np

from mmrl.algorithms.registry import REWARDS
from mmrl.tiny_world.shapes import CLASSIC_COLORS as COLORS, CLASSIC_SHAPES as SHAPE_NAMES  # its original vocabulary
from mmrl.tiny_world.shapes import GAP, GRID, PATTERN, Scene, SceneObject
from mmrl.data.tasks import TASKS, Task
from mmrl.rewards.completions import completion_text

QUESTION_TYPES = ("count", "colour", "shape", "position")
"""The question types, in the order rows of a scene are written."""
CELL_PX = 4
"""Pixels per cell of the rendered images (12 cells -> 48 px: 144 vision patches of 4 px, one per cell, merged 2 x 2
into 36 image tokens; task version 3. Version 2 drew 24 px images, 2 x 2 cells per patch, 9 image tokens)."""
IMAGE_PX = GRID * CELL_PX
"""Side of the rendered images, in pixels."""
MAX_SHAPES = 4
"""Shapes per scene: 1 .. MAX_SHAPES."""
MIN_DX = 2
"""Least horizontal distance (cells) between two objects' pattern columns for a left/right question."""
TRAIN_SCENES, TEST_SCENES = 3000, 200
"""Scenes per split (about 3 rows per scene)."""
TRAIN_SEED, TEST_SEED = 101, 202
"""Seeds of the two scene streams (disjoint `random.Random` streams; duplicates are removed on top)."""
VALIDATION_SCENES, VALIDATION_SEED = 100, 303
"""Validation scenes (curves and choices) and their stream; none of them is a test or training scene."""
ANSWER_WORDS: tuple[str, ...] = tuple(str(k) for k in range(MAX_SHAPES + 1)) + COLORS + SHAPE_NAMES + ("left", "right")
"""Every answer the task can have."""
AUX_QUESTION_TYPES = ("column", "column_named", "side", "side_one")
"""Question types for pre-training only, never in the task's splits (`auxiliary_rows`):

    column        "column of the red one?"     -> "0" .. "9" (the object's leftmost cell column; its colour unique)
    column_named  "column of the red circle?"  -> "0" .. "9" (named as a position question names it: colour and
                  shape, the pair unique in the scene)
    side          "side of the red one?"       -> "left" / "right" (the object's half of the image; colour unique)
    side_one      "side of the red one?" about the only object of a one-object scene: training rows from scenes of
                  their own (`one_object_scenes`), validation rows from the validation split's one-object scenes

A left/right answer has a prior that earns half the reward without looking, and on it the tiny VLM stays at one
constant answer; a column has ten about equally likely answers, so (as colour did for the other types, docs/RESULTS.md
"Issue 25, item 5") its loss falls only once the model reads where the named object is. With one object in the scene
nothing has to be found, and the tiny VLM learns its side within 1,000 steps (the one-object study): `side_one`, as
a first curriculum phase, lays the path from a column to the answer before other objects have to be told apart."""

WORD_AUX_TYPES = ("column", "column_named")
"""The auxiliary types whose words `vocabulary()` holds: those of the word-token bases as built (the side questions
came later, and no word-token base asks them; adding their words would change those bases' embeddings)."""
ONE_OBJECT_SCENES, ONE_OBJECT_SEED = 3000, 505
"""One-object training scenes of `side_one` and their stream (`one_object_scenes`)."""


def random_scene(rng: random.Random, grid: int = GRID) -> Scene:
    """1 .. MAX_SHAPES shapes of random shape and colour, at random places on the grid, never touching."""
    n = rng.randint(1, MAX_SHAPES)
    last = grid - PATTERN
    while True:
        placed: list[SceneObject] = []
        for _ in range(n):
            for _ in range(200):
                row, col = rng.randint(0, last), rng.randint(0, last)
                if all(max(abs(o.row - row), abs(o.col - col)) >= PATTERN + GAP for o in placed):
                    placed.append(SceneObject(rng.choice(SHAPE_NAMES), rng.choice(COLORS), row, col))
                    break
        if len(placed) == n:
            return Scene(placed, grid)


def plural(shape: str) -> str:
    return shape + "s"


def scene_questions(scene: Scene) -> dict[str, list[tuple[str, str]]]:
    """question type -> every (question, answer) the scene supports, computed from its objects."""
    objs = scene.objects
    out: dict[str, list[tuple[str, str]]] = {t: [] for t in QUESTION_TYPES}
    for s in SHAPE_NAMES:
        out["count"].append((f"how many {plural(s)}?", str(sum(o.shape == s for o in objs))))
        same = [o for o in objs if o.shape == s]
        if len(same) == 1:
            out["colour"].append((f"colour of the {s}?", same[0].color))
    for c in COLORS:
        same = [o for o in objs if o.color == c]
        if len(same) == 1:
            out["shape"].append((f"shape of the {c} one?", same[0].shape))
    unique = [o for o in objs if sum(p.shape == o.shape and p.color == o.color for p in objs) == 1]
    for a in unique:
        for b in unique:
            if a is not b and abs(a.col - b.col) >= MIN_DX:
                out["position"].append((f"{a.color} {a.shape} left or right of {b.color} {b.shape}?",
                                        "left" if a.col < b.col else "right"))
    return out


def auxiliary_questions(scene: Scene, qtype: str) -> list[tuple[str, str]]:
    """Every (question, answer) of the pre-training-only type `qtype` (`AUX_QUESTION_TYPES`) the scene supports."""
    if qtype not in AUX_QUESTION_TYPES:
        raise ValueError(f"auxiliary question type must be one of {AUX_QUESTION_TYPES}, got {qtype!r}")
    objs = scene.objects
    if qtype in ("side", "side_one"):  # 2 * col + PATTERN is odd: no object is centred on the middle
        return [(f"side of the {o.color} one?", "left" if 2 * o.col + PATTERN < scene.grid else "right") for o in objs
                if sum(p.color == o.color for p in objs) == 1 and (qtype == "side" or len(objs) == 1)]
    if qtype == "column_named":
        return [(f"column of the {o.color} {o.shape}?", str(o.col)) for o in objs
                if sum(p.color == o.color and p.shape == o.shape for p in objs) == 1]
    return [(f"column of the {o.color} one?", str(o.col)) for o in objs if sum(p.color == o.color for p in objs) == 1]


def auxiliary_rows(qtype: str, split: str, seed: int = 13) -> list[dict]:
    """One `qtype` question per scene of `split` ("train" or "validation") that supports one, drawn with a fixed seed,
    as task rows (the scenes and ids of `split_scenes`; `side_one`'s training rows: `one_object_scenes`, ids
    `one-object-i`). Training rows add a pre-training signal; validation rows show its curve. The test split has none."""
    if split not in ("train", "validation"):
        raise ValueError(f"auxiliary rows exist for the train and validation splits, got {split!r}")
    rng, out = random.Random(seed), []
    if qtype == "side_one" and split == "train":
        scenes, prefix = one_object_scenes(), "one-object"
    else:
        scenes, prefix = split_scenes()[split], split
    for i, scene in enumerate(scenes):
        if qa := auxiliary_questions(scene, qtype):
            q, a = rng.choice(qa)
            out.append({"prompt": {"prompt": q, "images": [scene.render(CELL_PX)]}, "answer": a, "qtype": qtype,
                        "scene": f"{prefix}-{i}"})
    return out


@lru_cache(maxsize=1)
def one_object_scenes() -> list[Scene]:
    """`ONE_OBJECT_SCENES` draws of one object (random shape, colour and place) from their own stream, less any equal
    to a validation or test scene (with one object there are only 3 x 7 x 10 x 10 scenes, so the streams meet): the
    `side_one` training scenes, where the only object's side is the answer and nothing has to be found."""
    rng = random.Random(ONE_OBJECT_SEED)
    last = GRID - PATTERN
    held = {cells_key(s) for split in ("validation", "test") for s in split_scenes()[split]}
    scenes = [Scene([SceneObject(rng.choice(SHAPE_NAMES), rng.choice(COLORS), rng.randint(0, last), rng.randint(0, last))], GRID)
              for _ in range(ONE_OBJECT_SCENES)]
    return [s for s in scenes if cells_key(s) not in held]


def every_question_rows(qtype: str, split: str) -> list[dict]:
    """Every question of the task's type `qtype` (`QUESTION_TYPES`) that each scene of `split` ("train" or
    "validation") supports, as task rows (the task's rows hold one per scene and type). For pre-training: a position
    question has about four ordered pairs per scene, and the task's one per scene is a small set to learn a relation from."""
    if qtype not in QUESTION_TYPES:
        raise ValueError(f"question type must be one of {QUESTION_TYPES}, got {qtype!r}")
    if split not in ("train", "validation"):
        raise ValueError(f"every_question_rows reads the train or validation split, got {split!r}")
    return [{"prompt": {"prompt": q, "images": [scene.render(CELL_PX)]}, "answer": a, "qtype": qtype, "scene": f"{split}-{i}"}
            for i, scene in enumerate(split_scenes()[split]) for q, a in scene_questions(scene)[qtype]]


def vocabulary() -> list[str]:
    """Every word of the task's and the pre-training-only questions and answers (a word-level tokenizer's vocabulary),
    from one scene per shape and colour pair of each kind, so that every template meets every colour and shape."""
    from mmrl.models.tokenizers import words_of

    texts = list(ANSWER_WORDS) + [str(c) for c in range(GRID - PATTERN + 1)]
    for i, (s, c) in enumerate((s, c) for s in SHAPE_NAMES for c in COLORS):
        other = SceneObject(SHAPE_NAMES[(i + 1) % len(SHAPE_NAMES)], COLORS[(i + 1) % len(COLORS)], 0, GRID - PATTERN)
        scene = Scene([SceneObject(s, c, 0, 0), other], GRID)
        texts += [q for qa in scene_questions(scene).values() for q, _ in qa]
        texts += [q for t in WORD_AUX_TYPES for q, _ in auxiliary_questions(scene, t)]
    return words_of(texts)


def scene_rows(scene: Scene, rng: random.Random, scene_id: str) -> list[dict]:
    """One row per question type the scene supports (a random question of that type)."""
    image = scene.render(CELL_PX)
    rows = []
    for qtype, qa in scene_questions(scene).items():
        if qa:
            q, a = rng.choice(qa)
            rows.append({"prompt": {"prompt": q, "images": [image]}, "answer": a, "qtype": qtype, "scene": scene_id})
    return rows


def _scenes(n: int, seed: int) -> list[Scene]:
    rng = random.Random(seed)
    return [random_scene(rng) for _ in range(n)]


def cells_key(scene: Scene) -> bytes:
    """Identity of a scene's image (its cell grid)."""
    return np.ascontiguousarray(scene.cells()).tobytes()


@lru_cache(maxsize=1)
def split_scenes() -> dict[str, list[Scene]]:
    """The scenes of each split ("train", "validation", "test"), in the task's order (a row's "scene" id `split-i`
    indexes them): validation scenes equal to a test scene and training scenes equal to either are dropped."""
    test_scenes = _scenes(TEST_SCENES, TEST_SEED)
    held = {cells_key(s) for s in test_scenes}
    val_scenes = [s for s in _scenes(VALIDATION_SCENES, VALIDATION_SEED) if cells_key(s) not in held]
    held |= {cells_key(s) for s in val_scenes}
    train_scenes = [s for s in _scenes(TRAIN_SCENES, TRAIN_SEED) if cells_key(s) not in held]
    return {"train": train_scenes, "validation": val_scenes, "test": test_scenes}


@lru_cache(maxsize=1)
def _shapes_vqa_task() -> Task:
    scenes = split_scenes()
    test_scenes, val_scenes, train_scenes = scenes["test"], scenes["validation"], scenes["train"]
    rng = random.Random(7)
    train = [r for i, s in enumerate(train_scenes) for r in scene_rows(s, rng, f"train-{i}")]
    test = [r for i, s in enumerate(test_scenes) for r in scene_rows(s, rng, f"test-{i}")]
    validation = [r for i, s in enumerate(val_scenes) for r in scene_rows(s, random.Random(8 + i), f"validation-{i}")]
    info = {"train_scenes": len(train_scenes), "validation_scenes": len(val_scenes), "test_scenes": len(test_scenes),
            "dropped_duplicates": TRAIN_SCENES - len(train_scenes), "train_rows": len(train), "test_rows": len(test),
            "validation_rows": len(validation), "image_px": IMAGE_PX}
    return Task("shapes_vqa", train, test, ["shapes_vqa"], "shapes_vqa", family="vlm", info=info, validation=validation)


@TASKS.register("shapes_vqa")
def _shapes_vqa(dataset_path: str | None, seed: int) -> Task:
    return _shapes_vqa_task()  # the split is part of the task definition, not of a run's seed


_TRAILING_PUNCTUATION = ".!?,;:"


def normalise_answer(text: str) -> str:
    """Lower case, outer whitespace and trailing punctuation removed, inner whitespace collapsed. (A loop, not the
    regex `[\\s.!?,;:]+$`, which retries every start of a long punctuation run: quadratic.)"""
    text = text.strip().lower()
    end = len(text)
    while end and (text[end - 1].isspace() or text[end - 1] in _TRAILING_PUNCTUATION):
        end -= 1
    return " ".join(text[:end].split())


@REWARDS.register("shapes_vqa")
def shapes_vqa(prompts, completions, answer, **kwargs) -> list[float]:
    """Exact match of the normalised response and answer: 1.0 or 0.0."""
    return [float(normalise_answer(completion_text(c)) == normalise_answer(str(a))) for c, a in zip(completions, answer)]


def wrong_answer(answer: str, qtype: str, rng: random.Random) -> str:
    """A wrong answer of the same type (for noisy pre-training labels)."""
    pool = {"count": [str(k) for k in range(MAX_SHAPES + 1)], "colour": list(COLORS), "shape": list(SHAPE_NAMES),
            "position": ["left", "right"], "column": [str(c) for c in range(GRID - PATTERN + 1)],
            "column_named": [str(c) for c in range(GRID - PATTERN + 1)]}[qtype]
    return rng.choice([a for a in pool if a != answer])
