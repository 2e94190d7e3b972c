"""Scoring images against GenEval metadata, the same for every detector backend.

`score_image` applies the official selection and rule to one image's detections; `evaluate_folder` walks GenEval's
layout (`<dir>/<NNNNN>/metadata.jsonl` + `samples/<k>.png`) and returns the official `results.jsonl` rows
(`filename`, `tag`, `prompt`, `correct`, `reason`, `metadata`, `details`). An image that is missing, cannot be
read, is larger than `MAX_IMAGE_PIXELS` (checked from its header, before decoding) or makes the detector fail is
recorded as incorrect with its reason and an extra `error` key; a prompt folder without images is one incorrect row
(`error: no_images`: its prompt counts as failed, not as absent); the rest is scored. A prompt folder whose
`metadata.jsonl` is missing or malformed cannot be scored: it is reported in `FolderScan.skipped` and the others
are scored. Files in `samples/` that look like images but are not named `<digits>.png` (e.g. `0000.PNG`, which the
official script skips too) are reported in `FolderScan.ignored`. A `metadata.jsonl` nested too deeply for Python's
JSON reader or larger than `MAX_METADATA_BYTES` skips its folder the same way (the others are scored); an entry of
`samples/` that is not a regular file (a FIFO, a device) is an incorrect row with `error: not_a_file`, never opened
(opening a FIFO blocks). Each prompt's metadata is serialised once and that one string shared by its rows.
"""
from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from PIL import Image, ImageOps

from mmrl.geneval.rules import Detection, Options, judge, judge_strict, partial_score, select_detections, validate_metadata, with_colors

ColorFn = Callable[[Image.Image, Sequence[Detection], str], list]
"""classify(image, detections, classname) -> colour names (e.g. `ClipColorClassifier`)."""

IMAGE_NAME = re.compile(r"\d+\.png")
IMAGE_LIKE = re.compile(r".*\.(png|jpe?g|webp|bmp|gif)", re.IGNORECASE)
MAX_IMAGE_PIXELS = 4096 * 4096
"""Larger images are refused from their header (GenEval's are 512-1024 px; a 9000x9000 PNG decodes to 243 MB)."""


MAX_METADATA_BYTES = 2**20
"""Largest `metadata.jsonl` read (GenEval's records are a few hundred bytes; a 300 MB one was copied into every row)."""


class NotARegularFile(ValueError):
    """A sample path that is a FIFO, socket, device or directory (opening a FIFO would block)."""


class ImageTooLarge(ValueError):
    """An image whose header announces more than `MAX_IMAGE_PIXELS` pixels (not decoded)."""


class FolderScan(list):
    """`scan_folder`'s [(folder name, metadata record, [image names])], with `skipped` [(metadata path, reason)]
    for prompt folders that cannot be scored and `ignored` [paths] of image-like files that are not `<digits>.png`."""

    def __init__(self, entries=(), skipped=(), ignored=()):
        super().__init__(entries)
        self.skipped, self.ignored = list(skipped), list(ignored)


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
    flow_grpo_exact: bool = False,
) -> dict[str, Any]:
    """One image's official outcome: `correct`, `reason`, `details` (JSON string of the kept boxes per class).
    With `variants`, also Flow-GRPO's `strict` (bool) and `partial` (float, with the documented fixes, or exactly
    Flow-GRPO's with `flow_grpo_exact`, `mmrl.geneval.rules.partial_score`)."""
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
        out["partial"] = partial_score(detected, metadata, position_threshold=options.position_threshold,
                                       flow_grpo_exact=flow_grpo_exact)
    return out


def load_image(path: str | Path) -> Image.Image:
    """Open an image as GenEval does (EXIF orientation applied) and force a full decode, so corrupt files fail here."""
    mode = os.stat(path).st_mode  # never blocks, unlike opening a FIFO
    if not stat.S_ISREG(mode):
        raise NotARegularFile(f"{path} is not a regular file ({stat.filemode(mode)}); not opened")
    with Image.open(path) as im:
        if im.width * im.height > MAX_IMAGE_PIXELS:
            raise ImageTooLarge(f"image of {im.width}x{im.height} px is larger than {MAX_IMAGE_PIXELS} pixels; not decoded")
        im = ImageOps.exif_transpose(im)
        im.load()
        return im.convert("RGB")


