"""The compositional split of the `shapes` task: held-out compositions, not held-out strings.

A GenEval prompt of the shapes world is built from compositions: a (colour, shape) pairing (`colors`,
`color_attr`), a (count, shape) pair (`counting`) or an unordered pair of shapes (`two_object`, `position`). The
split partitions each kind of composition into train / validation / test (seeded, every shape, colour and count kept
in training), and a prompt goes to the split that holds **all** its compositions (prompts that mix splits are
dropped). So a test prompt asks for a pairing, count or shape pair that no training prompt names, under any wording.

`canonical(record)` is a prompt's meaning under the GenEval rules (`mmrl.geneval.rules`): the order of the two objects
of `two_object` / `color_attr` does not matter, and "A right of B" means "B left of A" ("below" / "above" likewise),
so a word-order paraphrase or a mirrored relation of a training prompt is the same meaning; every split holds
distinct meanings, and no test meaning is a training meaning.

`single_object` has no composition to hold out (its prompt names one shape); its test prompts are the world's
shapes, also seen in training, and the reports say so.
"""
from __future__ import annotations

import random
from itertools import combinations
from typing import Any, Iterable, Mapping, Sequence

SPLIT_FRACTIONS = {"test": 0.2, "validation": 0.1}
"""Share of each kind of composition held out for test and for validation (the rest is training)."""

MIRROR = {"right of": "left of", "below": "above"}
"""GenEval relation -> its mirror image with the objects swapped (A right of B == B left of A)."""


def canonical(record: Mapping[str, Any]) -> tuple:
    """The meaning of a GenEval shapes record, identical for paraphrases (object order) and mirrored relations."""
    tag = record["tag"]
    inc = record["include"]
    if tag == "single_object":
        return (tag, inc[0]["class"])
    if tag == "counting":
        return (tag, inc[0]["class"], int(inc[0]["count"]))
    if tag == "colors":
        return (tag, inc[0]["color"], inc[0]["class"])
    if tag == "two_object":
        return (tag, frozenset(c["class"] for c in inc))
    if tag == "color_attr":
        return (tag, frozenset((c["color"], c["class"]) for c in inc))
    if tag == "position":
        ref, moved = inc[0]["class"], inc[1]["class"]  # "a <moved> <rel> a <ref>"
        rel = inc[1]["position"][0]
        if rel in MIRROR:
            rel, moved, ref = MIRROR[rel], ref, moved
        return (tag, moved, rel, ref)
    raise ValueError(f"unknown GenEval tag {tag!r}")


def compositions(record: Mapping[str, Any]) -> set[tuple]:
    """The held-out units a record names: ("pairing", colour, shape), ("count", n, shape) or ("pair", frozenset of
    two shapes); empty for single_object."""
    tag = record["tag"]
    inc = record["include"]
    if tag in ("colors", "color_attr"):
        return {("pairing", c["color"], c["class"]) for c in inc}
    if tag == "counting":
        return {("count", int(inc[0]["count"]), inc[0]["class"])}
    if tag in ("two_object", "position"):
        return {("pair", frozenset(c["class"] for c in inc))}
    return set()


def _partition(units: Sequence, rng: random.Random, covers: Iterable[tuple[str, Sequence]] = ()) -> dict[str, set]:
    """{"train", "validation", "test"} sets of `units` (shuffled with `rng`), holding out `SPLIT_FRACTIONS` of them
    while every group in `covers` ((name, its members among units)) keeps at least one member in training."""
    order = list(units)
    rng.shuffle(order)
    n = len(order)
    want = {k: round(n * f) for k, f in SPLIT_FRACTIONS.items()}
    out: dict[str, set] = {"train": set(), "validation": set(), "test": set()}
    groups = [set(m) for _, m in covers]
    for u in order:
        for split in ("test", "validation"):
            if len(out[split]) < want[split]:
                # hold out only if every group containing u keeps a training member outside the held-out sets
                held = out["test"] | out["validation"] | {u}
                if all(g - held for g in groups if u in g):
                    out[split].add(u)
                    break
        else:
            out["train"].add(u)
    return out


def composition_split(shapes: Sequence[str], colors: Sequence[str], counts: Sequence[int], seed: int = 0) -> dict[str, set]:
    """{"train", "validation", "test"} sets of composition units (see `compositions`) for the vocabulary."""
    rng = random.Random(seed)
    pairings = [("pairing", c, s) for c in colors for s in shapes]
    count_pairs = [("count", n, s) for n in counts for s in shapes]
    shape_pairs = [("pair", frozenset(p)) for p in combinations(shapes, 2)]
    parts = [
        _partition(pairings, rng, [(c, [u for u in pairings if u[1] == c]) for c in colors]
                   + [(s, [u for u in pairings if u[2] == s]) for s in shapes]),
        _partition(count_pairs, rng, [(str(n), [u for u in count_pairs if u[1] == n]) for n in counts]
                   + [(s, [u for u in count_pairs if u[2] == s]) for s in shapes]),
        _partition(shape_pairs, rng, [(s, [u for u in shape_pairs if s in u[1]]) for s in shapes]),
    ]
    return {k: set().union(*(p[k] for p in parts)) for k in ("train", "validation", "test")}


def split_of(record: Mapping[str, Any], units: Mapping[str, set]) -> str | None:
    """The split that holds every composition of `record` ("train" for single_object), or None when they mix."""
    comps = compositions(record)
    if not comps:
        return "train"
    for split, held in units.items():
        if comps <= held:
            return split
    return None
