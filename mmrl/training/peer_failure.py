"""Recognising a collective that failed because another process froze, died or fell far behind (`ddp_timeout`)."""
from __future__ import annotations

from pathlib import Path

_SIGNS = ("timed out", "timeout", "connection closed by peer", "connection reset by peer", "broken pipe")


def is_peer_failure(e: BaseException) -> bool:
    """Whether `e` (from a torch.distributed collective) means a peer did not answer: a timeout or a lost connection."""
    text = f"{type(e).__name__}: {e}".lower()
    return type(e).__name__ == "DistBackendError" or any(s in text for s in _SIGNS)


def peer_failure_message(e: BaseException, timeout: int, rank: int, checkpoint: Path | None) -> str:
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    ck = f"The last checkpoint, {checkpoint.name}, is intact" if checkpoint is not None else "No checkpoint was written yet"
    return (f"rank {rank}: another process did not answer within ddp_timeout={timeout} s (it froze, was killed, or is far "
            f"slower); stopping instead of waiting forever ({first}). {ck}; resume with resume_from=auto once every "
            "process can run (raise ddp_timeout if a step legitimately takes longer)")
