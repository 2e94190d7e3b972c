"""The GenEval decision rule: pure functions over detections, the same for every detector backend.

Facts from djghosh13/geneval `evaluation/evaluate_images.py` (MIT; docs/geneval.md) and
Flow-GRPO's reward server `yifan123/reward-server/reward_server/gen_eval.py` (1.8), re-implemented here:

- keep a detection iff `score > threshold` (strict; `counting_threshold` for the counting task), most confident
  first, at most `max_objects` per class, optional per-class NMS (`max_overlap`, off at 1.0);
- an include clause (class C, count n) looks at the n most confident C's ("top-n"): fewer than n fails; with a colour,
  all n must have it; with a position `[relation, j]`, every one of them must stand in `relation` to every object of
  the (matched) clause j; an exclude clause (C, m) fails when m or more C's were kept;
- `relative_position`: centre offset shrunk per axis by `position_threshold` x (sum of the two sizes), direction
  test at +-0.5 of the unit offset; overlapping pairs have no relation, diagonal pairs may have two or none.

`judge` is the official per-image rule; `judge_strict` and `partial_score` are Flow-GRPO's training signals.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Mapping, Sequence

from PIL import ImageColor

TASKS: tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""The six GenEval tasks (metadata `tag`), in the official prompt file's order."""
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
GENEVAL_COLORS: tuple[str, ...] = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
"""The official colour vocabulary (prompts and the CLIP colour classifier)."""

Box = tuple[float, float, float, float]


@dataclass(frozen=True, eq=False)
class Detection:
    """One detected object: class name, box [x1, y1, x2, y2] in pixels (y grows downward), confidence, colour name
    (None = to be classified) and an optional boolean instance mask [H, W] (used only to crop for colour)."""

    label: str
    box: Box
    score: float = 1.0
    color: str | None = None
    mask: Any = field(default=None, repr=False)

    def as_detail(self) -> list[float]:
        """The official `details` entry: [x1, y1, x2, y2, score]."""
        return [float(v) for v in self.box] + [float(self.score)]


