"""GenEval's colour classifier: zero-shot CLIP over object crops (docs/geneval.md).

For class C the classifier's weight for colour c is the normalised mean of the normalised text embeddings of
"a photo of a {c} {C}", "a photo of a {c}-colored {C}" and "a photo of a {c} object" (clip_benchmark's zero-shot
classifier, as GenEval uses it); a crop's colour is the argmax of its normalised image embedding against them. A crop
is the image with the instance mask composited over a flat `bgcolor` (#999 by default; "original" keeps the
image), cut to the box when `crop == "1"`.
"""
from __future__ import annotations

from typing import Sequence

import torch
from PIL import Image

from mmrl.geneval.rules import GENEVAL_COLORS, Detection

TEMPLATES = ("a photo of a {c} {obj}", "a photo of a {c}-colored {obj}", "a photo of a {c} object")


def object_crop(image: Image.Image, det: Detection, bgcolor: str = "#999", crop: str = "1") -> Image.Image:
    """The image the colour of `det` is read from: mask composited over `bgcolor`, then cut to the box."""
    image = image.convert("RGB")
    if det.mask is not None:
        import numpy as np

        mask = np.asarray(det.mask).astype(bool)
        if mask.shape != (image.size[1], image.size[0]):
            raise ValueError(f"instance mask of shape {mask.shape} does not match the image ({image.size[1]}, {image.size[0]})")
        blank = image.copy() if bgcolor == "original" else Image.new("RGB", image.size, color=bgcolor)
        image = Image.composite(image, blank, Image.fromarray(mask.astype("uint8") * 255))
    if crop == "1":
        image = image.crop(tuple(int(round(v)) for v in det.box))
    return image


class ClipColorClassifier:
    """`classify(image, detections, classname) -> [colour name]` with an open_clip model.

    Give either a loaded (`model`, `preprocess`, `tokenizer`) triple, or `model_name` + local `pretrained` weights
    (loaded lazily, once, through `mmrl.models.open_clip.load_open_clip`).
    """

    def __init__(
        self,
        model_name: str = "ViT-L-14",
        pretrained: str | None = None,
        *,
        colors: Sequence[str] = GENEVAL_COLORS,
        bgcolor: str = "#999",
        crop: str = "1",
        device: str = "cpu",
        batch_size: int = 16,
        model=None,
        preprocess=None,
        tokenizer=None,
    ):
        self.model_name, self.pretrained, self.device = model_name, pretrained, device
        self.colors, self.bgcolor, self.crop, self.batch_size = list(colors), bgcolor, crop, batch_size
        self._parts = (model, preprocess, tokenizer) if model is not None else None
        self._weights: dict[str, torch.Tensor] = {}

    def _load(self):
        if self._parts is None:
            from mmrl.models.open_clip import load_open_clip

            self._parts = load_open_clip(self.model_name, self.pretrained, device=self.device)
        return self._parts

    @torch.no_grad()
    def class_weights(self, classname: str) -> torch.Tensor:
        """[D, C] zero-shot weights of the colours for objects of `classname` (cached per class)."""
        if classname not in self._weights:
            model, _, tokenizer = self._load()
            cols = []
            for c in self.colors:
                tokens = tokenizer([t.format(c=c, obj=classname) for t in TEMPLATES]).to(self.device)
                emb = torch.nn.functional.normalize(model.encode_text(tokens).float(), dim=-1)  # [3, D]
                cols.append(torch.nn.functional.normalize(emb.mean(0), dim=-1))  # [D]
            self._weights[classname] = torch.stack(cols, dim=1)  # [D, C]
        return self._weights[classname]

    @torch.no_grad()
    def __call__(self, image: Image.Image, detections: Sequence[Detection], classname: str) -> list[str]:
        if not detections:
            return []
        model, preprocess, _ = self._load()
        weights = self.class_weights(classname)
        out: list[str] = []
        for start in range(0, len(detections), self.batch_size):
            chunk = detections[start : start + self.batch_size]
            pixels = torch.stack([preprocess(object_crop(image, d, self.bgcolor, self.crop)) for d in chunk]).to(self.device)
            feats = torch.nn.functional.normalize(model.encode_image(pixels).float(), dim=-1)  # [B, D]
            out += [self.colors[i] for i in (feats @ weights).argmax(1).tolist()]  # [B, C] -> [B]
        return out
