"""The shapes world on a slot layout: an object-level image codebook for tiny text-to-image models.

The canvas is `SLOTS` x `SLOTS` slots of `PITCH` x `PITCH` cells (a 16 x 16 cell grid); a slot is empty or holds one
shape pattern (3 x 3 cells, top-left corner of the slot, one cell of background to its right and below, so shapes
never touch). One image token is one slot: code 0 is the empty slot, code 1 + s * C + c is shape `SHAPE_NAMES[s]` in
colour `COLORS[c]` (201 codes for 20 shapes x 10 colours). The codebook's entries are pixel patches, like a VQ
codebook whose codes happen to be whole objects, so an image decoded from codes is an ordinary picture: it is
scored by the pixel-level `shapes` detector (`mmrl.tiny_world.shapes.detect` with `grid=SLOT_GRID`) under the GenEval rules,
and the detector and rules stay the real ones.

Why slots and not one token per cell: measured with throwaway prototypes (2 CPU cores), a causal image-token model
on a 16 x 16 cell grid reached only 0.43 GenEval-shapes accuracy after 10 minutes (one wrong cell at temperature 1
breaks a shape), while the same model over object slots learned to 0.6 in 3 minutes; see docs/RESULTS.md.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mmrl.tiny_world import shapes
from mmrl.tiny_world.shapes import COLORS, GAP, PALETTE, PATTERN, SHAPE_NAMES, SHAPES, Scene, SceneObject, scene_for_metadata

SLOTS = 4
"""Slots per side (the image-token grid is SLOTS x SLOTS)."""
PITCH = PATTERN + GAP
"""Cells per slot side: the pattern plus the gap that keeps shapes apart."""
SLOT_GRID = SLOTS * PITCH
"""Cells per side of the rendered canvas (what the `shapes` detector reads; `shapes.infer_grid` finds it)."""
assert SLOT_GRID == shapes.SLOT_GRID
SLOT_CELL_PX = 6
"""Pixels per cell (images are SLOT_GRID * SLOT_CELL_PX = 96 px square)."""
EMPTY = 0
"""Code of the empty slot."""
NUM_CODES = 1 + len(SHAPE_NAMES) * len(COLORS)
"""Codebook size: the empty slot plus every (shape, colour)."""


def code_of(shape: str, color: str) -> int:
    """The slot code of `shape` in `color`."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; valid: {list(SHAPE_NAMES)}")
    if color not in COLORS:
        raise ValueError(f"unknown colour {color!r}; valid: {list(COLORS)}")
    return 1 + SHAPE_NAMES.index(shape) * len(COLORS) + COLORS.index(color)


def decode_code(code: int) -> tuple[str, str] | None:
    """(shape, colour) of a slot code, None for the empty slot."""
    code = int(code)
    if not 0 <= code < NUM_CODES:
        raise ValueError(f"slot codes lie in [0, {NUM_CODES}), got {code}")
    if code == EMPTY:
        return None
    s, c = divmod(code - 1, len(COLORS))
    return SHAPE_NAMES[s], COLORS[c]


def codebook_patches(cell_px: int = SLOT_CELL_PX) -> np.ndarray:
    """The pixel patch of every code: uint8 [NUM_CODES, PITCH * cell_px, PITCH * cell_px, 3] (code 0: background)."""
    rgb = np.array([c for _, c in PALETTE], dtype=np.uint8)  # [K, 3]
    cells = np.zeros((NUM_CODES, PITCH, PITCH), dtype=np.int64)  # palette index per cell; 0 = background
    for code in range(1, NUM_CODES):
        shape, color = decode_code(code)
        block = cells[code, :PATTERN, :PATTERN]
        block[SHAPES[shape]] = 1 + COLORS.index(color)
    pixels = rgb[cells]  # [NUM_CODES, PITCH, PITCH, 3]
    return pixels.repeat(cell_px, axis=1).repeat(cell_px, axis=2)


def scene_codes(scene: Scene) -> np.ndarray:
    """The slot codes [SLOTS * SLOTS] (row-major) of a scene whose objects sit on slot corners."""
    if scene.grid != SLOT_GRID:
        raise ValueError(f"slot scenes are drawn on a {SLOT_GRID}x{SLOT_GRID} grid, got {scene.grid}")
    codes = np.zeros(SLOTS * SLOTS, dtype=np.int64)
    for obj in scene.objects:
        if obj.row % PITCH or obj.col % PITCH:
            raise ValueError(f"{obj} is not on a slot corner (multiples of {PITCH} cells)")
        codes[(obj.row // PITCH) * SLOTS + obj.col // PITCH] = code_of(obj.shape, obj.color)
    return codes


def codes_scene(codes) -> Scene:
    """The scene drawn by slot codes [SLOTS * SLOTS] (the inverse of `scene_codes`)."""
    codes = np.asarray(codes).reshape(-1)
    if codes.size != SLOTS * SLOTS:
        raise ValueError(f"a slot image has {SLOTS * SLOTS} codes, got {codes.size}")
    objects = []
    for i, code in enumerate(codes.tolist()):
        sc = decode_code(code)
        if sc is not None:
            objects.append(SceneObject(sc[0], sc[1], (i // SLOTS) * PITCH, (i % SLOTS) * PITCH))
    return Scene(objects, SLOT_GRID)


def slot_codes_for_metadata(metadata: Mapping[str, Any], rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Codes [SLOTS * SLOTS] of a random slot scene that satisfies a GenEval record under the official rule."""
    return scene_codes(scene_for_metadata(metadata, rng, grid=SLOT_GRID, lattice=PITCH))