@dataclass(frozen=True)
class Options:
    """GenEval's `--options`, under their official names and defaults (`evaluate_images.py`)."""

    threshold: float = 0.3
    """Keep detections with score > threshold (every task but counting)."""
    counting_threshold: float = 0.9
    """Keep detections with score > counting_threshold on the counting task."""
    max_objects: int = 16
    """At most this many detections per class (most confident first)."""
    max_overlap: float = 1.0
    """Per-class NMS IoU threshold; 1.0 disables NMS."""
    position_threshold: float = 0.1
    """Margin of the position rule, as a fraction of the two objects' summed sizes."""
    bgcolor: str = "#999"
    """Background the instance mask is composited on before colour classification ("original" keeps the image)."""
    crop: str = "1"
    """"1": crop to the box before colour classification; "0": classify the whole (composited) image."""
    model: str = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"
    """mmdet detector name (checkpoint `<model>.pth` under `--model-path`)."""
    clip_model: str = "ViT-L-14"
    """open_clip architecture of the colour classifier."""

    def __post_init__(self):
        for name in ("threshold", "counting_threshold", "max_overlap", "position_threshold"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ValueError(f"option {name} must be a finite number, got {v!r}")
        if not 0.0 < self.max_overlap <= 1.0:
            raise ValueError(f"option max_overlap must lie in (0, 1] (1 disables NMS), got {self.max_overlap}")
        if self.position_threshold < 0:
            raise ValueError(f"option position_threshold must be >= 0, got {self.position_threshold}")
        if not isinstance(self.max_objects, int) or isinstance(self.max_objects, bool) or self.max_objects < 1:
            raise ValueError(f"option max_objects must be an integer >= 1, got {self.max_objects!r}")
        if self.crop not in ("0", "1"):
            raise ValueError(f"option crop must be '0' or '1', got {self.crop!r}")
        if self.bgcolor != "original":
            try:
                ImageColor.getrgb(self.bgcolor)
            except ValueError:
                raise ValueError(f"option bgcolor must be a colour such as '#999' or 'original', got {self.bgcolor!r}") from None

    @classmethod
    def parse(cls, pairs: Sequence[str] | Mapping[str, Any] | None) -> "Options":
        """From `["threshold=0.3", ...]` (the official `--options k=v` form) or a dict; unknown names raise."""
        if pairs is None:
            return cls()
        if isinstance(pairs, Mapping):
            items = list(pairs.items())
        else:
            items = []
            for p in pairs:
                if "=" not in p:
                    raise ValueError(f"options are given as key=value, got {p!r}; valid keys: {option_names()}")
                k, v = p.split("=", 1)
                items.append((k.strip(), v.strip()))
        kinds = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in items:
            if key not in kinds:
                raise ValueError(f"unknown GenEval option {key!r}; valid options: {option_names()}")
            kind = kinds[key]
            try:
                if kind == "float":
                    value = float(value)
                elif kind == "int":
                    if isinstance(value, float) and not value.is_integer():
                        raise ValueError
                    value = int(value)
                else:
                    value = str(value)
            except (TypeError, ValueError):
                raise ValueError(f"option {key} expects a {kind}, got {value!r}") from None
            values[key] = value
        return cls(**values)


def option_names() -> list[str]:
    return [f.name for f in fields(Options)]


def box_iou(box_a: Sequence[float], box_b: Sequence[float]) -> float:
    """IoU with GenEval's inclusive-pixel convention (area = (x2 - x1 + 1) * (y2 - y1 + 1)), used by its NMS."""

    def area(b):
        return max(b[2] - b[0] + 1, 0) * max(b[3] - b[1] + 1, 0)

    inter = area([max(box_a[0], box_b[0]), max(box_a[1], box_b[1]), min(box_a[2], box_b[2]), min(box_a[3], box_b[3])])
    union = area(box_a) + area(box_b) - inter
    return inter / union if union else 0.0


def select_detections(detections: Iterable[Detection], tag: str, options: Options = Options()) -> dict[str, list[Detection]]:
    """Per class, the detections GenEval keeps: score > threshold (counting_threshold when `tag == "counting"`),
    most confident first (a stable sort: ties keep the detector's order), the first `max_objects`, then greedy NMS
    unless `max_overlap == 1`. Classes with nothing kept are absent."""
    cutoff = options.counting_threshold if tag == "counting" else options.threshold
    by_class: dict[str, list[Detection]] = {}
    for d in detections:
        by_class.setdefault(d.label, []).append(d)
    kept: dict[str, list[Detection]] = {}
    for label, dets in by_class.items():
        order = sorted((d for d in dets if d.score > cutoff), key=lambda d: -d.score)[: options.max_objects]
        out: list[Detection] = []
        while order:
            best = order.pop(0)
            out.append(best)
            if options.max_overlap != 1:
                order = [d for d in order if box_iou(best.box, d.box) < options.max_overlap]
        if out:
            kept[label] = out
    return kept


def _sign(v: float) -> float:
    return float(v > 0) - float(v < 0)


def relative_position(box_a: Sequence[float], box_b: Sequence[float], position_threshold: float = 0.1) -> set[str]:
    """The relations of A to B ("left of", "right of", "above", "below"; image y grows downward).

    offset = centre(A) - centre(B); revised = sign(offset) * max(|offset| - t * (size(A) + size(B)), 0) per axis; no
    relation when both revised components are < 1e-3; else (dx, dy) = revised / |offset| and each of dx < -0.5,
    dx > 0.5, dy < -0.5, dy > 0.5 adds its relation (GenEval `relative_position`).
    """
    box_a, box_b = [float(v) for v in box_a[:4]], [float(v) for v in box_b[:4]]
    ca = ((box_a[0] + box_a[2]) / 2, (box_a[1] + box_a[3]) / 2)
    cb = ((box_b[0] + box_b[2]) / 2, (box_b[1] + box_b[3]) / 2)
    da = (abs(box_a[2] - box_a[0]), abs(box_a[3] - box_a[1]))
    db = (abs(box_b[2] - box_b[0]), abs(box_b[3] - box_b[1]))
    offset = (ca[0] - cb[0], ca[1] - cb[1])
    revised = [_sign(o) * max(abs(o) - position_threshold * (sa + sb), 0.0) for o, sa, sb in zip(offset, da, db)]
    if all(abs(r) < 1e-3 for r in revised):
        return set()
    norm = math.sqrt(offset[0] * offset[0] + offset[1] * offset[1])
    dx, dy = revised[0] / norm, revised[1] / norm
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


@dataclass(frozen=True)
class Verdict:
    """The official per-image outcome: `correct` and the newline-joined failure messages."""

    correct: bool
    reason: str


def _colors_of(found: Sequence[Detection], classname: str) -> list[str]:
    missing = [i for i, d in enumerate(found) if d.color is None]
    if missing:
        raise ValueError(
            f"detection(s) {missing} of class {classname!r} have no colour; a colour clause needs every one of the top-n "
            "detections coloured (give colours in the detections or configure a colour classifier)"
        )
    return [d.color for d in found]


def _color_tally(colors: list[str], palette: Sequence[str]) -> str:
    order = list(palette) + [c for c in dict.fromkeys(colors) if c not in palette]
    return ", ".join(f"{colors.count(c)} {c}" for c in order if c in colors)


def _pairs_hold(found, targets, relation, position_threshold) -> tuple[bool, set[str]]:
    for obj in found:
        for target in targets:
            rels = relative_position(obj.box, target.box, position_threshold)
            if relation not in rels:
                return False, rels
    return True, set()


def _rel_text(rels: set[str]) -> str:
    return " and ".join(r for r in RELATIONS if r in rels)


def judge(
    detected: Mapping[str, Sequence[Detection]],
    metadata: Mapping[str, Any],
    *,
    position_threshold: float = 0.1,
    colors: Sequence[str] = GENEVAL_COLORS,
) -> Verdict:
    """The official GenEval rule on the kept detections (`select_detections`), most confident first per class.

    Include clauses are ANDed, exclude clauses ORed; colours are read from `Detection.color` of the top-n objects of
    a colour clause (all must be set). `colors` only orders the colour tally in failure messages.
    """
    correct = True
    reasons: list[str] = []
    groups: list[list[Detection] | None] = []
    for clause in metadata.get("include", []):
        name, n = clause["class"], int(clause["count"])
        found = list(detected.get(name, []))[:n]
        matched = True
        if len(found) < n:
            matched = False
            reasons.append(f"expected {name}>={n}, found {len(found)}")
        else:
            if "color" in clause:
                got = _colors_of(found, name)
                hits = got.count(clause["color"])
                if hits < n:
                    matched = False
                    reasons.append(
                        f"expected {clause['color']} {name}>={n}, found {hits} {clause['color']}; and {_color_tally(got, colors)}"
                    )
            if "position" in clause and matched:
                relation, target = clause["position"][0], int(clause["position"][1])
                if groups[target] is None:
                    matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    ok, rels = _pairs_hold(found, groups[target], relation, position_threshold)
                    if not ok:
                        matched = False
                        reasons.append(f"expected {name} {relation} target, found {_rel_text(rels)} target")
        correct = correct and matched
        groups.append(found if matched else None)
    for clause in metadata.get("exclude", []):
        name, m = clause["class"], int(clause["count"])
        k = len(detected.get(name, []))
        if k >= m:
            correct = False
            reasons.append(f"expected {name}<{m}, found {k}")
    return Verdict(correct, "\n".join(reasons))


def judge_strict(
    detected: Mapping[str, Sequence[Detection]], metadata: Mapping[str, Any], *, position_threshold: float = 0.1
) -> bool:
    """Flow-GRPO's `strict_correct`: like `judge` but over all kept detections of a class, with exact counts
    (`== n`) and exact colour counts; exclude clauses are not consulted (exact counts imply them)."""
    groups: list[list[Detection] | None] = []
    correct = True
    for clause in metadata.get("include", []):
        name, n = clause["class"], int(clause["count"])
        found = list(detected.get(name, []))
        matched = len(found) == n
        if matched and "color" in clause:
            matched = _colors_of(found, name).count(clause["color"]) == n
        if matched and "position" in clause:
            relation, target = clause["position"][0], int(clause["position"][1])
            matched = groups[target] is not None and _pairs_hold(found, groups[target], relation, position_threshold)[0]
        correct = correct and matched
        groups.append(found if matched else None)
    return correct


def partial_score(
    detected: Mapping[str, Sequence[Detection]],
    metadata: Mapping[str, Any],
    *,
    position_threshold: float = 0.1,
    flow_grpo_exact: bool = False,
) -> float:
    """Flow-GRPO's partial-credit reward (`score` of `evaluate_reward`): the mean of per-clause terms.

    Per include clause (class C, count n, k = number of kept C's): a count term `1 - |n - k| / n`; if k != n a single
    0 term when the clause has a colour or a position; else a colour term `1 - |n - #right colour| / n`, and, if the
    colour matched, a position term (1 if every pair stands in the relation, else 0; 0 without a matched target).
    Exclude clauses are ignored.

    Two fixes, both off with `flow_grpo_exact=True` (which reproduces the original):
    - the count term is clamped at 0 (the original goes negative once k > 2n, down to 1 - 15/n at 16 detections);
    - a failed position check adds one 0 term; the original appends its 0 and then still appends 1.0 after the loop,
      so a failed relation scored (0 + 1) / 2 of a term instead of 0.
    """
    terms: list[float] = []
    groups: list[list[Detection] | None] = []
    for clause in metadata.get("include", []):
        name, n = clause["class"], int(clause["count"])
        found = list(detected.get(name, []))
        count_term = 1 - abs(n - len(found)) / n
        terms.append(count_term if flow_grpo_exact else max(count_term, 0.0))
        matched = len(found) == n
        if not matched:
            if "color" in clause or "position" in clause:
                terms.append(0.0)
        else:
            if "color" in clause:
                hits = _colors_of(found, name).count(clause["color"])
                terms.append(1 - abs(n - hits) / n)
                matched = hits == n
            if "position" in clause and matched:
                relation, target = clause["position"][0], int(clause["position"][1])
                if groups[target] is None:
                    matched = False
                    terms.append(0.0)
                else:
                    ok = _pairs_hold(found, groups[target], relation, position_threshold)[0]
                    if ok:
                        terms.append(1.0)
                    else:
                        matched = False
                        terms.append(0.0)
                        if flow_grpo_exact:
                            terms.append(1.0)
        groups.append(found if matched else None)
    return sum(terms) / len(terms) if terms else 0.0


def color_requests(metadata: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(class, n) of every colour clause: the first n kept detections of that class need a colour (the official
    rule classifies exactly those; the strict and partial rules need them only when exactly n were kept)."""
    return [(c["class"], int(c["count"])) for c in metadata.get("include", []) if "color" in c]


def with_colors(detected: Mapping[str, Sequence[Detection]], metadata: Mapping[str, Any], classify) -> dict[str, list[Detection]]:
    """`detected` with the colour of every detection that a colour clause will read filled in by
    `classify(detections, classname) -> [colour names]` (only those still lacking one)."""
    out = {k: list(v) for k, v in detected.items()}
    for name, n in color_requests(metadata):
        dets = out.get(name, [])
        todo = [i for i, d in enumerate(dets[:n]) if d.color is None]
        if todo:
            names = classify([dets[i] for i in todo], name)
            for i, c in zip(todo, names):
                dets[i] = replace(dets[i], color=c)
    return out


def _fail(where: str, msg: str):
    raise ValueError(f"{where}{msg}")


def validate_metadata(record: Any, where: str = "") -> None:
    """Check one GenEval metadata record; raises ValueError naming `where` (e.g. a file and line) and the bad value."""
    where = f"{where}: " if where else ""
    if not isinstance(record, Mapping):
        _fail(where, f"a metadata record must be a JSON object, got {type(record).__name__}")
    tag = record.get("tag")
    if tag not in TASKS:
        _fail(where, f"unknown tag {tag!r}; valid tags: {list(TASKS)}")
    if not isinstance(record.get("prompt"), str):
        _fail(where, f"'prompt' must be a string, got {record.get('prompt')!r}")
    include = record.get("include")
    if not isinstance(include, list) or not include:
        _fail(where, f"'include' must be a non-empty list of clauses, got {include!r}")
    for i, clause in enumerate(include):
        _check_clause(clause, f"{where}include[{i}]: ", allowed={"class", "count", "color", "position"})
        if "color" in clause and not isinstance(clause["color"], str):
            _fail(where, f"include[{i}]: 'color' must be a string, got {clause['color']!r}")
        if "position" in clause:
            pos = clause["position"]
            if not isinstance(pos, (list, tuple)) or len(pos) != 2:
                _fail(where, f"include[{i}]: 'position' must be [relation, clause index], got {pos!r}")
            if pos[0] not in RELATIONS:
                _fail(where, f"include[{i}]: unknown relation {pos[0]!r}; valid relations: {list(RELATIONS)}")
            if not isinstance(pos[1], int) or isinstance(pos[1], bool) or not 0 <= pos[1] < i:
                _fail(where, f"include[{i}]: position target must be the index of an earlier clause (0..{i - 1}), got {pos[1]!r}")
    exclude = record.get("exclude", [])
    if not isinstance(exclude, list):
        _fail(where, f"'exclude' must be a list of clauses, got {exclude!r}")
    for i, clause in enumerate(exclude):
        _check_clause(clause, f"{where}exclude[{i}]: ", allowed={"class", "count"})


def _check_clause(clause: Any, where: str, allowed: set[str]) -> None:
    if not isinstance(clause, Mapping):
        _fail(where, f"a clause must be an object, got {clause!r}")
    unknown = sorted(set(clause) - allowed)
    if unknown:
        _fail(where, f"unknown clause key(s) {unknown}; allowed: {sorted(allowed)}")
    if not isinstance(clause.get("class"), str) or not clause["class"]:
        _fail(where, f"'class' must be a non-empty string, got {clause.get('class')!r}")
    count = clause.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        _fail(where, f"'count' must be an integer >= 1, got {count!r}")
