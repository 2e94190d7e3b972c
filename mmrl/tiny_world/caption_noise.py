"""Noisy captions for the shapes world's pre-training data, as real text-to-image data has.

Web-scale captions often name a wrong count, a wrong colour or a wrong relation, which is one reason real
text-to-image models fail GenEval's counting, position and attribute-binding tasks while they draw single objects
well (GenEval, Ghosh et al. 2023, section 4; the DALL-E 3 report on recaptioning, Betker et al. 2023). `corrupt`
returns the GenEval record of a scene that the caption describes *wrongly*, so pre-training on
(caption, scene of `corrupt(record)`) for a fraction of the rows teaches the model that captions are unreliable on
exactly these attributes, and leaves it drawing the right picture only part of the time: the regime in which RL on
the GenEval reward has something to sharpen.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import numpy as np

OPPOSITE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
"""Each GenEval relation and its mirror image."""


def corrupt(record: Mapping[str, Any], rng: np.random.Generator, classnames: Sequence[str], colors: Sequence[str],
            max_count: int) -> dict:
    """A copy of a GenEval record with one error a noisy caption makes for its task (`record["tag"]`):

    - single_object / two_object: one object of another class;
    - counting: the count off by one (kept in 1..max_count; the exclude clause follows it);
    - colors: another colour;
    - position: the mirrored relation;
    - color_attr: the two colours swapped (an attribute-binding error), or one colour replaced when
      swapping changes nothing (equal colours or equal classes).
    """
    out = copy.deepcopy(dict(record))
    inc = out["include"]
    tag = out.get("tag")

    def other(options: Sequence[str], current: str) -> str:
        pool = [o for o in options if o != current]
        return pool[int(rng.integers(len(pool)))]

    if tag in ("single_object", "two_object"):
        clause = inc[int(rng.integers(len(inc)))]
        clause["class"] = other(classnames, clause["class"])
    elif tag == "counting":
        n = int(inc[0]["count"])
        steps = [d for d in (-1, 1) if 1 <= n + d <= max_count]
        n = n + steps[int(rng.integers(len(steps)))]
        inc[0]["count"] = n
        out["exclude"] = [{"class": inc[0]["class"], "count": n + 1}]
    elif tag == "colors":
        inc[0]["color"] = other(colors, inc[0]["color"])
    elif tag == "position":
        clause = next(c for c in inc if "position" in c)
        clause["position"] = [OPPOSITE[clause["position"][0]], clause["position"][1]]
    elif tag == "color_attr":
        a, b = inc[0], inc[1]
        if a["color"] != b["color"] and a["class"] != b["class"]:
            a["color"], b["color"] = b["color"], a["color"]
        else:
            a["color"] = other(colors, a["color"])
    else:
        raise ValueError(f"no caption noise for GenEval task {tag!r}; valid: single_object, two_object, counting, "
                         "colors, position, color_attr")
    return out
