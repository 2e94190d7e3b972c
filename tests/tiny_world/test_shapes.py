"""The shapes world: rendering, the exact detector, scenes built from GenEval records."""
import numpy as np
import pytest
from PIL import Image

from mmrl.tiny_world import shapes
from mmrl.tiny_world.shapes import (
    CELL_PX,
    COLORS,
    GRID,
    PALETTE,
    SHAPES,
    Scene,
    SceneObject,
    cells_to_image,
    detect,
    detect_cells,
    image_to_cells,
    scene_for_metadata,
)
from mmrl.geneval.prompts import generate_suite
from mmrl.geneval.rules import Detection, judge, select_detections


def test_palette_layout():
    assert PALETTE[0][0] == "background"
    assert len({rgb for _, rgb in PALETTE}) == len(PALETTE)
    # GenEval colour names only, and the background is GenEval's #999 grey
    assert set(COLORS) <= {"red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"}
    assert PALETTE[0][1] == (0x99, 0x99, 0x99)
    # a recognised cell has exactly one palette colour within reach
    rgb = np.array([c for _, c in PALETTE], float)
    d = np.linalg.norm(rgb[:, None] - rgb[None], axis=-1) + np.eye(len(rgb)) * 1e9
    assert shapes.MAX_COLOR_DISTANCE * 2 <= d.min() + 1e-9


def test_patterns_are_distinct_connected_and_fill_their_box():
    pats = list(SHAPES.values())
    assert len({p.tobytes() for p in pats}) == len(pats)
    for p in pats:
        assert p.shape == (3, 3) and p[0].any() and p[-1].any() and p[:, 0].any() and p[:, -1].any()


def test_render_pixels_by_hand():
    scene = Scene([SceneObject("circle", "red", 1, 2)], grid=6)
    img = scene.render(cell_px=2)
    assert img.size == (12, 12)
    px = np.asarray(img)
    red, grey = PALETTE[1][1], PALETTE[0][1]
    assert PALETTE[1][0] == "red"
    # circle = plus sign at rows 1..3, cols 2..4: centre cell (2, 3) painted, corner cell (1, 2) not
    assert tuple(px[2 * 2, 3 * 2]) == red and tuple(px[2 * 2 + 1, 3 * 2 + 1]) == red
    assert tuple(px[1 * 2, 2 * 2]) == grey
    assert tuple(px[1 * 2, 3 * 2]) == red  # top arm
    assert tuple(px[0, 0]) == grey
    assert scene.boxes(2) == [(4.0, 2.0, 10.0, 8.0)]


def test_cells_roundtrip_any_cell_size():
    rng = np.random.default_rng(0)
    cells = rng.integers(0, len(PALETTE), size=(GRID, GRID))
    for px in (1, 4, 8):
        assert np.array_equal(image_to_cells(cells_to_image(cells, px), GRID), cells)


def _random_scene(rng, n):
    scene = scene_for_metadata({"tag": "two_object", "prompt": "", "include": [{"class": "square", "count": 1}]}, rng)
    placed = []
    while len(placed) < n:
        if len(placed) and rng.random() < 0.01:  # restart a packing that got stuck
            placed = []
        r, c = (int(v) for v in rng.integers(0, GRID - 2, size=2))
        if all(max(abs(o.row - r), abs(o.col - c)) >= 4 for o in placed):
            placed.append(SceneObject(str(rng.choice(list(SHAPES))), str(rng.choice(COLORS)), r, c))
    scene.objects = placed
    return scene


@pytest.mark.parametrize("cell_px", [4, 8])
def test_detector_recovers_class_count_colour_and_boxes_exactly(cell_px):
    rng = np.random.default_rng(1)
    for trial in range(40):
        scene = _random_scene(rng, int(rng.integers(0, 6)))
        found = detect(scene.render(cell_px))
        want = sorted(zip([(o.shape, o.color) for o in scene.objects], scene.boxes(cell_px)))
        got = sorted(((d.shape, d.color), d.box) for d in found)
        assert got == want, trial
        assert all(d.score == 1.0 for d in found)


def test_detector_on_resized_and_noisy_images():
    rng = np.random.default_rng(2)
    scene = _random_scene(rng, 4)
    img = scene.render(8)
    arr = np.asarray(img).astype(float) + rng.normal(0, 12, size=(96, 96, 3))
    noisy = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    assert sorted((d.shape, d.color, d.box) for d in detect(noisy)) == sorted(
        (o.shape, o.color, b) for o, b in zip(scene.objects, scene.boxes(8)))
    # a 100 px image: cells are 8 or 9 px; boxes follow the cell boundaries round(i * 100 / 12)
    big = img.resize((100, 100), Image.Resampling.NEAREST)
    edges = np.round(np.linspace(0, 100, 13))
    got = sorted((d.shape, d.color, d.box) for d in detect(big))
    want = sorted((o.shape, o.color, (edges[o.col], edges[o.row], edges[o.col + 3], edges[o.row + 3])) for o in scene.objects)
    assert got == want


