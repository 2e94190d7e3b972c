"""Per-token statistics of two next-token distributions, computed in chunks (DGPO, full-KL GCPO).

Logits of a real model are [N, T, V] with V up to ~150k; a float32 copy of them is often larger than the model.
Everything here walks over the N*T rows in chunks of at most `chunk_size` rows, casts one chunk at a time to
float32, and keeps only [N, T] results, so the extra memory is a few chunk-sized buffers.
"""
from __future__ import annotations

import torch
from einops import rearrange

STATS = ("h2", "entropy", "kl", "ref_entropy")
"""Statistics `token_distribution_stats` can return (see its docstring)."""

_CHUNK_ELEMENTS = 1 << 22  # 4M float32 elements = 16 MiB per temporary buffer (accelerators: few, large kernels)
_CPU_CHUNK_ELEMENTS = 1 << 19  # 512k float32 elements = 2 MiB: the several passes over a chunk stay in the CPU's cache


def default_chunk_size(vocab_size: int, device: torch.device | str | None = None) -> int:
    """Rows per chunk so that one float32 [rows, V] buffer stays near 16 MiB, or near 2 MiB on the CPU (where a
    chunk that fits in the cache makes the Hellinger / entropy statistics 2-3x faster; same results)."""
    elements = _CPU_CHUNK_ELEMENTS if device is not None and torch.device(device).type == "cpu" else _CHUNK_ELEMENTS
    return max(1, elements // max(1, vocab_size))


@torch.no_grad()
def token_distribution_stats(
    logits: torch.Tensor,
    other_logits: torch.Tensor | None = None,
    *,
    stats: tuple[str, ...] = ("h2", "entropy"),
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Per-position statistics of `p = softmax(logits)` (and `q = softmax(other_logits)`), each [N, T] float32.

    - `"entropy"`: `-sum_v p log p` (nats).
    - `"h2"`: squared Hellinger distance `1 - sum_v sqrt(p q)`, computed as `0.5 * sum_v (sqrt p - sqrt q)^2`
      (the same number; no cancellation for nearly equal p and q, and exactly 0 when they are equal), in [0, 1].
    - `"kl"`: `KL(p || q) = sum_v p (log p - log q)`, clamped at 0.
    - `"ref_entropy"`: entropy of q.

    Args:
        logits, other_logits: [N, T, V] (or [M, V]) logits in any float dtype; `other_logits` is needed for all
            statistics but `"entropy"`.
        stats: names from `STATS`.
        chunk_size: rows (positions) per chunk; default keeps one float32 chunk near 16 MiB (2 MiB on the CPU).
        temperature: both logits are divided by it first (statistics of the sampling distribution).
    """
    unknown = [s for s in stats if s not in STATS]
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; valid: {list(STATS)}")
    needs_q = any(s != "entropy" for s in stats)
    if needs_q and other_logits is None:
        raise ValueError(f"statistics {[s for s in stats if s != 'entropy']} need other_logits")
    if other_logits is not None and other_logits.shape != logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and other_logits {tuple(other_logits.shape)} differ in shape")
    lead = logits.shape[:-1]
    v = logits.shape[-1]
    p_rows = logits.reshape(-1, v)  # [M, V] view, no copy for contiguous input
    q_rows = other_logits.reshape(-1, v) if needs_q else None  # [M, V]
    m = p_rows.shape[0]
    rows = chunk_size or default_chunk_size(v, logits.device)
    if rows < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    out = {s: torch.empty(m, dtype=torch.float32, device=logits.device) for s in stats}
    for start in range(0, m, rows):
        sl = slice(start, min(start + rows, m))
        lp = torch.log_softmax(p_rows[sl].float() / temperature, dim=-1)  # [c, V]
        if "entropy" in out:
            out["entropy"][sl] = -(lp.exp() * lp).sum(-1)
        if needs_q:
            lq = torch.log_softmax(q_rows[sl].float() / temperature, dim=-1)  # [c, V]
            if "h2" in out:
                diff = (0.5 * lp).exp_() - (0.5 * lq).exp()  # [c, V] sqrt p - sqrt q
                out["h2"][sl] = (0.5 * diff.square_().sum(-1)).clamp_(0.0, 1.0)
                del diff
            if "kl" in out:
                out["kl"][sl] = (lp.exp() * (lp - lq)).sum(-1).clamp_(min=0.0)
            if "ref_entropy" in out:
                out["ref_entropy"][sl] = -(lq.exp() * lq).sum(-1)
    return {s: t.reshape(lead) for s, t in out.items()}
