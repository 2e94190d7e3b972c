"""GenEval prompt suites: the official 553-prompt metadata (vendored, MIT) and a generator with the official rules.

The generator follows djghosh13/geneval `prompts/create_prompts.py` (docs/geneval.md, "Prompt suites"): the
same six tasks, templates, numpy `default_rng(seed)` draws in the same order (default seed 43, `n` = 100 per task),
and de-duplication, so `generate_suite()` over the COCO names reproduces the shipped `evaluation_metadata.jsonl`
line for line. Any other vocabulary (e.g. the shapes world's) gives a new suite under the same rules.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from mmrl.geneval.rules import GENEVAL_COLORS, RELATIONS, validate_metadata

DATA_DIR = Path(__file__).resolve().parent / "data"
OFFICIAL_METADATA = DATA_DIR / "evaluation_metadata.jsonl"
OBJECT_NAMES = DATA_DIR / "object_names.txt"
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def coco_names() -> list[str]:
    """GenEval's 80 class names in COCO order (with "computer mouse", "tv remote", "computer keyboard")."""
    return [line.strip() for line in OBJECT_NAMES.read_text().splitlines() if line.strip()]


def official_metadata() -> list[dict]:
    """The 553 official metadata records, in file order."""
    return read_metadata(OFFICIAL_METADATA)


def read_metadata(path: str | Path) -> list[dict]:
    """A metadata JSONL file (one record per line), every record validated; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metadata file {str(path)!r} does not exist")
    records = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        validate_metadata(record, f"{path}:{lineno}")
        records.append(record)
    if not records:
        raise ValueError(f"metadata file {str(path)!r} holds no records")
    return records


def vocabulary(name: str, known: dict[str, tuple[Sequence[str], Sequence[str]]] | None = None) -> tuple[list[str], list[str]]:
    """(class names, colour names) of a named vocabulary: "coco" (GenEval's), one of `known` (name -> (classes,
    colours), e.g. the tiny world's "shapes", which the `mmrl geneval` command passes), or a path to a text file
    with one class name per line (GenEval's colours). GenEval itself knows no other world."""
    if name == "coco":
        return coco_names(), list(GENEVAL_COLORS)
    if known and name in known:
        names, colors = known[name]
        return list(names), list(colors)
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"unknown vocabulary {name!r}: not 'coco', {sorted(known or {})} or an existing file of class names")
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"vocabulary file {name!r} must list at least 2 distinct class names, one per line")
    return names, list(GENEVAL_COLORS)


def with_article(name: str) -> str:
    """GenEval's article rule: "an" before a vowel letter, else "a"."""
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def make_plural(name: str) -> str:
    """GenEval's plural rule: +"es" after a final "s", else +"s"."""
    return f"{name}es" if name[-1] in "s" else f"{name}s"


def _index_pool(rng: np.random.Generator, names: Sequence[str], size: int | None):
    """Class indices for the colour tasks, skipping "person" exactly as the official offset trick does when the
    vocabulary has it (no "[colour] person" prompts); plain draws otherwise."""
    if "person" in names:
        person = list(names).index("person")
        idx = rng.choice(len(names) - 1, size=size, replace=False) + 1 if size else rng.choice(len(names) - 1) + 1
        return (idx + person) % len(names)
    return rng.choice(len(names), size=size, replace=False) if size else rng.choice(len(names))


