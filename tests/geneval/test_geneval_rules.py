"""The GenEval decision rule on hand-built detections (values worked out by hand from the official rule), the
Flow-GRPO variants, and the prompt suites."""
import json

import numpy as np
import pytest

from mmrl.geneval.prompts import (
    OFFICIAL_METADATA,
    coco_names,
    generate_suite,
    make_plural,
    official_metadata,
    parse_prompt,
    read_metadata,
    with_article,
)
from mmrl.geneval.rules import (
    TASKS,
    Detection,
    Options,
    box_iou,
    judge,
    judge_strict,
    partial_score,
    relative_position,
    select_detections,
    validate_metadata,
    with_colors,
)


def D(label, box=(0, 0, 10, 10), score=0.95, color=None):
    return Detection(label, tuple(float(v) for v in box), score, color)


def kept(dets, tag="two_object", **opts):
    return select_detections(dets, tag, Options(**opts))


# ------------------------------------------------------------------ selection: thresholds, top-n, NMS


def test_threshold_is_strict_and_task_dependent():
    dets = [D("dog", score=0.3), D("dog", score=0.3000001), D("dog", score=0.9), D("dog", score=0.95)]
    assert [d.score for d in kept(dets)["dog"]] == [0.95, 0.9, 0.3000001]  # 0.3 itself is not > 0.3
    assert [d.score for d in kept(dets, "counting")["dog"]] == [0.95]  # counting: > 0.9
    assert kept([D("cat", score=0.2)]) == {}  # a class with nothing kept is absent


def test_most_confident_first_and_max_objects():
    dets = [D("cat", score=s) for s in (0.4, 0.8, 0.6, 0.7, 0.5)]
    assert [d.score for d in kept(dets)["cat"]] == [0.8, 0.7, 0.6, 0.5, 0.4]
    assert [d.score for d in kept(dets, max_objects=2)["cat"]] == [0.8, 0.7]
    ties = [D("cat", (i, 0, i + 1, 1), 0.5) for i in range(3)]
    assert [d.box[0] for d in kept(ties)["cat"]] == [0, 1, 2]  # stable on ties


def test_iou_inclusive_pixels_and_nms():
    a, b, c = (0, 0, 9, 9), (0, 0, 9, 4), (0, 0, 9, 3)
    assert box_iou(a, b) == pytest.approx(50 / 100)  # areas 10x10 and 10x5 in GenEval's +1 convention
    assert box_iou(a, c) == pytest.approx(40 / 100)
    assert box_iou(a, (20, 20, 30, 30)) == 0
    dets = [D("cup", a, 0.9), D("cup", b, 0.8), D("cup", c, 0.7)]
    assert len(kept(dets)["cup"]) == 3  # max_overlap 1.0: NMS off
    # NMS at 0.5 keeps an overlapping box only if IoU < 0.5: b (0.5) goes, c (0.4) stays
    assert [d.score for d in kept(dets, max_overlap=0.5)["cup"]] == [0.9, 0.7]


# ------------------------------------------------------------------ position rule


def reference_relative_position(box_a, box_b, t=0.1):
    """GenEval's relative_position written with numpy, as the official code does it (independent of mmrl's)."""
    boxes = np.array([box_a, box_b], dtype=float).reshape(2, 2, 2)
    ca, cb = boxes.mean(axis=-2)
    da, db = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    off = ca - cb
    rev = np.maximum(np.abs(off) - t * (da + db), 0) * np.sign(off)
    if np.all(np.abs(rev) < 1e-3):
        return set()
    dx, dy = rev / np.linalg.norm(off)
    rel = set()
    if dx < -0.5:
        rel.add("left of")
    if dx > 0.5:
        rel.add("right of")
    if dy < -0.5:
        rel.add("above")
    if dy > 0.5:
        rel.add("below")
    return rel


