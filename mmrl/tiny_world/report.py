"""Report helpers for the tiny world: tables (markdown), curves (PNG), mean and spread over seeds."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [float(x) for x in xs]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def fmt(m: float, s: float | None = None, pct: bool = True) -> str:
    k = 100.0 if pct else 1.0
    if s is None:
        return f"{k * m:.1f}"
    return f"{k * m:.1f} ± {k * s:.1f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def plot_curves(series: dict[str, list[list[tuple[float, float]]]], path: str | Path, *, title: str, ylabel: str,
                xlabel: str = "optimizer step", baseline: float | None = None) -> Path:
    """One line per label (mean over its seeds, shaded min..max); `series[label]` is a list of per-seed
    [(x, y), ...] curves. A dashed line marks `baseline` (e.g. the base model's accuracy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, curves in series.items():
        curves = [c for c in curves if c]
        if not curves:
            continue
        xs = sorted({x for c in curves for x, _ in c})
        per_x = {x: [y for c in curves for xx, y in c if xx == x] for x in xs}
        mean = [sum(v) / len(v) for v in per_x.values()]
        lo = [min(v) for v in per_x.values()]
        hi = [max(v) for v in per_x.values()]
        line, = ax.plot(xs, mean, label=f"{label} (n={len(curves)})")
        if len(curves) > 1:
            ax.fill_between(xs, lo, hi, alpha=0.2, color=line.get_color())
    if baseline is not None:
        ax.axhline(baseline, ls="--", color="grey", label="base model")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curve(records: list[dict], key: str, smooth: int = 1) -> list[tuple[float, float]]:
    """(step, value) pairs of `key` from metric records, optionally a running mean over `smooth` records."""
    pts = [(r["step"], float(r[key])) for r in records if key in r and r[key] is not None]
    if smooth <= 1:
        return pts
    out = []
    for i in range(len(pts)):
        window = pts[max(0, i - smooth + 1) : i + 1]
        out.append((pts[i][0], sum(y for _, y in window) / len(window)))
    return out


def image_grid(images: list, titles: list[str], path: str | Path, cols: int = 8) -> Path:
    """A labelled grid of PIL images (e.g. generated shapes scenes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, math.ceil(len(images) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.6 * cols, 1.8 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, img, t in zip(axes.flat, images, titles):
        ax.imshow(img)
        ax.set_title(t, fontsize=6)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


CUTOFF_WINDOW_HOURS = 12
"""A cutoff "HH:MM" names the occurrence of that UTC clock time nearest to now, within this many hours either way:
at 23:20 "00:55" is the coming night's, and "23:10" (ten minutes ago) has passed."""


def cutoff_time(cutoff: str | None, now: float | None = None) -> float | None:
    """The epoch time of the UTC clock time `cutoff` ("HH:MM") nearest to `now` (default: the current time; the
    occurrence within `CUTOFF_WINDOW_HOURS` of it, so a cutoff past midnight is the next day's), None without one; a
    one-line error for a bad string."""
    if cutoff is None:
        return None
    import datetime as dt

    try:
        hh, mm = (int(x) for x in str(cutoff).split(":"))
        if not (0 <= hh < 24 and 0 <= mm < 60):
            raise ValueError
    except ValueError:
        raise ValueError(f"cutoff must be a UTC clock time HH:MM, got {cutoff!r}") from None
    at = dt.datetime.now(dt.timezone.utc) if now is None else dt.datetime.fromtimestamp(now, dt.timezone.utc)
    when = at.replace(hour=hh, minute=mm, second=0, microsecond=0)
    window = dt.timedelta(hours=CUTOFF_WINDOW_HOURS)
    if when - at > window:
        when -= dt.timedelta(days=1)
    elif at - when >= window:
        when += dt.timedelta(days=1)
    return when.timestamp()
