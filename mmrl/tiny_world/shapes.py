"""The shapes world: text-to-image over 20 coloured shapes (squares, circles, triangles, rings, ...) on a cell grid.

A scene is a `grid` x `grid` array of palette indices (`PALETTE[0]` is the grey background); every cell is one
flat colour, drawn as a `cell_px` x `cell_px` block of pixels. Each shape is a fixed 3 x 3 cell pattern in one
colour, and shapes never touch (not even diagonally), so the world has an exact detector: connected components of
same-colour cells whose pattern is one of `SHAPES`. Prompts and scores use the GenEval metadata schema over the shape
names (`mmrl geneval prompts --vocabulary shapes`), so the GenEval rules apply unchanged (docs/geneval.md).

A tiny Janus model's image tokens are exactly these cells: `PALETTE` lists (name, RGB) with index 0 = background and
its RGB values are the first eleven colours of `mmrl.models.image_codecs.DEFAULT_PALETTE`, so
`PaletteCodec.default(len(PALETTE), grid=(GRID, GRID), cell_px=...)` encodes and decodes these images exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

import numpy as np
from PIL import Image

PALETTE: list[tuple[str, tuple[int, int, int]]] = [
    ("background", (153, 153, 153)),  # GenEval's #999 crop background
    ("red", (220, 40, 40)),
    ("green", (40, 170, 60)),
    ("blue", (40, 80, 220)),
    ("yellow", (235, 210, 40)),
    ("purple", (150, 60, 190)),
    ("orange", (245, 140, 30)),
    ("white", (255, 255, 255)),
    ("black", (20, 20, 20)),
    ("pink", (240, 130, 190)),
    ("brown", (130, 80, 40)),
]
"""(GenEval colour name, RGB) per palette index; index 0 is the background."""
BACKGROUND = 0
COLORS: tuple[str, ...] = tuple(name for name, _ in PALETTE[1:])
"""The colour vocabulary of the world (GenEval colour names)."""
CLASSIC_COLORS: tuple[str, ...] = COLORS[:7]
"""The world's original seven colours (the question-answering world keeps them)."""
GRID = 12
"""Default cells per side."""
CELL_PX = 8
"""Default pixels per cell side (images are GRID * CELL_PX = 96 px square)."""

def _pattern(rows: str) -> np.ndarray:
    return np.array([[ch == "#" for ch in row] for row in rows.split("/")], dtype=bool)


SHAPES: dict[str, np.ndarray] = {
    # the first three are the world's original shapes; the others widen the vocabulary so that every GenEval task
    # has enough held-out compositions for a test set (mmrl.tiny_world.shapes_split)
    "square": _pattern("###/###/###"),
    "circle": _pattern(".#./###/.#."),
    "triangle": _pattern("#../##./###"),
    "ring": _pattern("###/#.#/###"),
    "tee": _pattern("###/.#./.#."),
    "ell": _pattern("#../#../###"),
    "arch": _pattern("###/#.#/#.#"),
    "cup": _pattern("#.#/#.#/###"),
    "zigzag": _pattern("##./.#./.##"),
    "stair": _pattern("#../##./.##"),
    "hook": _pattern("###/..#/.##"),
    "fork": _pattern(".#./###/#.#"),
    "wedge": _pattern("..#/.##/###"),
    "heart": _pattern("#.#/###/.#."),
    "bracket": _pattern("###/#../###"),
    "anchor": _pattern(".#./###/###"),
    "crown": _pattern("#.#/###/###"),
    "kite": _pattern(".#./##./###"),
    "flag": _pattern("###/##./#.."),
    "key": _pattern(".##/###/##."),
}
"""Shape name -> its 3 x 3 cell pattern (True = painted): 20 distinct 4-connected patterns that fill their 3 x 3 box
(a test checks both), so the detector's components map to exactly one shape."""
SHAPE_NAMES: tuple[str, ...] = tuple(SHAPES)
CLASSIC_SHAPES: tuple[str, ...] = SHAPE_NAMES[:3]
"""The world's original three shapes, which the question-answering world (`mmrl.tiny_world.shapes_vqa`) keeps."""
PATTERN = 3
"""Side of every shape pattern, in cells."""
GAP = 1
"""Empty cells kept between any two shapes (Chebyshev distance), so shapes never touch."""

_RGB = np.array([rgb for _, rgb in PALETTE], dtype=np.float64)  # [K, 3]
MAX_COLOR_DISTANCE = 0.5 * min(
    float(np.linalg.norm(_RGB[i] - _RGB[j])) for i in range(len(_RGB)) for j in range(i + 1, len(_RGB))
)
"""A cell whose mean colour is farther than this (RGB Euclidean) from every palette colour is unrecognised; half the
closest pair's distance, so a recognised cell has exactly one palette colour within reach."""
UNKNOWN = -1
"""Cell value of an unrecognised colour in `image_to_cells`."""


