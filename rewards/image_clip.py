"""CLIP score reward for image models, with open_clip and local weights only (never a download).

`clip_score` = scale x cos(image embedding, prompt text embedding), the reward SimpleAR trains with (docs/sources.md
"T2I branch"; CLIPScore's w = 2.5 and max(., 0) are `scale=2.5, clip_at_zero=True`). The model is an
open_clip architecture name with a local checkpoint file (`model_name="ViT-L-14", pretrained="/path/to/weights"`) or a
local open_clip directory (`model_name="local-dir:/path"` holding `open_clip_config.json` and the weights).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from mmrl.core.registry import REWARDS
from mmrl.models.open_clip import check_local as _check_local
from mmrl.models.open_clip import load_open_clip
from mmrl.rewards.completions import prompt_text

__all__ = ["ClipScore", "load_open_clip"]


@REWARDS.register("clip_score")
class ClipScore:
    """`clip_score(prompts, completions)`: scale x cosine similarity of each image to its prompt's text.

    Args:
        model_name, pretrained: see the module docstring (loaded lazily on the first call, once per process).
        model, preprocess, tokenizer: an already built open_clip model instead (e.g. a tiny one in tests).
        scale, clip_at_zero: the reward is `scale * (max(cos, 0) if clip_at_zero else cos)`.
    """

    in_process = True
    """Runs in the trainer's process under `reward_timeout` (`mmrl.rewards.isolation`): it holds a model or sockets."""

    __name__ = "clip_score"

    def __init__(self, model_name: str = "ViT-L-14", pretrained: str | None = None, *, device: str = "cpu",
                 batch_size: int = 32, scale: float = 1.0, clip_at_zero: bool = False, model=None, preprocess=None,
                 tokenizer=None):
        self.model_name, self.pretrained, self.device = model_name, pretrained, device
        self.batch_size, self.scale, self.clip_at_zero = int(batch_size), float(scale), bool(clip_at_zero)
        if model is not None and (preprocess is None or tokenizer is None):
            raise ValueError("a given open_clip model needs its preprocess and tokenizer too")
        self._parts = (model, preprocess, tokenizer) if model is not None else None
        if self._parts is None:
            _check_local(model_name, pretrained)  # fail at configuration time, load at first use

    def parts(self):
        if self._parts is None:
            self._parts = load_open_clip(self.model_name, self.pretrained, self.device)
        return self._parts

    @torch.no_grad()
    def cosine(self, images: Sequence[Any], texts: Sequence[str]) -> torch.Tensor:
        """[N] cosine similarities of image i and text i."""
        from PIL import Image

        model, preprocess, tokenizer = self.parts()
        out = []
        for start in range(0, len(images), self.batch_size):
            ims, txt = images[start : start + self.batch_size], texts[start : start + self.batch_size]
            for j, im in enumerate(ims):
                if not isinstance(im, Image.Image):
                    raise TypeError(f"clip_score needs PIL images as completions, got {type(im).__name__} at {start + j}")
            pixels = torch.stack([preprocess(im.convert("RGB")) for im in ims]).to(self.device)  # [B, 3, H, W]
            img = torch.nn.functional.normalize(model.encode_image(pixels).float(), dim=-1)  # [B, D]
            tok = torch.nn.functional.normalize(model.encode_text(tokenizer(list(txt)).to(self.device)).float(), dim=-1)  # [B, D]
            out.append((img * tok).sum(-1))  # [B]
        return torch.cat(out) if out else torch.zeros(0)

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        cos = self.cosine(list(completions), [prompt_text(p) for p in prompts])  # [N]
        if self.clip_at_zero:
            cos = cos.clamp_min(0)
        return (self.scale * cos).tolist()