def generate_suite(
    seed: int | np.random.Generator = 43,
    n: int = 100,
    classnames: Sequence[str] | None = None,
    colors: Sequence[str] = GENEVAL_COLORS,
    max_count: int = 4,
) -> list[dict]:
    """A GenEval suite with the official rules: every class once (single_object), then `n` draws each of
    two_object, counting (2..max_count, exclude count + 1), colors, position and color_attr, de-duplicated."""
    names = list(coco_names() if classnames is None else classnames)
    colors = list(colors)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"a suite needs at least 2 distinct class names, got {names!r}")
    if len(colors) < 2 or len(set(colors)) != len(colors):
        raise ValueError(f"a suite needs at least 2 distinct colours, got {colors!r}")
    if not 2 <= max_count < len(NUMBERS):
        raise ValueError(f"max_count must lie in 2..{len(NUMBERS) - 1}, got {max_count}")
    if n < 0:
        raise ValueError(f"n (draws per task) must be >= 0, got {n}")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    samples: list[dict] = []
    for idx in rng.choice(len(names), size=len(names), replace=False):
        samples.append({"tag": "single_object", "include": [{"class": names[idx], "count": 1}],
                        "prompt": f"a photo of {with_article(names[idx])}"})
    for _ in range(n):
        a, b = rng.choice(len(names), size=2, replace=False)
        samples.append({"tag": "two_object", "include": [{"class": names[a], "count": 1}, {"class": names[b], "count": 1}],
                        "prompt": f"a photo of {with_article(names[a])} and {with_article(names[b])}"})
    for _ in range(n):
        idx = rng.choice(len(names))
        num = int(rng.integers(2, max_count, endpoint=True))
        samples.append({"tag": "counting", "include": [{"class": names[idx], "count": num}],
                        "exclude": [{"class": names[idx], "count": num + 1}],
                        "prompt": f"a photo of {NUMBERS[num]} {make_plural(names[idx])}"})
    for _ in range(n):
        idx = _index_pool(rng, names, None)
        color = colors[rng.choice(len(colors))]
        samples.append({"tag": "colors", "include": [{"class": names[idx], "count": 1, "color": color}],
                        "prompt": f"a photo of {with_article(color)} {names[idx]}"})
    for _ in range(n):
        a, b = rng.choice(len(names), size=2, replace=False)
        rel = RELATIONS[rng.choice(len(RELATIONS))]
        samples.append({"tag": "position",
                        "include": [{"class": names[b], "count": 1}, {"class": names[a], "count": 1, "position": [rel, 0]}],
                        "prompt": f"a photo of {with_article(names[a])} {rel} {with_article(names[b])}"})
    for _ in range(n):
        a, b = _index_pool(rng, names, 2)
        ca, cb = rng.choice(len(colors), size=2, replace=False)
        samples.append({"tag": "color_attr",
                        "include": [{"class": names[a], "count": 1, "color": colors[ca]},
                                    {"class": names[b], "count": 1, "color": colors[cb]}],
                        "prompt": f"a photo of {with_article(colors[ca])} {names[a]} and {with_article(colors[cb])} {names[b]}"})
    unique, seen = [], set()
    for s in samples:
        key = json.dumps(s, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(s)
    return unique


TRAIN_SEEDS = tuple(range(10))
"""Seeds of the default GenEval training suite (`training_suite`); the official evaluation suite is seed 43."""


def prompt_key(prompt: str) -> str:
    """The form two prompts are compared in: case and surrounding / repeated whitespace ignored."""
    return " ".join(prompt.split()).lower()


def overlap_with_evaluation(records: Sequence[dict]) -> list[str]:
    """The prompts of `records` that are also prompts of the 553 official evaluation records (in record order)."""
    official = {prompt_key(m["prompt"]) for m in official_metadata()}
    return [r["prompt"] for r in records if prompt_key(r["prompt"]) in official]


def training_suite(seeds: Sequence[int] = TRAIN_SEEDS, n: int = 100) -> list[dict]:
    """GenEval training prompts disjoint from the evaluation set: `generate_suite(seed, n)` (the official rules over
    the COCO names) for every seed in `seeds`, concatenated in seed order, de-duplicated by prompt, with every
    prompt of the 553 official evaluation records removed (as Flow-GRPO's `dataset/geneval_filter_test.py` does for
    its training metadata).

    With the defaults (seeds 0..9, n = 100): 3543 prompts, two_object 912, counting 159, colors 495, position 977,
    color_attr 1000, and no single_object prompt, since all 80 "a photo of a/an <class>" prompts are evaluation
    prompts. Deterministic (numpy `default_rng(seed)` draws), so it is generated when used rather than shipped.
    """
    if 43 in seeds:
        raise ValueError("seed 43 generates the official evaluation suite; choose other training seeds")
    official = {prompt_key(m["prompt"]) for m in official_metadata()}
    out, seen = [], set()
    for seed in seeds:
        for record in generate_suite(seed, n):
            key = prompt_key(record["prompt"])
            if key not in official and key not in seen:
                seen.add(key)
                out.append(record)
    return out


def write_suite(records: Sequence[dict], outdir: str | Path) -> tuple[Path, Path]:
    """Write `evaluation_metadata.jsonl` and `generation_prompts.txt` (the official file names) into `outdir`."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    meta, prompts = outdir / "evaluation_metadata.jsonl", outdir / "generation_prompts.txt"
    meta.write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts.write_text("".join(r["prompt"] + "\n" for r in records))
    return meta, prompts


def _alternation(words: Sequence[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


def parse_prompt(prompt: str, classnames: Sequence[str], colors: Sequence[str] = GENEVAL_COLORS) -> dict[str, Any]:
    """The metadata record of a prompt written with the GenEval templates over `classnames` and `colors`
    (the inverse of `generate_suite`'s templates); raises ValueError if the prompt fits no template."""
    names, cols = _alternation(classnames), _alternation(colors)
    plurals = {make_plural(c): c for c in classnames}
    art = r"an? "
    text = prompt.strip()
    m = re.fullmatch(rf"a photo of ({'|'.join(NUMBERS[2:])}) ({_alternation(list(plurals))})", text)
    if m:
        n, name = NUMBERS.index(m.group(1)), plurals[m.group(2)]
        return {"tag": "counting", "include": [{"class": name, "count": n}], "exclude": [{"class": name, "count": n + 1}],
                "prompt": prompt}
    m = re.fullmatch(rf"a photo of {art}({cols}) ({names}) and {art}({cols}) ({names})", text)
    if m:
        return {"tag": "color_attr", "include": [{"class": m.group(2), "count": 1, "color": m.group(1)},
                                                 {"class": m.group(4), "count": 1, "color": m.group(3)}], "prompt": prompt}
    m = re.fullmatch(rf"a photo of {art}({cols}) ({names})", text)
    if m:
        return {"tag": "colors", "include": [{"class": m.group(2), "count": 1, "color": m.group(1)}], "prompt": prompt}
    m = re.fullmatch(rf"a photo of {art}({names}) ({_alternation(RELATIONS)}) {art}({names})", text)
    if m:
        return {"tag": "position", "include": [{"class": m.group(3), "count": 1},
                                               {"class": m.group(1), "count": 1, "position": [m.group(2), 0]}], "prompt": prompt}
    m = re.fullmatch(rf"a photo of {art}({names}) and {art}({names})", text)
    if m:
        return {"tag": "two_object", "include": [{"class": m.group(1), "count": 1}, {"class": m.group(2), "count": 1}],
                "prompt": prompt}
    m = re.fullmatch(rf"a photo of {art}({names})", text)
    if m:
        return {"tag": "single_object", "include": [{"class": m.group(1), "count": 1}], "prompt": prompt}
    raise ValueError(f"prompt {prompt!r} fits no GenEval template over the given vocabulary")
