"""Graceful stops: SIGTERM and Ctrl-C (SIGINT) ask the training loop to stop at the end of the current step, with a
checkpoint; a second Ctrl-C stops at once (the last checkpoint stays intact: checkpoints are written atomically).

While the rewards run (`interrupting`), a step may not end for a long time (a slow or stuck reward), so a stop
request that the rewards have not answered within `STOP_GRACE` seconds stops them: `RewardsInterrupted` is raised
in the main thread (the same signal sent again to it by a timer; the reward waits of `mmrl.rewards.combine` wake every
`mmrl.rewards.isolation.POLL_SECONDS`), the worker process is killed, and the trainer writes the checkpoint of the
last finished step and stops. A quick reward still finishes its step, as before."""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

import torch

STOP_GRACE = 2.0
"""Seconds the rewards get to finish the step after SIGTERM / Ctrl-C before they are stopped."""


class RewardsInterrupted(KeyboardInterrupt):
    """SIGTERM or Ctrl-C was not answered by the rewards within `STOP_GRACE`: they were stopped (a KeyboardInterrupt,
    so no reward code's `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name} while the rewards ran")
        self.signum = signum


class StopRequests:
    """The signal that asked for a stop, set by the handlers `install` puts in place."""

    def __init__(self, grace: float = STOP_GRACE):
        self.signum: int | None = None
        self.grace = grace
        self._at = 0.0  # monotonic time of the request
        self._interrupting = False
        self._escalate = False  # set just before the timer re-enters the handler through interrupt_main
        self._timer: threading.Timer | None = None

    @contextmanager
    def interrupting(self, enabled: bool = True):
        """Within this block (a reward call, in the main thread) a stop request unanswered for `grace` seconds raises
        `RewardsInterrupted`; `enabled=False` (several processes, which stop together at a step's end) does nothing."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        self._interrupting = True
        if self.signum is not None:  # asked already (during sampling): the grace runs from the request
            self._arm(max(0.0, self.grace - (time.monotonic() - self._at)))
        try:
            yield
        finally:
            self._interrupting = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self, delay: float) -> None:
        if self._timer is None:
            self._timer = threading.Timer(delay, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        if self._interrupting and self.signum is not None:
            self._escalate = True
            # a real signal to the main thread: it also ends a blocking call there (time.sleep, select) with EINTR
            signal.pthread_kill(threading.main_thread().ident, self.signum)

    def install(self) -> dict:
        """Install the handlers (main thread only); returns the previous handlers for `restore`."""
        if os.name == "nt" or threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            if self._escalate:  # the grace timer, not a new signal
                self._escalate = False
                if self._interrupting:
                    self._interrupting = False
                    os.write(2, f"mmrl: the rewards did not finish within {self.grace:g} s of the "
                                f"{signal.Signals(self.signum).name}; stopping them\n".encode())
                    raise RewardsInterrupted(self.signum)
                return
            if signum == signal.SIGINT and self.signum is not None:
                raise KeyboardInterrupt("second Ctrl-C: stopped at once, without a checkpoint of the current step")
            self.signum, self._at = signum, time.monotonic()
            # os.write, not print: a signal handler may interrupt a print to stderr (reentrant call)
            os.write(2, f"\nmmrl: {signal.Signals(signum).name} received; stopping after the current step with a "
                        f"checkpoint (Ctrl-C again stops at once)\n".encode())
            if self._interrupting:
                self._arm(self.grace)

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
