"""2-D position embeddings for the image tokens of a tiny Janus model (a tiny-world option; real checkpoints never
have one, so nothing changes for them).

Janus-Pro's language model sees the image tokens as a 1-D sequence with RoPE positions only; at 576 tokens and
billions of parameters it learns the raster layout, but a tiny model trained for minutes does not: measured with a
throwaway prototype (causal image-token LM, 4 x 128, 16 x 16 grid), GenEval-shapes accuracy after 10 minutes was
0.20 without and 0.43 with learned row / column embeddings. `ImagePositions` adds `row[r] + col[c]` of the image
token being *predicted* to the input embedding at the position that predicts it: the `<begin_of_image>` token
predicts token 0, image token t - 1 predicts token t. It lives on the Janus model as the attribute
`ATTRIBUTE` (so the optimizer, DDP and a deep-copied reference see it) and is saved beside the checkpoint in
`FILE`, outside the transformers weights, so `JanusForConditionalGeneration.from_pretrained` loads the rest unchanged.
"""
from __future__ import annotations

import os

import torch
from torch import nn

ATTRIBUTE = "mmrl_image_positions"
"""Attribute of the `JanusForConditionalGeneration` that holds the module."""
FILE = "image_positions.safetensors"
"""Its weights in a checkpoint directory."""


class ImagePositions(nn.Module):
    """Learned row and column embeddings of an (h, w) image-token grid, zero-initialised (a fresh module changes
    nothing until it is trained)."""

    def __init__(self, grid: tuple[int, int], hidden_size: int):
        super().__init__()
        h, w = (int(g) for g in grid)
        self.grid = (h, w)
        self.row = nn.Parameter(torch.zeros(h, hidden_size))  # [h, D]
        self.col = nn.Parameter(torch.zeros(w, hidden_size))  # [w, D]

    def forward(self, start: int, length: int) -> torch.Tensor:
        """Embeddings [length, D] of image tokens start .. start + length - 1 (row-major)."""
        h, w = self.grid
        t = torch.arange(start, start + length, device=self.row.device)
        if length and int(t[-1]) >= h * w:
            raise ValueError(f"image token {int(t[-1])} is beyond the {h}x{w} grid")
        return self.row[t // w] + self.col[t % w]  # [length, D]


def sincos_2d(side: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """The fixed 2-D sine-cosine position code of a `side` x `side` patch grid, row-major ([side * side, dim]; row r,
    column c at index r * side + c), as MAE initialises its ViT's position embeddings (He et al., "Masked
    Autoencoders Are Scalable Vision Learners", 2022, after Vaswani et al.'s 1-D code): the first half of the
    dimensions codes the row, the second the column, each as sin then cos of the coordinate at `dim / 4` frequencies
    `temperature ** (-k / (dim / 4))`. Unlike a random table, the code is smooth in the coordinate, so "column of A
    below column of B" is close to linear in it at the low frequencies."""
    if dim % 4:
        raise ValueError(f"sincos_2d: dim must be a multiple of 4 (sin and cos of rows and columns), got {dim}")
    freqs = temperature ** (-torch.arange(dim // 4, dtype=torch.float64) / (dim // 4))  # [dim/4]
    coord = torch.arange(side, dtype=torch.float64)
    angle = coord[:, None] * freqs[None, :]  # [side, dim/4]
    axis = torch.cat([angle.sin(), angle.cos()], dim=1)  # [side, dim/2]
    rows = axis[:, None, :].expand(side, side, dim // 2)  # [side(r), side(c), dim/2]
    cols = axis[None, :, :].expand(side, side, dim // 2)
    return torch.cat([rows, cols], dim=2).reshape(side * side, dim).float()  # [side * side, dim]


def positions_of(model: nn.Module) -> ImagePositions | None:
    """The model's `ImagePositions`, or None (real checkpoints)."""
    return getattr(model, ATTRIBUTE, None)


def attach(model: nn.Module, grid: tuple[int, int], hidden_size: int) -> ImagePositions:
    """Give `model` a fresh (zero) `ImagePositions` of the model's dtype and device."""
    ref = next(model.parameters())
    module = ImagePositions(grid, hidden_size).to(device=ref.device, dtype=ref.dtype)
    setattr(model, ATTRIBUTE, module)
    return module


def save(model: nn.Module, path: str | os.PathLike) -> None:
    """Write the model's position embeddings (if any) to `path/FILE`, with the grid in the metadata."""
    from safetensors.torch import save_file

    module = positions_of(model)
    if module is None:
        return
    # keys as in the model's state dict, so a plain "load every *.safetensors of the directory" restores them too
    tensors = {f"{ATTRIBUTE}.{k}": v.detach().float().cpu().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, os.path.join(path, FILE), metadata={"grid": f"{module.grid[0]}x{module.grid[1]}"})


def load(model: nn.Module, path: str | os.PathLike) -> ImagePositions | None:
    """Attach the position embeddings saved in `path/FILE` to `model` (no file: nothing, returns None)."""
    from safetensors import safe_open

    file = os.path.join(path, FILE)
    if not os.path.isfile(file):
        return None
    with safe_open(file, framework="pt") as f:
        grid = tuple(int(x) for x in f.metadata()["grid"].split("x"))
        tensors = {k.removeprefix(ATTRIBUTE + "."): f.get_tensor(k) for k in f.keys()}
    if set(tensors) != {"row", "col"}:
        raise ValueError(f"{file} must hold the tensors {ATTRIBUTE}.row and .col, got {sorted(tensors)}")
    module = attach(model, grid, int(tensors["row"].shape[1]))
    module.load_state_dict({k: v.to(module.row.dtype) for k, v in tensors.items()})
    return module


def state_dict_without(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the position embeddings (what transformers' `save_pretrained` writes)."""
    prefix = ATTRIBUTE + "."
    return {k: v for k, v in model.state_dict().items() if not k.startswith(prefix)}
