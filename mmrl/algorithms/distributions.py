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
_CPU_CHUNK_ELEMENTS = 1 << 17  # 128k float32 elements = 512 KiB: the passes over a chunk stay in the core's L2 cache


def default_chunk_size(vocab_size: int, device: torch.device | str | None = None) -> int:
    """Rows per chunk so that one float32 [rows, V] buffer stays near 16 MiB, or near 512 KiB on the CPU (where a
    chunk that fits in the cache makes the Hellinger / entropy statistics several times faster; same results)."""
    elements = _CPU_CHUNK_ELEMENTS if device is not None and torch.device(device).type == "cpu" else _CHUNK_ELEMENTS
    return max(1, elements // max(1, vocab_size))


def _softmax_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m [c, 1], z = x - m [c, V], t = exp(z) [c, V], s = sum_v t [c, 1]) of logits `x` [c, V] (not modified).

    The steps of `torch.logsumexp` (max, with infinite maxima replaced by 0; sum of exp(x - max)), so that
    `log(s) + m` is bitwise its result; `softmax = t / s`, `log_softmax = z - log(s)`."""
    m = x.amax(-1, keepdim=True)  # [c, 1]
    m = torch.where(m.abs() == float("inf"), torch.zeros_like(m), m)
    z = x - m  # [c, V]
    t = z.exp()  # [c, V]
    return m, z, t, t.sum(-1, keepdim=True)


@torch.no_grad()
def token_distribution_stats(
    logits: torch.Tensor,
    other_logits: torch.Tensor | None = None,
    *,
    stats: tuple[str, ...] = ("h2", "entropy"),
    chunk_size: int | None = None,
    temperature: float = 1.0,
    other_targets: torch.Tensor | None = None,
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
        chunk_size: rows (positions) per chunk; default keeps one float32 chunk near 16 MiB (512 KiB on the CPU).
        temperature: both logits are divided by it first (statistics of the sampling distribution).
        other_targets: [N, T] token ids: also return `"other_logp"`, `log q` at these ids, from the same pass over
            `other_logits` (bitwise what `selective_log_softmax(other_logits, other_targets)` gives).

    One pass per chunk and side: the max, `exp(x - max)` and its sum (as `torch.logsumexp`) give the softmax, the
    log-softmax and the picked log-probs; the entropy is `log s - sum_v p (x - max)` (one dot product, no
    `p log p` buffer) and h2 takes the square roots of the two softmaxes in place.
    """
    unknown = [s for s in stats if s not in STATS]
    if unknown:
        raise ValueError(f"unknown statistics {unknown}; valid: {list(STATS)}")
    needs_q = any(s != "entropy" for s in stats) or other_targets is not None
    if needs_q and other_logits is None:
        raise ValueError(f"statistics {[s for s in stats if s != 'entropy']} (and other_targets) need other_logits")
    if other_logits is not None and other_logits.shape != logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and other_logits {tuple(other_logits.shape)} differ in shape")
    lead = logits.shape[:-1]
    v = logits.shape[-1]
    p_rows = logits.reshape(-1, v)  # [M, V] view, no copy for contiguous input
    q_rows = other_logits.reshape(-1, v) if needs_q else None  # [M, V]
    targets = other_targets.reshape(-1, 1) if other_targets is not None else None  # [M, 1]
    if targets is not None and targets.shape[0] != p_rows.shape[0]:
        raise ValueError(f"other_targets {tuple(other_targets.shape)} do not match logits {tuple(logits.shape)}")
    m = p_rows.shape[0]
    rows = chunk_size or default_chunk_size(v, logits.device)
    if rows < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    names = list(stats) + (["other_logp"] if targets is not None else [])
    out = {s: torch.empty(m, dtype=torch.float32, device=logits.device) for s in names}
    need_p, want_kl, want_h2 = bool(stats), "kl" in out, "h2" in out
    for start in range(0, m, rows):
        sl = slice(start, min(start + rows, m))
        # few [c, V] buffers live at a time (each is freed or reused as soon as it is done with), so they stay in cache
        zp = p = log_sp = None
        if need_p:
            x = p_rows[sl].float()  # [c, V] (a view for float32 input: never written)
            if temperature != 1.0:
                x = x / temperature
            _, zp, p, sp = _softmax_parts(x)
            del x
            p.div_(sp)  # [c, V] softmax
            log_sp = sp.log_()  # [c, 1]
            if "entropy" in out:
                out["entropy"][sl] = log_sp.squeeze(-1) - torch.linalg.vecdot(p, zp)
            if not want_kl:
                del zp
                if want_h2:
                    p.sqrt_()
        if needs_q:
            y = q_rows[sl].float()  # [c, V]
            if temperature != 1.0:
                y = y / temperature
            mq, zq, q, sq = _softmax_parts(y)
            log_sq = sq.log()  # [c, 1]
            if targets is not None:
                # picked - logsumexp, as selective_log_softmax
                out["other_logp"][sl] = (y.gather(-1, targets[sl]) - (log_sq + mq)).squeeze(-1)
            del y
            q.div_(sq)  # [c, V] softmax
            if "ref_entropy" in out:
                out["ref_entropy"][sl] = log_sq.squeeze(-1) - torch.linalg.vecdot(q, zq)
            if want_kl:
                # sum_v p (log p - log q), log p - log q = (zp - log sp) - (zq - log sq)
                diff = zq.neg_().add_(zp).sub_(log_sp - log_sq)  # [c, V] (zq reused)
                del zp
                out["kl"][sl] = torch.linalg.vecdot(p, diff).clamp_(min=0.0)
                if want_h2:
                    p.sqrt_()
            del zq
            if want_h2:
                diff = p.sub_(q.sqrt_())  # [c, V] sqrt p - sqrt q (p reused)
                out["h2"][sl] = (0.5 * torch.linalg.vecdot(diff, diff)).clamp_(0.0, 1.0)
            del q, sq
        del p
    return {s: t.reshape(lead) for s, t in out.items()}