@dataclass(frozen=True)
class SceneObject:
    """One shape: its name, colour name and the grid cell of its pattern's top-left corner."""

    shape: str
    color: str
    row: int
    col: int

    def cell_box(self) -> tuple[int, int, int, int]:
        """(row0, col0, row1, col1), inclusive, of the pattern's 3 x 3 block."""
        return (self.row, self.col, self.row + PATTERN - 1, self.col + PATTERN - 1)


@dataclass(frozen=True)
class ShapeDetection:
    """A detected shape: name, colour name and its box [x1, y1, x2, y2] in pixels (x2, y2 exclusive)."""

    shape: str
    color: str
    box: tuple[float, float, float, float]
    score: float = 1.0


@dataclass
class Scene:
    """Shapes placed on a `grid` x `grid` cell canvas."""

    objects: list[SceneObject] = field(default_factory=list)
    grid: int = GRID

    def cells(self) -> np.ndarray:
        """[grid, grid] int64 palette indices."""
        out = np.full((self.grid, self.grid), BACKGROUND, dtype=np.int64)
        for obj in self.objects:
            idx = color_index(obj.color)
            pattern = SHAPES[obj.shape]
            block = out[obj.row : obj.row + PATTERN, obj.col : obj.col + PATTERN]
            if block.shape != pattern.shape:
                raise ValueError(f"{obj} does not fit on a {self.grid}x{self.grid} grid")
            block[pattern] = idx
        return out

    def render(self, cell_px: int = CELL_PX) -> Image.Image:
        return cells_to_image(self.cells(), cell_px)

    def boxes(self, cell_px: int = CELL_PX) -> list[tuple[float, float, float, float]]:
        """Pixel boxes [x1, y1, x2, y2] of the objects as rendered with `cell_px` (x2, y2 exclusive)."""
        return [
            (float(o.col * cell_px), float(o.row * cell_px), float((o.col + PATTERN) * cell_px), float((o.row + PATTERN) * cell_px))
            for o in self.objects
        ]


def color_index(name: str) -> int:
    for i, (n, _) in enumerate(PALETTE):
        if n == name and i != BACKGROUND:
            return i
    raise ValueError(f"unknown shapes-world colour {name!r}; valid colours: {list(COLORS)}")


def cells_to_image(cells: np.ndarray, cell_px: int = CELL_PX) -> Image.Image:
    """[h, w] palette indices -> RGB image of (w * cell_px, h * cell_px) pixels."""
    cells = np.asarray(cells)
    if cells.ndim != 2 or cells.size == 0:
        raise ValueError(f"cells must be a non-empty 2-D array of palette indices, got shape {cells.shape}")
    if cells.min() < 0 or cells.max() >= len(PALETTE):
        raise ValueError(f"palette indices must lie in [0, {len(PALETTE)}), got {cells.min()}..{cells.max()}")
    if int(cell_px) < 1:
        raise ValueError(f"cell_px must be >= 1, got {cell_px}")
    rgb = _RGB.astype(np.uint8)[cells]  # [h, w, 3]
    pixels = rgb.repeat(cell_px, axis=0).repeat(cell_px, axis=1)  # [h*cell_px, w*cell_px, 3]
    return Image.fromarray(pixels)


def _edges(size: int, grid: int) -> np.ndarray:
    """Pixel boundaries of `grid` equal cells over `size` pixels: [grid + 1] ints."""
    return np.round(np.linspace(0, size, grid + 1)).astype(np.int64)


def image_to_cells(image: Image.Image, grid: int = GRID, max_distance: float = MAX_COLOR_DISTANCE) -> np.ndarray:
    """Read the cell grid back from an image of any size: each cell's mean colour -> nearest palette index, or
    `UNKNOWN` (-1) when no palette colour lies within `max_distance`. Returns [grid, grid] int64."""
    img = image.convert("RGB")
    width, height = img.size
    if width < grid or height < grid:
        raise ValueError(f"image of {width}x{height} px is smaller than the {grid}x{grid} cell grid")
    arr = np.asarray(img, dtype=np.float64)  # [H, W, 3]
    ys, xs = _edges(height, grid), _edges(width, grid)
    # Mean of every cell via cumulative sums over the cell boundaries (cells may differ by a pixel in size).
    row_sums = np.add.reduceat(arr, ys[:-1], axis=0)  # [grid, W, 3]
    sums = np.add.reduceat(row_sums, xs[:-1], axis=1)  # [grid, grid, 3]
    counts = np.diff(ys)[:, None] * np.diff(xs)[None, :]  # [grid, grid]
    means = sums / counts[..., None]  # [grid, grid, 3]
    dist = np.linalg.norm(means[:, :, None, :] - _RGB[None, None], axis=-1)  # [grid, grid, K]
    idx = dist.argmin(-1)
    idx[dist.min(-1) > max_distance] = UNKNOWN
    return idx.astype(np.int64)


