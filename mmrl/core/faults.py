"""Named fault points: a test hook that lets crash tests kill the training process at an exact place.

`MMRL_KILL_AT=<point>:<step>` makes the process SIGKILL itself (no cleanup, no `finally`, no buffered writes: what
a power cut or the kernel's OOM killer does) when it reaches `<point>` while working on optimizer step `<step>`
(1-based). Unset (always, outside tests), a fault point costs one environment lookup.

Points (see `FAULT_POINTS`):
- `during_rollout`: after sampling the responses of step K's rollout batch, before they are scored.
- `in_optimizer_step`: after the backward passes of step K, before `optimizer.step()`.
- `after_step`: after step K is complete (logged and, if due, checkpointed).
- `checkpoint/model`, `checkpoint/optimizer`, `checkpoint/state`: while writing checkpoint K into its temporary
  directory, after the model, after the optimizer state, after every file (before the fsync and the rename).
- `checkpoint/renamed`: after checkpoint K was renamed into place, before older checkpoints are rotated out.
- `checkpoint/rotating`: after the oldest checkpoint was moved aside, before it is deleted.
"""
from __future__ import annotations

import os
import signal

ENV = "MMRL_KILL_AT"

FAULT_POINTS = (
    "during_rollout",
    "in_optimizer_step",
    "after_step",
    "checkpoint/model",
    "checkpoint/optimizer",
    "checkpoint/state",
    "checkpoint/renamed",
    "checkpoint/rotating",
)


def fault_point(point: str, step: int) -> None:
    """SIGKILL this process if `MMRL_KILL_AT` names `point` at `step` (test hook; a no-op otherwise)."""
    spec = os.environ.get(ENV)
    if spec and spec == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
