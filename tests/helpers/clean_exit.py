"""`leave()`: the last call of a test helper launched by torchrun or `accelerate launch` that ran to completion.

The ranks leave the gloo group together, then exit without the interpreter's teardown: on CI a rank that had saved
all its results sometimes aborted at exit ("terminate called without an active exception", exit -6) while gloo's
worker threads outlived the interpreter (the mechanism is described in pytorch/pytorch PR 179291), failing a test
whose work was done. Only for helpers whose every rank finishes: the barrier would wait for a rank stopped on purpose.
"""
import os
import sys


def leave() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