def test_position_margin_by_hand():
    b = (0, 0, 10, 10)  # centre (5, 5), 10 x 10: margin 0.1 * (10 + 10) = 2 px
    # offset x: revised = x - 2, dx = (x - 2) / x: > 0.5 iff x > 4
    assert relative_position((5, 0, 15, 10), b) == {"right of"}  # dx = 3/5
    assert relative_position((4, 0, 14, 10), b) == set()  # dx = 2/4 = 0.5 exactly: strict >
    assert relative_position((4, 0, 14, 10), b, position_threshold=0.0) == {"right of"}
    assert relative_position((-5, 0, 5, 10), b) == {"left of"}
    assert relative_position((0, -6, 10, 4), b) == {"above"}  # y grows downward
    assert relative_position((0, 6, 10, 16), b) == {"below"}


def test_overlapping_and_diagonal_pairs():
    b = (0, 0, 10, 10)
    assert relative_position((1, 0, 11, 10), b) == set()  # |offset| 1 < margin 2: overlap, no relation
    assert relative_position(b, b) == set()
    # diagonal (6, 6): revised (4, 4) / (6 sqrt 2) = 0.471 each: no relation at all
    assert relative_position((6, 6, 16, 16), b) == set()
    # diagonal (10, 10): revised (8, 8) / (10 sqrt 2) = 0.566 each: both relations
    assert relative_position((10, 10, 20, 20), b) == {"right of", "below"}
    assert relative_position((-10, -10, 0, 0), b) == {"left of", "above"}


def test_relative_position_matches_numpy_reference():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        xy = rng.uniform(0, 100, size=(2, 2))
        wh = rng.uniform(0.5, 40, size=(2, 2))
        a = (*xy[0], *(xy[0] + wh[0]))
        b = (*xy[1], *(xy[1] + wh[1]))
        t = float(rng.choice([0.0, 0.1, 0.3]))
        assert relative_position(a, b, t) == reference_relative_position(a, b, t)


# ------------------------------------------------------------------ the rule, task by task

SINGLE = {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"}
TWO = {"tag": "two_object", "include": [{"class": "bench", "count": 1}, {"class": "sports ball", "count": 1}],
       "prompt": "a photo of a bench and a sports ball"}
COUNT = {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}],
         "prompt": "a photo of two clocks"}
COLOR = {"tag": "colors", "include": [{"class": "fire hydrant", "count": 1, "color": "blue"}], "prompt": "a photo of a blue fire hydrant"}
POS = {"tag": "position", "include": [{"class": "teddy bear", "count": 1},
                                      {"class": "dog", "count": 1, "position": ["right of", 0]}],
       "prompt": "a photo of a dog right of a teddy bear"}
ATTR = {"tag": "color_attr", "include": [{"class": "wine glass", "count": 1, "color": "purple"},
                                         {"class": "apple", "count": 1, "color": "black"}],
        "prompt": "a photo of a purple wine glass and a black apple"}


def verdict(dets, meta, **opts):
    return judge(select_detections(dets, meta["tag"], Options(**opts)), meta)


def test_single_object():
    assert verdict([D("bench", score=0.31)], SINGLE).correct
    v = verdict([D("bench", score=0.3), D("dog")], SINGLE)
    assert not v.correct and v.reason == "expected bench>=1, found 0"
    assert verdict([D("bench"), D("bench"), D("dog")], SINGLE).correct  # at least n; extras and others allowed


def test_two_object():
    assert verdict([D("bench"), D("sports ball")], TWO).correct
    v = verdict([D("sports ball")], TWO)
    assert (v.correct, v.reason) == (False, "expected bench>=1, found 0")
    v = verdict([], TWO)
    assert v.reason == "expected bench>=1, found 0\nexpected sports ball>=1, found 0"


def test_counting_and_the_exclude_clause():
    assert verdict([D("clock", score=s) for s in (0.95, 0.91, 0.9)], COUNT).correct  # third one not > 0.9
    v = verdict([D("clock", score=s) for s in (0.95, 0.91, 0.92)], COUNT)
    assert (v.correct, v.reason) == (False, "expected clock<3, found 3")
    v = verdict([D("clock", score=0.95), D("clock", score=0.5)], COUNT)  # 0.5 passes 0.3 but not 0.9
    assert (v.correct, v.reason) == (False, "expected clock>=2, found 1")
    # the counting threshold is an option
    assert verdict([D("clock", score=0.95), D("clock", score=0.5)], COUNT, counting_threshold=0.4).correct


