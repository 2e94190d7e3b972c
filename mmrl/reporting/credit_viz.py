"""Token-credit pictures: where did the update put its credit?

- text and diffusion samples: an HTML page, one line per response, every token's background coloured by its
  effective credit (advantage x token weight: green pushes the token up, red pushes it down);
- image samples (Janus): a PNG with each generated image beside an overlay of the per-token credit laid out on
  the image-token grid.
"""
from __future__ import annotations

import html
from pathlib import Path

import torch
from PIL import Image


def _rgb(value: float, scale: float) -> str:
    """Diverging colour: white at 0, green for positive, red for negative credit."""
    a = min(1.0, abs(value) / scale) if scale > 0 else 0.0
    if value >= 0:
        r, g, b = int(255 * (1 - 0.75 * a)), 255, int(255 * (1 - 0.75 * a))
    else:
        r, g, b = 255, int(255 * (1 - 0.75 * a)), int(255 * (1 - 0.75 * a))
    return f"rgb({r},{g},{b})"


def text_heatmap_html(tokens: list[list[str]], credit: list[list[float]], titles: list[str], heading: str,
                      marks: list[list[bool]] | None = None, mark_legend: str = "marked tokens") -> str:
    """An HTML page: one block per response, tokens coloured by credit (hover shows the value). `marks`: per token,
    whether to underline it (e.g. the tokens that decide the answer), named by `mark_legend`."""
    scale = max((abs(c) for row in credit for c in row), default=1.0) or 1.0
    marks = marks if marks is not None else [[False] * len(t) for t in tokens]
    parts = [
        "<!doctype html><meta charset='utf-8'><title>mmrl token credit</title>",
        "<style>body{font-family:monospace;max-width:1100px;margin:20px}span{white-space:pre-wrap;border-radius:2px}"
        ".r{margin:14px 0;padding:6px;border:1px solid #ddd}.t{color:#555;font-size:12px;margin-bottom:4px}</style>",
        f"<h3>{html.escape(heading)}</h3><p>green: credit pushes the token up; red: down; colour scale +-{scale:.3g}"
        + (f"; underlined: {html.escape(mark_legend)}" if any(any(m) for m in marks) else "") + "</p>",
    ]
    for toks, vals, title, mk in zip(tokens, credit, titles, marks):
        spans = "".join(f"<span style='background:{_rgb(v, scale)}{';text-decoration:underline;font-weight:bold' if m else ''}' "
                        f"title='{v:.4f}'>{html.escape(t)}</span>" for t, v, m in zip(toks, vals, mk))
        parts.append(f"<div class='r'><div class='t'>{html.escape(title)}</div>{spans}</div>")
    return "\n".join(parts)


def image_credit_overlay(images: list[Image.Image], credit: torch.Tensor, grid: tuple[int, int], titles: list[str]) -> Image.Image:
    """A figure with each image and its credit map (image tokens on their (h, w) grid), via matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(images)
    h, w = grid
    scale = float(credit.abs().max()) or 1.0
    fig, axes = plt.subplots(2, n, figsize=(2.2 * n, 4.6), squeeze=False)
    for i, (img, title) in enumerate(zip(images, titles)):
        axes[0, i].imshow(img)
        axes[0, i].set_title(title, fontsize=7)
        axes[1, i].imshow(img, alpha=0.35, extent=(0, w, h, 0))
        im = axes[1, i].imshow(credit[i, : h * w].reshape(h, w).float().cpu().numpy(), cmap="RdYlGn", vmin=-scale, vmax=scale,
                               alpha=0.75, extent=(0, w, h, 0))
        for ax in axes[:, i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(im, ax=axes[1, :].tolist(), shrink=0.8, label="token credit")
    fig.canvas.draw()
    out = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    plt.close(fig)
    return out


def write_credit_pictures(out_dir: Path, step: int, policy, rollout, credit: torch.Tensor, rewards: torch.Tensor, k: int = 8) -> Path:
    """Write the pictures of the first `k` responses of a rollout to `out_dir`; returns the file written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    n = min(k, rollout.num_responses)
    titles = [f"response {i}  reward {float(rewards[i]):.3f}" for i in range(n)]
    if "grid" in rollout.extras:
        path = out_dir / f"step-{step:06d}.png"
        image_credit_overlay(list(rollout.completions[:n]), credit[:n], tuple(rollout.extras["grid"]), [f"r={float(rewards[i]):.2f}" for i in range(n)]).save(path)
        return path
    sub = rollout.select(torch.arange(n))
    tokens = policy.token_strings(sub)
    vals = [credit[i][rollout.response_mask[i]].tolist()[: len(tokens[i])] for i in range(n)]
    path = out_dir / f"step-{step:06d}.html"
    path.write_text(text_heatmap_html(tokens, vals, titles, f"token credit at step {step} ({policy.family})"))
    return path