SLOT_GRID = 16
"""Cells per side of the slot layout (`mmrl.tiny_world.shape_slots`: 4 x 4 slots of 4 x 4 cells)."""
KNOWN_GRIDS = (GRID, SLOT_GRID)
"""The cell grids the world's two layouts render on, in the order `infer_grid` tries them."""


def infer_grid(image: Image.Image) -> int:
    """The cell grid an exactly rendered shapes-world image was drawn on: the first of `KNOWN_GRIDS` that divides
    the image and on which every cell is one flat colour; `GRID` when none is (a resized or compressed image).

    The order makes it unambiguous for rendered scenes: a slot-layout image with any shape has pattern edges at
    odd multiples of its cell size, which never line up with the 12-cell boundaries, so only an empty canvas (no
    detections either way) is flat on both.
    """
    arr = np.asarray(image.convert("RGB"), dtype=np.int16)  # [H, W, 3]
    height, width = arr.shape[:2]
    for grid in KNOWN_GRIDS:
        if height % grid or width % grid:
            continue
        cells = arr.reshape(grid, height // grid, grid, width // grid, 3)
        if (cells.max(axis=(1, 3)) == cells.min(axis=(1, 3))).all():
            return grid
    return GRID


def _components(cells: np.ndarray) -> list[tuple[int, list[tuple[int, int]]]]:
    """4-connected components of equal, recognised, non-background cells: [(palette index, [(row, col), ...])]."""
    h, w = cells.shape
    seen = np.zeros((h, w), dtype=bool)
    comps = []
    for r0 in range(h):
        for c0 in range(w):
            value = int(cells[r0, c0])
            if seen[r0, c0] or value in (BACKGROUND, UNKNOWN):
                continue
            stack, members = [(r0, c0)], []
            seen[r0, c0] = True
            while stack:
                r, c = stack.pop()
                members.append((r, c))
                for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
                    if 0 <= rr < h and 0 <= cc < w and not seen[rr, cc] and cells[rr, cc] == value:
                        seen[rr, cc] = True
                        stack.append((rr, cc))
            comps.append((value, members))
    return comps


def detect_cells(cells: np.ndarray) -> list[SceneObject]:
    """The exact shapes detector on a cell grid: every same-colour component whose cells form exactly one shape
    pattern becomes an object; anything else (noise, merged or broken shapes) is not detected. Objects come in
    row-major order of their first cell."""
    cells = np.asarray(cells)
    found = []
    for value, members in _components(cells):
        rows = [r for r, _ in members]
        cols = [c for _, c in members]
        r0, c0 = min(rows), min(cols)
        if max(rows) - r0 + 1 != PATTERN or max(cols) - c0 + 1 != PATTERN:
            continue
        mask = np.zeros((PATTERN, PATTERN), dtype=bool)
        for r, c in members:
            mask[r - r0, c - c0] = True
        for name, pattern in SHAPES.items():
            if np.array_equal(mask, pattern):
                found.append(SceneObject(name, PALETTE[value][0], r0, c0))
                break
    return found


def detect(image: Image.Image, grid: int = GRID, max_distance: float = MAX_COLOR_DISTANCE) -> list[ShapeDetection]:
    """The exact shapes detector on an image of any size: `image_to_cells`, then `detect_cells`; boxes are the
    pixel extent of each pattern's 3 x 3 block (cell boundaries as in `image_to_cells`), score 1."""
    width, height = image.size
    ys, xs = _edges(height, grid), _edges(width, grid)
    out = []
    for obj in detect_cells(image_to_cells(image, grid, max_distance)):
        r0, c0, r1, c1 = obj.cell_box()
        out.append(ShapeDetection(obj.shape, obj.color, (float(xs[c0]), float(ys[r0]), float(xs[c1 + 1]), float(ys[r1 + 1]))))
    return out


def _free(placed: Sequence[SceneObject], row: int, col: int) -> bool:
    spacing = PATTERN + GAP
    return all(max(abs(o.row - row), abs(o.col - col)) >= spacing for o in placed)


def capacity(grid: int = GRID) -> int:
    """The most shapes a `grid` x `grid` canvas holds on the tightest (corner-aligned) packing."""
    per_side = (grid - PATTERN) // (PATTERN + GAP) + 1
    return per_side * per_side


def scene_for_metadata(
    metadata: Mapping[str, Any],
    rng: np.random.Generator | int | None = None,
    *,
    grid: int = GRID,
    max_tries: int = 2000,
    lattice: int = 1,
) -> Scene:
    """A random scene that satisfies a GenEval metadata record under the official GenEval rule (exact counts,
    colours, relative positions with the 0.1 margin): objects of the include clauses (uncoloured ones in random
    colours), nothing else, placed at random until the rule accepts the scene. For the tiny world's pre-training
    data and the oracle policy.

    `lattice` > 1 puts every pattern's top-left corner on multiples of `lattice` cells (the slot layout of
    `slot_grid`, where each slot holds at most one shape).

    Raises ValueError naming the problem when a class is not a shape, a colour is not in the palette, or the
    objects cannot be placed.
    """
    from mmrl.geneval.rules import Detection, judge, validate_metadata

    validate_metadata(metadata)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    specs: list[tuple[str, str | None]] = []
    for clause in metadata["include"]:
        if clause["class"] not in SHAPES:
            raise ValueError(f"class {clause['class']!r} is not a shape of the shapes world; valid: {list(SHAPE_NAMES)}")
        if "color" in clause and clause["color"] not in COLORS:
            raise ValueError(f"colour {clause['color']!r} is not in the shapes-world palette; valid: {list(COLORS)}")
        specs += [(clause["class"], clause.get("color"))] * int(clause["count"])
    if len(specs) > capacity(grid):
        raise ValueError(f"{len(specs)} shapes do not fit on a {grid}x{grid} grid (at most {capacity(grid)})")
    lattice = int(lattice)
    if lattice < 1 or (lattice > 1 and lattice < PATTERN + GAP):
        raise ValueError(f"lattice must be 1 or >= {PATTERN + GAP} cells (shapes may not touch), got {lattice}")
    last = (grid - PATTERN) // lattice
    for _ in range(max_tries):
        placed: list[SceneObject] = []
        for shape, color in specs:
            color = color or COLORS[int(rng.integers(len(COLORS)))]
            for _ in range(200):
                row, col = lattice * int(rng.integers(last + 1)), lattice * int(rng.integers(last + 1))
                if _free(placed, row, col):
                    placed.append(SceneObject(shape, color, row, col))
                    break
            else:
                break
        if len(placed) != len(specs):
            continue
        scene = Scene(placed, grid)
        detections = [Detection(o.shape, box, 1.0, o.color) for o, box in zip(placed, scene.boxes(CELL_PX))]
        by_class: dict[str, list] = {}
        for d in detections:
            by_class.setdefault(d.label, []).append(d)
        if judge(by_class, metadata).correct:
            return scene
    raise ValueError(f"could not place a scene for {metadata.get('prompt')!r} on a {grid}x{grid} grid in {max_tries} tries")


class OraclePolicy:
    """A perfect shapes-world generator: parses each prompt back to its GenEval record and draws a random scene
    that satisfies it. Only `sample(...).completions` is provided (an upper bound to check a GenEval pipeline
    with, not a trainable policy)."""

    family = "shapes-oracle"

    def __init__(self, grid: int = GRID, cell_px: int = CELL_PX, seed: int = 0):
        self.grid, self.cell_px = grid, cell_px
        self.rng = np.random.default_rng(seed)

    def sample(self, prompts: list, group_size: int, *, generator=None, **_: Any) -> SimpleNamespace:
        from mmrl.geneval.prompts import parse_prompt

        rng = self.rng if generator is None else np.random.default_rng(int(generator.initial_seed()))
        images = []
        for prompt in prompts:
            record = parse_prompt(prompt, SHAPE_NAMES, COLORS)
            images += [scene_for_metadata(record, rng, grid=self.grid).render(self.cell_px) for _ in range(group_size)]
        repeated = [p for p in prompts for _ in range(group_size)]
        return SimpleNamespace(completions=images, prompts=repeated, group_size=group_size)


class ShapesDetector:
    """The shapes world's exact detector (`detect` above); `grid=None` reads each image's cell grid from
    the image (`infer_grid`: the 12-cell layout or the 16-cell slot layout)."""

    name = "shapes"
    provides_colors = True

    def __init__(self, grid: int | None = None):
        self.grid = None if grid is None else int(grid)

    def detect(self, images, keys=None):
        from mmrl.geneval.rules import Detection

        return [[Detection(d.shape, d.box, d.score, d.color) for d in detect(img, self.grid or infer_grid(img))]
                for img in images]
