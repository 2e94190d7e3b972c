"""Image generation for GenEval with the official generator's command-line meanings (djghosh13/geneval
`generation/diffusers_generate.py`): a diffusers text-to-image pipeline from a local folder, the official flags
mapped onto mmrl image families, and the official `grid.png`.

The official script seeds every prompt with the same `--seed` (`seed_everything(seed)` before each prompt), draws
`--n_samples` images in calls of `--batch_size` images, and saves a grid of each prompt's images with `--batch_size`
images a row. `DiffusersGenerator` does the same with a generator on the pipeline's device, so on one device its
images are the official script's for the same pipeline, seed and flags.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Sequence

DIFFUSERS = "diffusers"
"""The `--family` of a generic diffusers text-to-image pipeline (a folder with `model_index.json`)."""

AMUSED_PIPELINE = "AmusedPipeline"
"""`model_index.json`'s `_class_name` of an aMUSEd snapshot: mmrl's masked_image family, not a generic pipeline."""

GRID_PADDING = 2
"""Pixels between the grid's cells and around them (torchvision `make_grid`'s default, used by the official script)."""

OFFICIAL_NEGATIVE_PROMPT = (
    "ugly, tiling, poorly drawn hands, poorly drawn feet, poorly drawn face, out of frame, extra limbs, disfigured, "
    "deformed, body out of frame, bad anatomy, watermark, signature, cut off, low contrast, underexposed, "
    "overexposed, bad art, beginner, amateur, distorted face")
"""`--negative-prompt` given without a value: the official script's default list (diffusers_generate.py)."""

OFFICIAL_STEPS, OFFICIAL_SCALE = 50, 9.0
"""The official generator's defaults of `--steps` and `--scale` (used for diffusers pipelines)."""

OFFICIAL_TO_MMRL = {"steps": "num_steps", "scale": "cfg_scale", "negative_prompt": "negative_prompt"}
"""The official generator's flags (`--steps`, `--scale`, `--negative-prompt`) as mmrl generation options."""


def is_diffusers_pipeline(path: str | Path) -> bool:
    """True for a saved diffusers pipeline other than aMUSEd (which mmrl samples as its masked_image family)."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return False
    try:
        name = json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, AttributeError):
        return False
    return name != AMUSED_PIPELINE and not (Path(path) / "mmrl_adapter.json").is_file()


def family_options(family: str, option_names: Sequence[str], *, steps=None, scale=None, negative_prompt=None,
                   height=None, width=None) -> dict[str, Any]:
    """The official flags given (not None) as generation options of an mmrl family whose `sample` takes
    `option_names`; a flag the family has no option for is refused, naming what it does take."""
    if height is not None or width is not None:
        raise ValueError(f"--H / --W apply to diffusers pipelines; a {family} model draws images of the size its "
                         "model fixes (its token grid)")
    out: dict[str, Any] = {}
    for flag, value in (("steps", steps), ("scale", scale), ("negative_prompt", negative_prompt)):
        if value is None:
            continue
        key = OFFICIAL_TO_MMRL[flag]
        if key not in option_names:
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to family {family!r} (its generation options: "
                             f"{list(option_names)})")
        out[key] = value
    return out


def grid_image(images: Sequence, nrow: int, padding: int = GRID_PADDING):
    """One image of `images` (equal-sized PIL images) laid out `nrow` a row on black, `padding` px apart and around
    (the layout of torchvision `make_grid(images, nrow)`, which the official script saves as `grid.png`)."""
    from PIL import Image

    if not images:
        raise ValueError("grid_image needs at least one image")
    if nrow < 1:
        raise ValueError(f"nrow must be >= 1, got {nrow}")
    w, h = images[0].size
    cols = min(nrow, len(images))
    rows = -(-len(images) // cols)
    grid = Image.new("RGB", (cols * (w + padding) + padding, rows * (h + padding) + padding), (0, 0, 0))
    for k, im in enumerate(images):
        r, c = divmod(k, cols)
        grid.paste(im.convert("RGB"), (padding + c * (w + padding), padding + r * (h + padding)))
    return grid


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class DiffusersGenerator:
    """A diffusers text-to-image pipeline loaded from a local folder (never downloaded), sampled as the official
    `diffusers_generate.py` samples it: float16 on CUDA (the official dtype), float32 on CPU (float16 is not a CPU
    dtype for these pipelines); no safety checker (the official script keeps the pipeline's, which blacks out
    flagged images: pass a pipeline saved with one to keep it)."""

    def __init__(self, path: str | Path, *, device: str | None = None):
        import torch
        from diffusers import DiffusionPipeline

        path = Path(path)
        if not is_diffusers_pipeline(path):
            raise ValueError(f"{str(path)!r} is not a saved diffusers pipeline (no model_index.json)")
        self.device = device or default_device()
        dtype = torch.float16 if self.device.startswith("cuda") else torch.float32
        self.pipe = DiffusionPipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
        self.pipe.to(self.device)
        self.pipe.set_progress_bar_config(disable=True)
        self._call_args = set(inspect.signature(self.pipe.__call__).parameters)

    def check_options(self, options: dict) -> None:
        """Extra `--gen` keyword arguments must be arguments of the pipeline's `__call__`."""
        reserved = {"prompt", "height", "width", "num_inference_steps", "guidance_scale", "num_images_per_prompt",
                    "negative_prompt", "generator", "output_type"}
        bad = sorted(k for k in options if k not in self._call_args or k in reserved)
        if bad:
            allowed = sorted(self._call_args - reserved - {"self", "kwargs", "callback_on_step_end"})
            raise ValueError(f"unknown generation options {bad} for {type(self.pipe).__name__} (the official flags "
                             f"--steps/--scale/--H/--W/--negative-prompt set the others); valid: {allowed}")

    def generate(self, prompt: str, n_samples: int, batch_size: int, *, seed: int, steps: int, scale: float,
                 height: int | None = None, width: int | None = None, negative_prompt: str | None = None,
                 **options) -> list:
        """`n_samples` PIL images of `prompt`, drawn `batch_size` at a time from one generator seeded with `seed`
        (the official script reseeds before every prompt with the same seed)."""
        import torch

        generator = torch.Generator(device=self.device).manual_seed(int(seed))
        images: list = []
        while len(images) < n_samples:
            out = self.pipe(prompt, height=height, width=width, num_inference_steps=steps, guidance_scale=scale,
                            num_images_per_prompt=min(batch_size, n_samples - len(images)),
                            negative_prompt=negative_prompt or None, generator=generator, **options)
            images.extend(out.images)
        return images
