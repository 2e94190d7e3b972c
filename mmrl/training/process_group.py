"""Ending the distributed process group while the interpreter is still whole."""
from __future__ import annotations

import atexit


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group; a no-op when none exists or it was destroyed already.

    torch asks every process of a group to call `destroy_process_group()` before it exits. A gloo group left to the
    interpreter's teardown can abort a process whose work is done, "terminate called without an active exception"
    (SIGABRT): its worker threads still hold tensors when Python is finalised (pytorch/pytorch issue 190489; seen
    here once in the two-process CPU test, after rank 1 had written its model)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_at_exit() -> None:
    """Register `destroy_process_group_at_exit` with atexit, once however often it is called (one per Trainer)."""
    atexit.unregister(destroy_process_group_at_exit)
    atexit.register(destroy_process_group_at_exit)