def test_colors_top_n_rule():
    assert verdict([D("fire hydrant", color="blue")], COLOR).correct
    # only the most confident hydrant's colour counts
    v = verdict([D("fire hydrant", score=0.9, color="red"), D("fire hydrant", score=0.8, color="blue")], COLOR)
    assert (v.correct, v.reason) == (False, "expected blue fire hydrant>=1, found 0 blue; and 1 red")
    assert verdict([D("fire hydrant", score=0.9, color="blue"), D("fire hydrant", score=0.8, color="red")], COLOR).correct
    meta = {"tag": "colors", "include": [{"class": "cup", "count": 2, "color": "green"}], "prompt": ""}
    v = verdict([D("cup", score=0.9, color="green"), D("cup", score=0.8, color="white"), D("cup", score=0.7, color="green")], meta)
    # tally in the official colour order (green before white)
    assert (v.correct, v.reason) == (False, "expected green cup>=2, found 1 green; and 1 green, 1 white")


def test_position():
    bear = D("teddy bear", (0, 0, 10, 10))
    assert verdict([bear, D("dog", (5, 0, 15, 10))], POS).correct
    v = verdict([bear, D("dog", (4, 0, 14, 10))], POS)
    assert (v.correct, v.reason) == (False, "expected dog right of target, found  target")  # no relation at 0.5
    v = verdict([bear, D("dog", (10, 10, 20, 20))], POS)
    assert v.correct  # diagonal: "right of" and "below" both hold
    v = verdict([bear, D("dog", (-10, -10, 0, 0))], POS)
    assert v.reason == "expected dog right of target, found left of and above target"
    v = verdict([D("dog", (5, 0, 15, 10))], POS)  # the target clause failed
    assert v.reason == "expected teddy bear>=1, found 0\nno target for dog to be right of"


def test_position_every_pair_and_top_n():
    meta = {"tag": "position", "prompt": "", "include": [{"class": "cat", "count": 2},
                                                         {"class": "dog", "count": 1, "position": ["left of", 0]}]}
    cats = [D("cat", (20, 0, 30, 10), 0.9), D("cat", (40, 0, 50, 10), 0.8)]
    assert verdict(cats + [D("dog", (0, 0, 10, 10))], meta).correct
    assert not verdict(cats + [D("dog", (30, 0, 40, 10))], meta).correct  # right of the first cat
    # a third, less confident cat is not a target (top-n), even though the dog is right of it
    assert verdict(cats + [D("cat", (-30, 0, -20, 10), 0.5), D("dog", (0, 0, 10, 10))], meta).correct
    # the dog's top-1 only: a second, less confident dog on the wrong side is ignored
    assert verdict(cats + [D("dog", (0, 0, 10, 10), 0.9), D("dog", (60, 0, 70, 10), 0.4)], meta).correct


def test_color_attr():
    ok = [D("wine glass", color="purple"), D("apple", color="black")]
    assert verdict(ok, ATTR).correct
    v = verdict([D("wine glass", color="black"), D("apple", color="purple")], ATTR)
    assert v.reason == ("expected purple wine glass>=1, found 0 purple; and 1 black\n"
                        "expected black apple>=1, found 0 black; and 1 purple")


def test_missing_colour_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="no colour"):
        verdict([D("fire hydrant")], COLOR)
    # with_colors fills exactly the top-n of colour clauses that lack one
    calls = []

    def classify(dets, name):
        calls.append((name, len(dets)))
        return ["blue"] * len(dets)

    detected = with_colors(kept([D("fire hydrant", score=0.9), D("fire hydrant", score=0.8), D("dog")]), COLOR, classify)
    assert calls == [("fire hydrant", 1)]
    assert [d.color for d in detected["fire hydrant"]] == ["blue", None]
    assert judge(detected, COLOR).correct


# ------------------------------------------------------------------ Flow-GRPO variants


