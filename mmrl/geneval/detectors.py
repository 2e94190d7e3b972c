"""GenEval detector backends. Each turns images into `Detection`s (all classes, any order); the scoring code after
that (`mmrl.geneval.scoring`, `mmrl.geneval.rules`) is the same for every backend.

- `shapes`: the tiny world's exact detector (`mmrl.tiny_world.shapes.ShapesDetector`, registered by
  `mmrl.tiny_world.register()`): class, colour, box; score 1.
- `precomputed`: detections read from a JSONL file, one line per image:
  `{"image": "<path relative to the images folder>", "objects": [{"class": str, "box": [x1, y1, x2, y2],
  "score": float, "color": str or null}]}`; a given colour is used instead of the CLIP classifier.
- `hf`: a transformers detector from a local directory: Mask2Former (instance segmentation, closest to the
  official mmdet Mask2Former), OWLv2 / OWL-ViT or Grounding DINO (open vocabulary, queried with the class names).
  Class names map to GenEval's through the COCO label mapping (`coco_label_map`). No colours: configure the CLIP
  colour classifier.
- `mmdet`: the official detector (mmdetection 2.x `init_detector` / `inference_detector`), when installed.

Scores from detectors other than the official Mask2Former are not comparable to published GenEval numbers (the
0.3 / 0.9 thresholds were set for it; docs/geneval.md, "Detector backends").
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
from PIL import Image

from mmrl.geneval.rules import Detection

BUILTIN_DETECTORS = ("mmdet", "hf", "precomputed")
_PLUGINS: dict[str, Any] = {}


def register_detector(name: str, factory) -> None:
    """Add a detector backend: `factory(**config) -> Detector` (the tiny world adds its exact `shapes` detector
    this way, so the GenEval library does not depend on it)."""
    _PLUGINS[name] = factory


def detector_names() -> tuple[str, ...]:
    """Every backend `build_detector` accepts now: the built-in ones and the registered ones."""
    return (*BUILTIN_DETECTORS, *_PLUGINS)

COCO_ALIASES = {
    "mouse": "computer mouse",
    "remote": "tv remote",
    "keyboard": "computer keyboard",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "sofa": "couch",
    "motorbike": "motorcycle",
    "aeroplane": "airplane",
    "diningtable": "dining table",
    "pottedplant": "potted plant",
    "cellphone": "cell phone",
    "hair dryer": "hair drier",
}
"""Other spellings of COCO class names -> GenEval's (GenEval renames mouse, remote and keyboard)."""


class Detector(Protocol):
    name: str
    provides_colors: bool
    """True when every detection carries its colour (no colour classifier needed)."""

    def detect(self, images: Sequence[Image.Image], keys: Sequence[str] | None = None) -> list[list[Detection] | None]:
        """Detections per image; `keys` are the images' paths relative to the images folder (used by
        `precomputed`); None for an image means "no detections are available for it" (recorded as an error)."""
        ...


def coco_label_map(labels: dict[int, str], vocabulary: Sequence[str]) -> dict[int, str]:
    """Detector label id -> GenEval class name: exact names, COCO aliases (`COCO_ALIASES`), underscores and case
    ignored; labels outside `vocabulary` (e.g. panoptic "stuff" classes) are left out."""
    vocab = {v.lower(): v for v in vocabulary}
    out = {}
    for idx, label in labels.items():
        key = str(label).lower().replace("_", " ").strip()
        key = COCO_ALIASES.get(key, key)
        if key in vocab:
            out[int(idx)] = vocab[key]
    return out


