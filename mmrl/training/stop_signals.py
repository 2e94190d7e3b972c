"""Graceful stops: SIGTERM and Ctrl-C (SIGINT) ask the training loop to stop at the end of the current step, with a
checkpoint; a second Ctrl-C stops at once (the last checkpoint stays intact: checkpoints are written atomically)."""
from __future__ import annotations

import os
import signal
import threading

import torch


class StopRequests:
    """The signal that asked for a stop, set by the handlers `install` puts in place."""

    def __init__(self):
        self.signum: int | None = None

    def install(self) -> dict:
        """Install the handlers (main thread only); returns the previous handlers for `restore`."""
        if os.name == "nt" or threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            if signum == signal.SIGINT and self.signum is not None:
                raise KeyboardInterrupt("second Ctrl-C: stopped at once, without a checkpoint of the current step")
            self.signum = signum
            # os.write, not print: a signal handler may interrupt a print to stderr (reentrant call)
            os.write(2, f"\nmmrl: {signal.Signals(signum).name} received; stopping after the current step with a "
                        f"checkpoint (Ctrl-C again stops at once)\n".encode())

        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                old[sig] = signal.getsignal(sig)
                signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover - not allowed here
                old.pop(sig, None)
        return old

    @staticmethod
    def restore(old: dict) -> None:
        for sig, h in (old or {}).items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)

    def agreed(self, world: int, device) -> int:
        """The signal that asked for a stop (0 if none), agreed by every process: if one process stopped alone, the
        others would wait for it forever."""
        signum = self.signum or 0
        if world > 1:
            import torch.distributed as dist

            t = torch.tensor([signum], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            signum = int(t.item())
        return signum