def test_strict_needs_exact_counts():
    two_benches = [D("bench"), D("bench"), D("sports ball")]
    assert verdict(two_benches, TWO).correct  # official: at least one of each
    assert not judge_strict(kept(two_benches), TWO)
    assert judge_strict(kept([D("bench"), D("sports ball")]), TWO)
    # colours: every detection of the class, exact colour count
    assert not judge_strict(kept([D("fire hydrant", color="blue"), D("fire hydrant", color="blue")]), COLOR)
    assert judge_strict(kept([D("fire hydrant", color="blue")]), COLOR)
    assert not judge_strict(kept([D("teddy bear", (0, 0, 10, 10)), D("dog", (4, 0, 14, 10))]), POS)
    assert judge_strict(kept([D("teddy bear", (0, 0, 10, 10)), D("dog", (5, 0, 15, 10))]), POS)


def test_partial_credit_by_hand():
    # two_object with 2 benches and a ball: terms 1 - |1-2|/1 = 0 and 1 -> 0.5
    assert partial_score(kept([D("bench"), D("bench"), D("sports ball")]), TWO) == 0.5
    # colour: one blue hydrant -> terms 1 (count) and 1 (colour)
    assert partial_score(kept([D("fire hydrant", color="blue")]), COLOR) == 1.0
    # colour wrong: count 1, colour 1 - |1 - 0|/1 = 0 -> 0.5
    assert partial_score(kept([D("fire hydrant", color="red")]), COLOR) == 0.5
    # count mismatch on a colour clause: count term 0 plus one 0 term
    assert partial_score(kept([]), COLOR) == 0.0
    # counting, 3 clocks kept for 2: 1 - 1/2 = 0.5 (exclude clauses are ignored)
    assert partial_score(kept([D("clock")] * 3, "counting"), COUNT) == 0.5
    # colour_attr, 1 of 2 colours right: (1 + 1 + 1 + 0) / 4
    assert partial_score(kept([D("wine glass", color="purple"), D("apple", color="red")]), ATTR) == 0.75


def test_partial_position_quirk_fixed_and_flow_grpo_exact():
    failed = kept([D("teddy bear", (0, 0, 10, 10)), D("dog", (-10, 0, 0, 10))])
    # fixed: bear count 1, dog count 1, position 0 -> 2/3
    assert partial_score(failed, POS) == pytest.approx(2 / 3)
    # Flow-GRPO appends 0 and then 1.0 after the loop anyway: (1 + 1 + 0 + 1) / 4
    assert partial_score(failed, POS, flow_grpo_exact=True) == pytest.approx(3 / 4)
    good = kept([D("teddy bear", (0, 0, 10, 10)), D("dog", (20, 0, 30, 10))])
    assert partial_score(good, POS) == partial_score(good, POS, flow_grpo_exact=True) == 1.0
    # no target: bear missing -> bear term 0, dog count 1, no-target 0 -> 1/3 (no quirk there)
    no_target = kept([D("dog", (20, 0, 30, 10))])
    assert partial_score(no_target, POS) == partial_score(no_target, POS, flow_grpo_exact=True) == pytest.approx(1 / 3)


def test_partial_count_term_clamped_at_zero():
    many = kept([D("bench")] * 16)  # 16 detections for a count of 1: 1 - 15/1 = -14
    assert partial_score(many, SINGLE, flow_grpo_exact=True) == -14.0
    assert partial_score(many, SINGLE) == 0.0
    seven = kept([D("clock")] * 7, "counting")  # 1 - 5/2 = -1.5
    assert partial_score(seven, COUNT, flow_grpo_exact=True) == -1.5 and partial_score(seven, COUNT) == 0.0


# ------------------------------------------------------------------ options and metadata validation


def test_options_official_defaults_and_parsing():
    o = Options()
    assert (o.threshold, o.counting_threshold, o.max_objects, o.max_overlap, o.position_threshold, o.bgcolor, o.crop) == (
        0.3, 0.9, 16, 1.0, 0.1, "#999", "1")
    p = Options.parse(["threshold=0.5", "max_objects=4", "bgcolor=original", "crop=0"])
    assert (p.threshold, p.max_objects, p.bgcolor, p.crop) == (0.5, 4, "original", "0")
    with pytest.raises(ValueError, match="unknown GenEval option 'treshold'.*threshold"):
        Options.parse(["treshold=0.5"])
    with pytest.raises(ValueError, match="max_objects expects a int"):
        Options.parse(["max_objects=lots"])
    with pytest.raises(ValueError, match="max_overlap"):
        Options.parse(["max_overlap=0"])
    with pytest.raises(ValueError, match="key=value"):
        Options.parse(["threshold"])
    with pytest.raises(ValueError, match="bgcolor"):
        Options.parse(["bgcolor=notacolour"])