def _normkey(key: str) -> str:
    return os.path.normpath(key).replace(os.sep, "/")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def read_detections(path: str | Path) -> dict[str, list[Detection]]:
    """Parse a precomputed-detections JSONL file (format in the module docstring); errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"detections file {str(path)!r} does not exist")
    table: dict[str, list[Detection]] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("image"), str) or not isinstance(row.get("objects"), list):
            raise ValueError(f"{where}: each line must be {{\"image\": str, \"objects\": [...]}}, got {line[:200]!r}")
        key = _normkey(row["image"])
        if key in table:
            raise ValueError(f"{where}: image {row['image']!r} appears twice")
        dets = []
        for j, obj in enumerate(row["objects"]):
            at = f"{where}: objects[{j}]"
            if not isinstance(obj, dict):
                raise ValueError(f"{at}: must be an object, got {obj!r}")
            unknown = sorted(set(obj) - {"class", "box", "score", "color"})
            if unknown:
                raise ValueError(f"{at}: unknown key(s) {unknown}; allowed: ['box', 'class', 'color', 'score']")
            if not isinstance(obj.get("class"), str) or not obj["class"]:
                raise ValueError(f"{at}: 'class' must be a non-empty string, got {obj.get('class')!r}")
            box = obj.get("box")
            if not isinstance(box, list) or len(box) != 4:
                raise ValueError(f"{at}: 'box' must be [x1, y1, x2, y2], got {box!r}")
            box = tuple(_number(v, f"{at}: box value") for v in box)
            if box[2] < box[0] or box[3] < box[1]:
                raise ValueError(f"{at}: box {list(box)} has x2 < x1 or y2 < y1")
            if "score" not in obj:
                raise ValueError(f"{at}: 'score' is missing")
            score = _number(obj["score"], f"{at}: 'score'")
            color = obj.get("color")
            if color is not None and not isinstance(color, str):
                raise ValueError(f"{at}: 'color' must be a string or null, got {color!r}")
            dets.append(Detection(obj["class"], box, score, color))
        table[key] = dets
    return table


class PrecomputedDetector:
    """Detections read from a JSONL file, looked up by image path relative to the images folder."""

    name = "precomputed"
    provides_colors = False  # per detection: null colours go to the classifier

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.table = read_detections(path)
        self.used: set[str] = set()

    def detect(self, images, keys=None):
        if keys is None:
            raise ValueError("the precomputed detector looks detections up by image path: pass keys")
        out = []
        for key in keys:
            key = _normkey(key)
            self.used.add(key)
            out.append(self.table.get(key))
        return out


class HFDetector:
    """A transformers detector from a local directory (model + processor saved with `save_pretrained`).

    `model_type` in its config.json selects the family: "mask2former" (instance masks; scores = class probability x
    mean mask probability, boxes from the masks as mmdet computes them; needs scipy), "owlv2" / "owlvit" (queried with
    every name of `vocabulary`; a box's class is its best query) or "grounding-dino" (queried with "name . name ."
    texts of `names_per_query` names; a box's class is the name whose tokens score highest). Raw scores are kept so
    the GenEval thresholds apply as for any backend.
    """

    name = "hf"
    provides_colors = False
    FAMILIES = ("mask2former", "owlv2", "owlvit", "grounding-dino")

    def __init__(self, path: str | Path, *, vocabulary: Sequence[str] | None = None, device: str = "cpu",
                 label_map: dict[str, str] | None = None, batch_size: int = 4, names_per_query: int = 20):
        from mmrl.geneval.prompts import coco_names

        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"hf detector: {str(path)!r} is not a local model directory with a config.json")
        self.model_type = json.loads((path / "config.json").read_text()).get("model_type")
        if self.model_type not in self.FAMILIES:
            raise ValueError(f"hf detector: model_type {self.model_type!r} is not supported; supported: {list(self.FAMILIES)}")
        self.vocabulary = list(vocabulary) if vocabulary is not None else coco_names()
        self.device, self.batch_size, self.names_per_query = device, batch_size, int(names_per_query)
        import transformers

        if self.model_type == "mask2former":
            try:
                import scipy  # noqa: F401  (transformers' Mask2Former builds its matcher with scipy)
            except ImportError:
                raise ImportError("the hf Mask2Former backend needs scipy: pip install 'mmrl[geneval]'") from None
            self.model = transformers.Mask2FormerForUniversalSegmentation.from_pretrained(path, local_files_only=True)
            self.processor = transformers.AutoImageProcessor.from_pretrained(path, local_files_only=True)
            labels = {int(k): v for k, v in self.model.config.id2label.items()}
            if label_map:
                labels = {k: label_map.get(v, v) for k, v in labels.items()}
            self.labels = coco_label_map(labels, self.vocabulary)
        else:
            auto = transformers.AutoModelForZeroShotObjectDetection
            self.model = auto.from_pretrained(path, local_files_only=True)
            self.processor = transformers.AutoProcessor.from_pretrained(path, local_files_only=True)
        self.model.to(device).eval()

    def detect(self, images, keys=None):
        out = []
        for start in range(0, len(images), self.batch_size):
            out += self._detect([im.convert("RGB") for im in images[start : start + self.batch_size]])
        return out

    def _detect(self, images: list[Image.Image]) -> list[list[Detection]]:
        import torch

        sizes = [(im.size[1], im.size[0]) for im in images]
        with torch.no_grad():
            if self.model_type == "mask2former":
                inputs = self.processor(images=images, return_tensors="pt").to(self.device)
                outputs = self.model(**inputs)
                results = self.processor.post_process_instance_segmentation(
                    outputs, threshold=0.0, target_sizes=sizes, return_binary_maps=True
                )
                return [self._instances(r) for r in results]
            if self.model_type == "grounding-dino":
                return self._grounding_dino(images, sizes)
            inputs = self.processor(text=[self.vocabulary] * len(images), images=images, return_tensors="pt",
                                    padding=True, truncation=True).to(self.device)
            outputs = self.model(**inputs)
            # OWLv2 pads images to a square before resizing, so boxes are relative to the padded side. Threshold -1
            # keeps every box (scores are sigmoids), so that GenEval's own thresholds decide.
            padded = [(max(s), max(s)) for s in sizes] if self.model_type == "owlv2" else sizes
            results = self.processor.post_process_grounded_object_detection(outputs, threshold=-1.0, target_sizes=padded)
            return [self._named(r, [self.vocabulary[int(i)] for i in r["labels"]]) for r in results]

    def _grounding_dino(self, images: list[Image.Image], sizes: list[tuple[int, int]]) -> list[list[Detection]]:
        """Grounding DINO reads "name . name . ... ." (in chunks of `names_per_query` names); a box's class is the
        name whose tokens reach the highest sigmoid score, which is also its score."""
        import torch

        found: list[list[Detection]] = [[] for _ in images]
        for start in range(0, len(self.vocabulary), self.names_per_query):
            names = self.vocabulary[start : start + self.names_per_query]
            text, spans = "", []
            for name in names:
                spans.append((len(text), len(text) + len(name)))
                text += name + " . "
            text = text.strip()
            enc = self.processor.tokenizer([text], return_offsets_mapping=True)
            token_phrase = torch.full((len(enc["input_ids"][0]),), -1, dtype=torch.long)  # [L]
            for t, (a, b) in enumerate(enc["offset_mapping"][0]):
                for k, (lo, hi) in enumerate(spans):
                    if b > a and lo <= a and b <= hi:
                        token_phrase[t] = k
            inputs = self.processor(images=images, text=[text] * len(images), return_tensors="pt").to(self.device)
            outputs = self.model(**inputs)
            probs = outputs.logits.sigmoid().float().cpu()  # [B, Q, max_text_len]
            length = min(probs.shape[-1], token_phrase.shape[0])
            per_name = torch.stack(
                [probs[..., :length][..., token_phrase[:length] == k].amax(-1) if (token_phrase[:length] == k).any()
                 else torch.zeros(probs.shape[:2]) for k in range(len(names))], dim=-1)  # [B, Q, P]
            scores, best = per_name.max(-1)  # [B, Q]
            boxes = outputs.pred_boxes.float().cpu()  # [B, Q, 4] as (cx, cy, w, h) in [0, 1]
            for i, (h, w) in enumerate(sizes):
                cx, cy, bw, bh = boxes[i].unbind(-1)
                corners = torch.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w, (cy + bh / 2) * h], -1)
                for q in range(corners.shape[0]):
                    found[i].append(Detection(names[int(best[i, q])], tuple(corners[q].tolist()), float(scores[i, q])))
        return found

    def _instances(self, result: dict) -> list[Detection]:
        dets = []
        maps = result["segmentation"]
        for j, seg in enumerate(result["segments_info"]):
            label = self.labels.get(int(seg["label_id"]))
            if label is None or maps is None:
                continue
            mask = maps[j].bool().cpu().numpy()
            ys, xs = np.nonzero(mask)
            if len(xs) == 0:
                continue
            # mmdet's mask2bbox: [min x, min y, max x + 1, max y + 1]
            box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
            dets.append(Detection(label, box, float(seg["score"]), None, mask))
        return dets

    def _named(self, result: dict, names: Sequence[Any]) -> list[Detection]:
        vocab = {v.lower(): v for v in self.vocabulary}
        dets = []
        for box, score, name in zip(result["boxes"].tolist(), result["scores"].tolist(), names):
            label = vocab.get(str(name).lower().strip())
            if label is not None:
                dets.append(Detection(label, tuple(float(v) for v in box), float(score)))
        return dets


class MMDetDetector:
    """The official GenEval detector through mmdetection 2.x (`init_detector`, `inference_detector`); class index k
    is `vocabulary[k]` (GenEval's 80 names in COCO order)."""

    name = "mmdet"
    provides_colors = False

    def __init__(self, model_config: str | None, model_path: str, model: str, *, device: str = "cpu",
                 vocabulary: Sequence[str] | None = None):
        try:
            import mmdet
            from mmdet.apis import inference_detector, init_detector
        except ImportError as e:
            raise ImportError(
                "the mmdet detector needs mmdetection 2.x and mmcv-full (see GenEval's README); "
                f"they are not importable here ({e}). Other detectors: hf, shapes, precomputed"
            ) from None
        from mmrl.geneval.prompts import coco_names

        if model_config is None:
            model_config = os.path.join(os.path.dirname(mmdet.__file__), "../configs/mask2former/" + model + ".py")
        ckpt = os.path.join(model_path, f"{model}.pth")
        for p, what in ((model_config, "--model-config"), (ckpt, "checkpoint (--model-path/<model>.pth)")):
            if not os.path.isfile(p):
                raise FileNotFoundError(f"mmdet detector: {what} {p!r} does not exist")
        self._infer = inference_detector
        self.model = init_detector(model_config, ckpt, device=device)
        self.vocabulary = list(vocabulary) if vocabulary is not None else coco_names()

    def detect(self, images, keys=None):
        out = []
        for im in images:
            bgr = np.ascontiguousarray(np.asarray(im.convert("RGB"))[:, :, ::-1])  # mmdet reads BGR arrays
            result = self._infer(self.model, bgr)
            bbox = result[0] if isinstance(result, tuple) else result
            segm = result[1] if isinstance(result, tuple) and len(result) > 1 else None
            dets = []
            for k, name in enumerate(self.vocabulary):
                for j, row in enumerate(bbox[k]):
                    mask = None if segm is None else np.asarray(segm[k][j])
                    dets.append(Detection(name, tuple(float(v) for v in row[:4]), float(row[4]), None, mask))
            out.append(dets)
        return out


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_detector(name: str, **config: Any) -> Detector:
    """A detector backend by name (`detector_names()`); config keys per backend:
    shapes (the tiny world's, registered): grid; precomputed: detections (path); hf: model_path, vocabulary, device, label_map, batch_size;
    mmdet: model_config, model_path, model, device, vocabulary."""
    if name in _PLUGINS:
        return _PLUGINS[name](**config)
    if name == "precomputed":
        if not config.get("detections"):
            raise ValueError("the precomputed detector needs a detections file (--detections dets.jsonl)")
        return PrecomputedDetector(config["detections"])
    if name == "hf":
        if not config.get("model_path"):
            raise ValueError("the hf detector needs a local model directory (--model-path DIR)")
        return HFDetector(config["model_path"], vocabulary=config.get("vocabulary"), device=config.get("device") or "cpu",
                          label_map=config.get("label_map"), batch_size=config.get("batch_size") or 4)
    if name == "mmdet":
        return MMDetDetector(config.get("model_config"), config.get("model_path") or "./",
                             config.get("model") or "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco",
                             device=config.get("device") or _default_device(), vocabulary=config.get("vocabulary"))
    raise ValueError(f"unknown detector {name!r}; valid detectors: {list(detector_names())}")