def test_unrecognised_blobs_are_not_detected():
    cells = np.zeros((GRID, GRID), dtype=np.int64)
    cells[0:3, 0:3][SHAPES["square"]] = 1  # a real square
    cells[6:9, 6:9][SHAPES["circle"]] = 2  # a circle ...
    cells[5, 7] = 2  # ... with a same-colour noise cell attached: no longer a circle
    cells[0:2, 8:10] = 3  # a 2x2 blob
    cells[10, 0:4] = 4  # a line
    cells[4, 4] = shapes.UNKNOWN  # an unrecognised colour
    got = detect_cells(cells)
    assert got == [SceneObject("square", PALETTE[1][0], 0, 0)]
    # an off-palette colour: the cell is unknown, so a square with one such cell is no square
    img = np.asarray(cells_to_image(np.clip(cells, 0, None), 8)).copy()
    img[0:8, 0:8] = (0, 255, 255)  # cyan is not in the palette's reach
    assert image_to_cells(Image.fromarray(img))[0, 0] == shapes.UNKNOWN
    assert [o.shape for o in detect_cells(image_to_cells(Image.fromarray(img)))] == []


def test_touching_shapes_of_different_colours_are_both_found_same_colour_merge():
    cells = np.zeros((GRID, GRID), dtype=np.int64)
    cells[0:3, 0:3][SHAPES["square"]] = 1
    cells[0:3, 3:6][SHAPES["square"]] = 2  # touching, other colour
    assert sorted(o.color for o in detect_cells(cells)) == sorted([PALETTE[1][0], PALETTE[2][0]])
    cells[0:3, 3:6][SHAPES["square"]] = 1  # touching, same colour: one 3x6 blob, not a shape
    assert detect_cells(cells) == []


def test_scenes_satisfy_their_records_for_a_whole_suite():
    suite = generate_suite(7, n=15, classnames=list(SHAPES), colors=COLORS)
    rng = np.random.default_rng(3)
    assert {r["tag"] for r in suite} == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    for record in suite:
        scene = scene_for_metadata(record, rng)
        img = scene.render(CELL_PX)
        dets = [Detection(d.shape, d.box, d.score, d.color) for d in detect(img)]
        verdict = judge(select_detections(dets, record["tag"]), record)
        assert verdict.correct, (record, verdict.reason)
        # nothing but the requested objects
        assert len(scene.objects) == sum(c["count"] for c in record["include"])


def test_scene_errors_name_the_problem():
    with pytest.raises(ValueError, match="not a shape"):
        scene_for_metadata({"tag": "single_object", "prompt": "", "include": [{"class": "dog", "count": 1}]}, 0)
    with pytest.raises(ValueError, match="palette"):
        scene_for_metadata({"tag": "colors", "prompt": "", "include": [{"class": "square", "count": 1, "color": "cyan"}]}, 0)
    with pytest.raises(ValueError, match="do not fit"):
        scene_for_metadata({"tag": "counting", "prompt": "", "include": [{"class": "square", "count": 10}]}, 0)
    with pytest.raises(ValueError, match="count"):
        scene_for_metadata({"tag": "counting", "prompt": "", "include": [{"class": "square", "count": 0}]}, 0)


def test_scenes_are_reproducible_and_varied():
    rec = {"tag": "position", "prompt": "", "include": [{"class": "circle", "count": 1},
                                                         {"class": "square", "count": 1, "position": ["left of", 0]}]}
    a = scene_for_metadata(rec, 5).cells()
    assert np.array_equal(a, scene_for_metadata(rec, 5).cells())
    assert len({scene_for_metadata(rec, s).cells().tobytes() for s in range(10)}) > 5


def test_oracle_policy_draws_what_the_prompt_says():
    pol = shapes.OraclePolicy(seed=0)
    out = pol.sample(["a photo of three circles", "a photo of a blue square"], group_size=2)
    assert len(out.completions) == 4 and out.prompts[1] == "a photo of three circles"
    assert [len(detect(im)) for im in out.completions] == [3, 3, 1, 1]
    assert {(d.shape, d.color) for d in detect(out.completions[2])} == {("square", "blue")}


def test_palette_is_the_tiny_janus_palette_codec():
    """The tiny Janus model's image tokens are these cells: its default palette codec draws exactly this world."""
    from mmrl.models.image_codecs import PaletteCodec

    codec = PaletteCodec.default(len(PALETTE), grid=(GRID, GRID), cell_px=CELL_PX)
    assert codec.palette == [rgb for _, rgb in PALETTE]
    scene = scene_for_metadata({"tag": "counting", "prompt": "", "include": [{"class": "circle", "count": 3}]}, 0)
    ids = torch_tensor(scene.cells().reshape(1, -1))
    img = codec.decode(ids)[0]
    assert img.tobytes() == scene.render(CELL_PX).tobytes()
    assert codec.encode([img]).tolist() == ids.tolist()


def torch_tensor(a):
    import torch

    return torch.as_tensor(a, dtype=torch.long)


def test_every_shape_is_a_distinct_connected_pattern_filling_its_box():
    import numpy as np

    from mmrl.tiny_world.shapes import PATTERN, SHAPES, detect_cells

    patterns = list(SHAPES.values())
    assert len(SHAPES) == 20 and len({p.tobytes() for p in patterns}) == len(patterns)
    for name, p in SHAPES.items():
        assert p.shape == (PATTERN, PATTERN) and p.any(0).all() and p.any(1).all(), name
        cells = np.zeros((5, 5), dtype=np.int64)
        cells[1:4, 1:4][p] = 1  # one colour on the background: the detector must find exactly this shape
        found = detect_cells(cells)
        assert [(o.shape, o.row, o.col) for o in found] == [(name, 1, 1)], name