@pytest.mark.parametrize("bad, match", [
    ({"tag": "colour", "include": [{"class": "a", "count": 1}], "prompt": ""}, "unknown tag"),
    ({"tag": "counting", "include": [], "prompt": ""}, "non-empty list"),
    ({"tag": "counting", "include": [{"class": "a", "count": 0}], "prompt": ""}, "count"),
    ({"tag": "counting", "include": [{"class": "a", "count": True}], "prompt": ""}, "count"),
    ({"tag": "position", "include": [{"class": "a", "count": 1, "position": ["left of", 0]}], "prompt": ""}, "earlier clause"),
    ({"tag": "position", "include": [{"class": "a", "count": 1}, {"class": "b", "count": 1, "position": ["near", 0]}],
      "prompt": ""}, "unknown relation"),
    ({"tag": "colors", "include": [{"class": "a", "count": 1, "colour": "red"}], "prompt": ""}, "unknown clause key"),
    ({"tag": "colors", "include": [{"class": "a", "count": 1}]}, "prompt"),
    ([1, 2], "JSON object"),
])
def test_metadata_validation_names_the_problem(bad, match):
    with pytest.raises(ValueError, match=match):
        validate_metadata(bad, "here")


# ------------------------------------------------------------------ prompt suites


def test_official_metadata_counts_and_validity():
    records = official_metadata()
    assert len(records) == 553
    counts = {t: sum(r["tag"] == t for r in records) for t in TASKS}
    assert counts == {"single_object": 80, "two_object": 99, "counting": 80, "colors": 94, "position": 100, "color_attr": 100}
    assert len(coco_names()) == 80 and coco_names()[0] == "person"
    assert {"computer mouse", "tv remote", "computer keyboard"} <= set(coco_names())


def test_generator_reproduces_the_official_file_line_for_line():
    lines = [json.dumps(r) for r in generate_suite(43, 100)]
    assert lines == OFFICIAL_METADATA.read_text().splitlines()


def test_generator_rules_on_another_seed_and_vocabulary():
    suite = generate_suite(0, 30, ["ant", "box", "sheep", "bus"], ["red", "blue", "orange"], max_count=3)
    assert len({json.dumps(r, sort_keys=True) for r in suite}) == len(suite)  # de-duplicated
    for r in suite:
        validate_metadata(r)
        assert parse_prompt(r["prompt"], ["ant", "box", "sheep", "bus"], ["red", "blue", "orange"]) == r
        if r["tag"] == "counting":
            n = r["include"][0]["count"]
            assert 2 <= n <= 3 and r["exclude"] == [{"class": r["include"][0]["class"], "count": n + 1}]
        if r["tag"] == "color_attr":
            a, b = r["include"]
            assert a["class"] != b["class"] and a["color"] != b["color"]
    assert with_article("ant") == "an ant" and with_article("orange") == "an orange" and with_article("box") == "a box"
    assert make_plural("bus") == "buses" and make_plural("sheep") == "sheeps"  # GenEval's plain rule


def test_all_official_prompts_parse_back_to_their_records():
    names = coco_names()
    for r in official_metadata():
        assert parse_prompt(r["prompt"], names) == r
    with pytest.raises(ValueError, match="fits no GenEval template"):
        parse_prompt("a photo of a unicorn", names)


def test_read_metadata_errors_name_file_and_line(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps(SINGLE) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"m.jsonl:2: not valid JSON"):
        read_metadata(p)
    p.write_text(json.dumps(SINGLE) + "\n" + json.dumps({**SINGLE, "tag": "nope"}) + "\n")
    with pytest.raises(ValueError, match=r"m.jsonl:2: unknown tag 'nope'"):
        read_metadata(p)
    with pytest.raises(FileNotFoundError):
        read_metadata(tmp_path / "missing.jsonl")
    assert read_metadata(OFFICIAL_METADATA) == official_metadata()