def scan_folder(images_dir: str | Path) -> FolderScan:
    """[(folder name, metadata record, [image names])] over the all-digit folders, in numeric order; images are the
    `\\d+.png` files of `samples/`, in numeric order. A folder without a readable metadata record is reported in
    `.skipped`; with no scorable folder at all this raises, naming the first problem."""
    root = Path(images_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"images folder {str(root)!r} does not exist")
    scan = FolderScan()
    for sub in sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: (int(p.name), p.name)):
        meta_path = sub / "metadata.jsonl"
        try:
            if not meta_path.is_file():
                raise FileNotFoundError(f"{meta_path} is missing (each prompt folder holds its metadata record)")
            size = meta_path.stat().st_size
            if size > MAX_METADATA_BYTES:
                raise ValueError(f"{meta_path} holds {size:,} bytes, more than the {MAX_METADATA_BYTES:,} a metadata record "
                                 "may have (GenEval's are a few hundred)")
            try:
                record = json.loads(meta_path.read_text())
                validate_metadata(record, str(meta_path))
            except json.JSONDecodeError as e:
                raise ValueError(f"{meta_path}: not a single JSON object ({e.msg})") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{meta_path}: not UTF-8 text ({e.reason})") from None
            except RecursionError:
                raise ValueError(f"{meta_path}: JSON nested too deeply to read") from None
        except (ValueError, FileNotFoundError) as e:
            scan.skipped.append((str(meta_path), str(e)))
            continue
        samples = sub / "samples"
        listed = os.listdir(samples) if samples.is_dir() else []
        names = sorted((n for n in listed if IMAGE_NAME.fullmatch(n)), key=lambda n: (int(n[:-4]), n))
        scan.ignored += [str(samples / n) for n in sorted(listed) if IMAGE_LIKE.fullmatch(n) and not IMAGE_NAME.fullmatch(n)]
        scan.append((sub.name, record, names))
    if not scan:
        if scan.skipped:
            raise ValueError(f"no prompt folder of {str(root)!r} can be scored: {scan.skipped[0][1]}")
        raise ValueError(f"{str(root)!r} holds no prompt folders (<NNNNN>/metadata.jsonl + samples/<k>.png)")
    return scan


def _row(filename: str, record: dict, metadata: str | None = None, **fields: Any) -> dict[str, Any]:
    row = {"filename": filename, "tag": record["tag"], "prompt": record["prompt"], "correct": False, "reason": "",
           "metadata": json.dumps(record) if metadata is None else metadata, "details": "{}"}
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
    texts = {id(record): json.dumps(record) for _, record, _ in entries}  # each prompt's metadata serialised once

    def make_row(filename: str, record: dict, **fields: Any) -> dict[str, Any]:
        return _row(filename, record, texts.get(id(record)), **fields)

    jobs: list[tuple[str, str, dict]] = []  # (filename, key relative to images_dir, record)
    empty: list[dict[str, Any]] = []
    for folder, record, names in entries:
        for n in names:
            jobs.append((os.path.join(str(images_dir), folder, "samples", n), f"{folder}/samples/{n}", record))
        if not names:  # scored as failed: dropping it would raise the score of its task
            empty.append(make_row(os.path.join(str(images_dir), folder, "samples"), record, reason="no images in the prompt folder",
                              error="no_images"))
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
                rows.append(make_row(filename, record, reason="image file is missing", error="missing"))
            except ImageTooLarge as e:
                rows.append(make_row(filename, record, reason=str(e), error="too_large"))
            except NotARegularFile as e:
                rows.append(make_row(filename, record, reason=str(e), error="not_a_file"))
            except Exception as e:  # any decoder failure: record it and go on
                rows.append(make_row(filename, record, reason=f"image could not be read: {type(e).__name__}: {e}", error="unreadable"))
        if images:
            results = _detect(detector, images, [k for _, k, _ in ok])
            for (filename, key, record), image, dets in zip(ok, images, results):
                if isinstance(dets, Exception):
                    rows.append(make_row(filename, record, reason=f"the detector failed on this image: {type(dets).__name__}: {dets}",
                                     error="detector_failed"))
                    continue
                if dets is None:
                    rows.append(make_row(filename, record, reason=f"no detections for {key!r} in the detections file", error="no_detections"))
                    continue
                try:
                    scored = score_image(image, record, dets, options, classify)
                except ValueError as e:
                    raise ValueError(f"{filename}: {e}") from None
                rows.append(make_row(filename, record, **scored))
        bar.update(len(batch))
    bar.close()
    order = {job[0]: i for i, job in enumerate(jobs)}
    rows.sort(key=lambda r: order[r["filename"]])
    return FolderScan(rows + empty, entries.skipped, entries.ignored)


def _detect(detector, images: list, keys: list[str]) -> list:
    """The detector's results for a batch; if the batch fails, image by image, an image's failure in its place."""
    try:
        return list(detector.detect(images, keys))
    except Exception as e:
        if len(images) == 1:
            return [e]
    out: list = []
    for image, key in zip(images, keys):
        try:
            out.extend(detector.detect([image], [key]))
        except Exception as e:  # e.g. a 1x1 image: this image fails, the evaluation goes on
            out.append(e)
    return out


def write_results(rows: Sequence[Mapping[str, Any]], outfile: str | Path) -> None:
    """One JSON object per line (the official `results.jsonl`)."""
    outfile = Path(outfile)
    if outfile.parent and not outfile.parent.exists():
        outfile.parent.mkdir(parents=True, exist_ok=True)
    with open(outfile, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
