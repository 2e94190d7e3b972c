"""Scoring images against GenEval metadata, the same for every detector backend.

`score_image` applies the official selection and rule to one image's detections; `evaluate_folder` walks GenEval's
layout (`<dir>/<NNNNN>/metadata.jsonl` + `samples/<k>.png`) and returns the official `results.jsonl` rows
(`filename`, `tag`, `prompt`, `correct`, `reason`, `metadata`, `details`). An image that is missing or cannot be
read is recorded as incorrect with its reason and an extra `error` key; the rest is scored.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from PIL import Image, ImageOps

from mmrl.geneval.rules import Detection, Options, judge, judge_strict, partial_score, select_detections, validate_metadata, with_colors

ColorFn = Callable[[Image.Image, Sequence[Detection], str], list]
"""classify(image, detections, classname) -> colour names (e.g. `ClipColorClassifier`)."""

IMAGE_NAME = re.compile(r"\d+\.png")


def _colored(image, detected, metadata, classify: ColorFn | None):
    if classify is None:
        return detected
    return with_colors(detected, metadata, lambda dets, name: classify(image, dets, name))


def score_image(
    image: Image.Image | None,
    metadata: Mapping[str, Any],
    detections: Sequence[Detection],
    options: Options = Options(),
    classify: ColorFn | None = None,
    *,
    variants: bool = False,
) -> dict[str, Any]:
    """One image's official outcome: `correct`, `reason`, `details` (JSON string of the kept boxes per class).
    With `variants`, also Flow-GRPO's `strict` (bool) and `partial` (float, with the documented fixes)."""
    detected = select_detections(detections, metadata["tag"], options)
    detected = _colored(image, detected, metadata, classify)
    verdict = judge(detected, metadata, position_threshold=options.position_threshold)
    out = {
        "correct": verdict.correct,
        "reason": verdict.reason,
        "details": json.dumps({k: [d.as_detail() for d in v] for k, v in detected.items()}),
    }
    if variants:
        out["strict"] = judge_strict(detected, metadata, position_threshold=options.position_threshold)
        out["partial"] = partial_score(detected, metadata, position_threshold=options.position_threshold)
    return out


def load_image(path: str | Path) -> Image.Image:
    """Open an image as GenEval does (EXIF orientation applied) and force a full decode, so corrupt files fail here."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)
        im.load()
        return im.convert("RGB")


def scan_folder(images_dir: str | Path) -> list[tuple[str, dict, list[str]]]:
    """[(folder name, metadata record, [image names])] over the all-digit folders, in numeric order; images are the
    `\\d+.png` files of `samples/`, in numeric order. A folder without a readable metadata record raises."""
    root = Path(images_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"images folder {str(root)!r} does not exist")
    entries = []
    for sub in sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: (int(p.name), p.name)):
        meta_path = sub / "metadata.jsonl"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path} is missing (each prompt folder holds its metadata record)")
        try:
            record = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{meta_path}: not a single JSON object ({e.msg})") from None
        validate_metadata(record, str(meta_path))
        samples = sub / "samples"
        names = sorted((n for n in os.listdir(samples) if IMAGE_NAME.fullmatch(n)), key=lambda n: (int(n[:-4]), n)) if samples.is_dir() else []
        entries.append((sub.name, record, names))
    if not entries:
        raise ValueError(f"{str(root)!r} holds no prompt folders (<NNNNN>/metadata.jsonl + samples/<k>.png)")
    return entries


def _row(filename: str, record: dict, **fields: Any) -> dict[str, Any]:
    row = {"filename": filename, "tag": record["tag"], "prompt": record["prompt"], "correct": False, "reason": "",
           "metadata": json.dumps(record), "details": "{}"}
    row.update(fields)
    return row


def evaluate_folder(
    images_dir: str | Path,
    detector,
    options: Options = Options(),
    classify: ColorFn | None = None,
    *,
    batch_size: int = 8,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """The official `results.jsonl` rows for every image under `images_dir` (see the module docstring)."""
    entries = scan_folder(images_dir)
    jobs: list[tuple[str, str, dict]] = []  # (filename, key relative to images_dir, record)
    for folder, record, names in entries:
        for n in names:
            jobs.append((os.path.join(str(images_dir), folder, "samples", n), f"{folder}/samples/{n}", record))
    # Images the detections file names but the folder lacks are missing images.
    table = getattr(detector, "table", None)
    if table is not None:
        known = {key for _, key, _ in jobs}
        records = {folder: record for folder, record, _ in entries}
        for key in sorted(set(table) - known):
            folder = key.split("/", 1)[0]
            if folder in records:
                jobs.append((os.path.join(str(images_dir), key), key, records[folder]))
        used = getattr(detector, "used", None)
        if used is not None:
            used.update(key for _, key, _ in jobs)
    if any("color" in c for _, _, r in jobs for c in r["include"]) and not detector.provides_colors and classify is None \
            and table is None:
        raise ValueError(f"the {detector.name} detector gives no colours and the metadata has colour clauses: "
                         "configure the CLIP colour classifier (--clip-weights)")
    rows: list[dict[str, Any]] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(jobs), desc="geneval evaluate", unit="img", disable=not progress, file=sys.stderr)
    for start in range(0, len(jobs), batch_size):
        batch = jobs[start : start + batch_size]
        images, ok = [], []
        for filename, key, record in batch:
            try:
                images.append(load_image(filename))
                ok.append((filename, key, record))
            except FileNotFoundError:
                rows.append(_row(filename, record, reason="image file is missing", error="missing"))
            except Exception as e:  # any decoder failure: record it and go on
                rows.append(_row(filename, record, reason=f"image could not be read: {type(e).__name__}: {e}", error="unreadable"))
        if images:
            results = detector.detect(images, [k for _, k, _ in ok])
            for (filename, key, record), image, dets in zip(ok, images, results):
                if dets is None:
                    rows.append(_row(filename, record, reason=f"no detections for {key!r} in the detections file", error="no_detections"))
                    continue
                try:
                    scored = score_image(image, record, dets, options, classify)
                except ValueError as e:
                    raise ValueError(f"{filename}: {e}") from None
                rows.append(_row(filename, record, **scored))
        bar.update(len(batch))
    bar.close()
    order = {job[0]: i for i, job in enumerate(jobs)}
    rows.sort(key=lambda r: order[r["filename"]])
    return rows


def write_results(rows: Sequence[Mapping[str, Any]], outfile: str | Path) -> None:
    """One JSON object per line (the official `results.jsonl`)."""
    outfile = Path(outfile)
    if outfile.parent and not outfile.parent.exists():
        outfile.parent.mkdir(parents=True, exist_ok=True)
    with open(outfile, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
