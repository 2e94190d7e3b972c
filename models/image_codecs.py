"""Image codecs: image-token ids <-> PIL images, for autoregressive image generators (Janus-Pro).

An `ImageCodec` lays the T = h * w tokens of one image out on a row-major (h, w) grid, has a codebook of
`codebook_size` ids, decodes ids [N, h*w] to PIL images and (where possible) encodes images back to ids. Two are
built in:

- `VQCodec`: the Janus model's own VQ tokenizer (`JanusForConditionalGeneration.decode_image_tokens` and the VQ
  encoder), for real checkpoints (24 x 24 tokens of a 16384 codebook for Janus-Pro,
  docs/sources.md "T2I branch").
- `PaletteCodec`: token k = one grid cell filled with `palette[k]`; exact on images drawn on the cell grid, which
  lets a tiny Janus model generate pictures of coloured shapes with a small codebook (the tiny world).
- `PatchCodec`: token k = a fixed pixel patch `patches[k]` (a codebook of whole patches, as a VQ codebook is one of
  latent vectors); encode picks the nearest patch per grid position. The tiny world's slot layout uses one patch per
  (shape, colour) object (`mmrl.tiny_world.shape_slots`).

`codec_config(codec)` / `codec_from_config(cfg, model)` round-trip a codec through `mmrl_adapter.json`.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch
from einops import rearrange
from PIL import Image

DEFAULT_PALETTE: tuple[tuple[int, int, int], ...] = (
    (153, 153, 153),  # grey background (GenEval composites crops on #999)
    (220, 40, 40),  # red
    (40, 170, 60),  # green
    (40, 80, 220),  # blue
    (235, 210, 40),  # yellow
    (150, 60, 190),  # purple
    (245, 140, 30),  # orange
    (255, 255, 255),  # white
    (20, 20, 20),  # black
    (240, 130, 190),  # pink
    (130, 80, 40),  # brown
    (40, 200, 210),  # cyan
    (120, 200, 80),  # light green
    (90, 30, 30),  # dark red
    (30, 40, 100),  # navy
    (200, 200, 150),  # beige
)
"""A grey background followed by well separated colours; `PaletteCodec.default(k)` takes the first k."""


@runtime_checkable
class ImageCodec(Protocol):
    """What the Janus adapter needs from an image tokenizer."""

    grid: tuple[int, int]
    """(h, w): image tokens per column and per row; one image is h * w tokens in row-major order."""
    codebook_size: int
    """Number of distinct token ids (the generation head's vocabulary)."""

    def decode(self, ids: torch.Tensor) -> list[Image.Image]:
        """ids [N, h*w] long -> N RGB images."""
        ...

    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """N images -> ids [N, h*w] long (the codec's tokens of each image)."""
        ...

    def config(self) -> dict:
        """A JSON-serialisable description that `codec_from_config` turns back into an equal codec."""
        ...


def _check_ids(ids: torch.Tensor, grid: tuple[int, int], codebook_size: int) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    h, w = grid
    if ids.dim() != 2 or ids.shape[1] != h * w:
        raise ValueError(f"image-token ids must have shape [N, {h * w}] for a {h}x{w} grid, got {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= codebook_size):
        raise ValueError(
            f"image-token ids must lie in [0, {codebook_size}), got min {int(ids.min())} max {int(ids.max())}"
        )
    return ids.long()


class PaletteCodec:
    """Token id k = a `cell_px` x `cell_px` cell filled with `palette[k]`; image size (w * cell_px, h * cell_px).

    `encode` averages each cell and picks the nearest palette colour (squared RGB distance; ties go to the lower
    id), so it inverts `decode` exactly and is exact on any image rendered with palette colours on the cell grid.
    """

    def __init__(self, palette: Sequence[Sequence[int]], grid: tuple[int, int] = (12, 12), cell_px: int = 4):
        pal = [tuple(int(c) for c in rgb) for rgb in palette]
        if len(pal) < 2:
            raise ValueError(f"a palette needs at least 2 colours, got {len(pal)}")
        for rgb in pal:
            if len(rgb) != 3 or not all(0 <= c <= 255 for c in rgb):
                raise ValueError(f"palette colours must be RGB triples in 0..255, got {rgb}")
        if len(set(pal)) != len(pal):
            raise ValueError(f"palette colours must be distinct, got {pal}")
        h, w = (int(g) for g in grid)
        if h < 1 or w < 1:
            raise ValueError(f"grid must be two positive ints (h, w), got {grid}")
        if int(cell_px) < 1:
            raise ValueError(f"cell_px must be >= 1, got {cell_px}")
        self.palette = pal
        self.grid = (h, w)
        self.cell_px = int(cell_px)
        self.codebook_size = len(pal)
        self._colors = torch.tensor(pal, dtype=torch.uint8)  # [K, 3]

    @classmethod
    def default(cls, codebook_size: int, grid: tuple[int, int] = (12, 12), cell_px: int = 4) -> "PaletteCodec":
        """The first `codebook_size` colours of `DEFAULT_PALETTE` (grey background first)."""
        if not 2 <= codebook_size <= len(DEFAULT_PALETTE):
            raise ValueError(
                f"the default palette has 2..{len(DEFAULT_PALETTE)} colours, got codebook_size={codebook_size}; "
                "pass your own palette for more"
            )
        return cls(DEFAULT_PALETTE[:codebook_size], grid=grid, cell_px=cell_px)

    @property
    def image_size(self) -> tuple[int, int]:
        """(width, height) in pixels, PIL's order."""
        return (self.grid[1] * self.cell_px, self.grid[0] * self.cell_px)

    def decode(self, ids: torch.Tensor) -> list[Image.Image]:
        ids = _check_ids(ids, self.grid, self.codebook_size).cpu()
        h, w = self.grid
        cells = self._colors[ids]  # [N, h*w, 3]
        cells = rearrange(cells, "n (h w) c -> n h w c", h=h, w=w)
        pixels = cells.repeat_interleave(self.cell_px, dim=1).repeat_interleave(self.cell_px, dim=2)  # [N, H, W, 3]
        return [Image.fromarray(p.numpy()) for p in pixels]

    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        h, w = self.grid
        out = []
        for img in images:
            img = img.convert("RGB")
            if img.size != self.image_size:
                img = img.resize(self.image_size, Image.Resampling.BOX)
            arr = torch.from_numpy(np.asarray(img, dtype=np.float32))  # [H, W, 3]
            cells = rearrange(arr, "(h p) (w q) c -> (h w) (p q) c", h=h, w=w).mean(1)  # [h*w, 3]
            dist = (cells[:, None, :] - self._colors[None].float()).square().sum(-1)  # [h*w, K]
            out.append(dist.argmin(-1))  # first minimum: ties go to the lower id
        if not out:
            return torch.zeros((0, h * w), dtype=torch.long)
        return torch.stack(out).long()  # [N, h*w]

    def code_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """[N, T, 3] the colour of every id, centred to [-1, 1] (the palette's stand-in for a VQ code vector)."""
        return self._colors.to(ids.device).float()[ids] / 127.5 - 1.0

    def config(self) -> dict:
        return {"type": "palette", "palette": [list(c) for c in self.palette], "grid": list(self.grid),
                "cell_px": self.cell_px}

    def __repr__(self) -> str:
        return f"PaletteCodec(colours={self.codebook_size}, grid={self.grid}, cell_px={self.cell_px})"


class VQCodec:
    """The Janus VQ tokenizer of a `JanusForConditionalGeneration`: `decode_image_tokens` (pixels in [-1, 1],
    mapped to uint8 as `(x + 1) / 2 * 255`, as Janus's `generation_inference.py` does) and the VQ encoder.

    The grid is `vq_config.num_patches` squared (`JanusVQVAEVectorQuantizer.quant_state_dims`), the decoded side
    `num_patches * 2 ** (len(channel_multiplier) - 1)` pixels (transformers' `JanusVQVAE`).
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        vq = model.config.vq_config
        self.grid = (int(vq.num_patches), int(vq.num_patches))
        self.codebook_size = int(vq.num_embeddings)
        self.image_px = int(vq.num_patches) * 2 ** (len(vq.channel_multiplier) - 1)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor) -> list[Image.Image]:
        ids = _check_ids(ids, self.grid, self.codebook_size)
        vq = self.model.model.vqmodel
        pixels = self.model.decode_image_tokens(ids.to(next(vq.parameters()).device))  # [N, H, W, 3] in [-1, 1]
        pixels = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu()
        return [Image.fromarray(p.numpy()) for p in pixels]

    @torch.no_grad()
    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        vq = self.model.model.vqmodel
        param = next(vq.parameters())
        arrs = []
        for img in images:
            img = img.convert("RGB")
            if img.size != (self.image_px, self.image_px):
                img = img.resize((self.image_px, self.image_px), Image.Resampling.BICUBIC)
            arrs.append(torch.from_numpy(np.asarray(img, dtype=np.float32)))
        if not arrs:
            return torch.zeros((0, self.grid[0] * self.grid[1]), dtype=torch.long)
        pixels = rearrange(torch.stack(arrs), "n h w c -> n c h w") / 127.5 - 1.0  # [N, 3, H, W] in [-1, 1]
        tokens = vq.encode(pixels.to(param.device, param.dtype)).image_tokens  # [N*h*w]
        return tokens.reshape(len(arrs), -1).long().cpu()

    @torch.no_grad()
    def code_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """[N, T, C] the VQ codebook entry of every id (`get_codebook_entry`'s l2-normalised vectors; STAGE's
        `quant_b`)."""
        quantize = self.model.model.vqmodel.quantize
        return torch.nn.functional.normalize(quantize.embedding(ids.to(quantize.embedding.weight.device)).float(), dim=-1)

    def config(self) -> dict:
        return {"type": "vq"}

    def __repr__(self) -> str:
        return f"VQCodec(grid={self.grid}, codebook={self.codebook_size}, image_px={self.image_px})"


class PatchCodec:
    """Token id k = the pixel patch `patches[k]` (uint8 [K, p, p, 3]); an image is an (h, w) grid of patches, of
    (w * p, h * p) pixels. `encode` takes the nearest patch per grid position (squared RGB distance, ties to the
    lower id), so it inverts `decode` exactly; images of another size are box-resized first."""

    def __init__(self, patches, grid: tuple[int, int] = (4, 4)):
        arr = np.asarray(patches)
        if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[1] != arr.shape[2] or arr.shape[1] < 1:
            raise ValueError(f"patches must be [K, p, p, 3] RGB squares, got shape {arr.shape}")
        if arr.shape[0] < 2:
            raise ValueError(f"a patch codebook needs at least 2 patches, got {arr.shape[0]}")
        if arr.min() < 0 or arr.max() > 255:
            raise ValueError("patch pixels must lie in 0..255")
        flat = arr.reshape(arr.shape[0], -1)
        if len({row.tobytes() for row in flat.astype(np.uint8)}) != arr.shape[0]:
            raise ValueError("patches must be distinct (two ids would decode to the same picture)")
        h, w = (int(g) for g in grid)
        if h < 1 or w < 1:
            raise ValueError(f"grid must be two positive ints (h, w), got {grid}")
        self.patches = torch.from_numpy(arr.astype(np.uint8))  # [K, p, p, 3]
        self.patch_px = int(arr.shape[1])
        self.grid = (h, w)
        self.codebook_size = int(arr.shape[0])

    @property
    def image_size(self) -> tuple[int, int]:
        """(width, height) in pixels, PIL's order."""
        return (self.grid[1] * self.patch_px, self.grid[0] * self.patch_px)

    def decode(self, ids: torch.Tensor) -> list[Image.Image]:
        ids = _check_ids(ids, self.grid, self.codebook_size).cpu()
        h, w = self.grid
        tiles = self.patches[ids]  # [N, h*w, p, p, 3]
        pixels = rearrange(tiles, "n (h w) p q c -> n (h p) (w q) c", h=h, w=w)  # [N, H, W, 3]
        return [Image.fromarray(x.numpy()) for x in pixels]

    def encode(self, images: Sequence[Image.Image]) -> torch.Tensor:
        h, w = self.grid
        book = self.patches.reshape(self.codebook_size, -1).float()  # [K, p*p*3]
        out = []
        for img in images:
            img = img.convert("RGB")
            if img.size != self.image_size:
                img = img.resize(self.image_size, Image.Resampling.BOX)
            arr = torch.from_numpy(np.asarray(img, dtype=np.float32))  # [H, W, 3]
            tiles = rearrange(arr, "(h p) (w q) c -> (h w) (p q c)", h=h, w=w)  # [h*w, p*p*3]
            out.append(torch.cdist(tiles, book).argmin(-1))  # first minimum: ties go to the lower id
        if not out:
            return torch.zeros((0, h * w), dtype=torch.long)
        return torch.stack(out).long()  # [N, h*w]

    def code_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        """[N, T, p*p*3] the pixels of every id's patch, centred to [-1, 1]."""
        book = self.patches.reshape(self.codebook_size, -1).float().to(ids.device) / 127.5 - 1.0  # [K, p*p*3]
        return book[ids]

    def config(self) -> dict:
        import base64

        return {"type": "patch", "grid": list(self.grid), "shape": list(self.patches.shape),
                "patches_b64": base64.b64encode(self.patches.numpy().tobytes()).decode("ascii")}

    def __repr__(self) -> str:
        return f"PatchCodec(patches={self.codebook_size}, grid={self.grid}, patch_px={self.patch_px})"


CODECS = ("palette", "patch", "vq")


def codec_from_config(cfg: dict, model: torch.nn.Module | None = None) -> ImageCodec:
    """Rebuild a codec from `codec.config()`; the VQ codec needs the Janus model it belongs to."""
    kind = cfg.get("type")
    if kind == "palette":
        return PaletteCodec(cfg["palette"], grid=tuple(cfg["grid"]), cell_px=cfg["cell_px"])
    if kind == "patch":
        import base64

        shape = tuple(int(x) for x in cfg["shape"])
        raw = np.frombuffer(base64.b64decode(cfg["patches_b64"]), dtype=np.uint8)
        if raw.size != int(np.prod(shape)):
            raise ValueError(f"patch codec config: {raw.size} bytes of patches for shape {shape}")
        return PatchCodec(raw.reshape(shape), grid=tuple(cfg["grid"]))
    if kind == "vq":
        if model is None:
            raise ValueError("the 'vq' codec decodes through a Janus model's VQ tokenizer: pass model=")
        return VQCodec(model)
    raise ValueError(f"unknown image codec type {kind!r}; valid types: {list(CODECS)}")
