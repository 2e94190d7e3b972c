"""Running a reward call under a time limit so that, when the limit passes, the work really stops.

Two ways, chosen per reward by `RewardSet` when `timeout` is set:
- `run_in_child` (rewards marked `isolated`, e.g. the math, Countdown and Sudoku rewards, pure CPU string work): the
  call runs in a forked child process with an address-space limit (`memory_limit` bytes beyond what the trainer
  already maps), killed with SIGKILL at the deadline. In the child the call runs in its main thread, so math-verify's
  own SIGALRM timeouts stay on; an expression that sympy would expand to gigabytes fails with MemoryError in the
  child instead of growing the trainer. Forking is cheap (copy-on-write) and the child sees the reward as loaded.
- `stop_thread` (other callables, which may hold a GPU model or locks that a forked child cannot use): the call runs
  in a worker thread as before; at the deadline an exception is raised inside that thread, which stops Python code
  (sympy, loops) at its next bytecode. Code blocked in native calls cannot be interrupted: the timeout message says so.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import resource
import select
import signal
import threading
import time
from typing import Any, Callable

DEFAULT_MEMORY_LIMIT = 4 * 2**30
"""Bytes of address space an isolated reward call may add to what the trainer process maps."""


def isolated(fn: Callable) -> Callable:
    """Mark a reward as safe to run in a forked child under a timeout (pure Python, no GPU, no threads, no sockets)."""
    fn.isolated = True
    return fn


def is_isolated(fn: Callable) -> bool:
    """Whether `fn` (or the function a `functools.partial` wraps) is marked `isolated`, and fork is available."""
    inner = getattr(fn, "func", fn)
    return hasattr(os, "fork") and bool(getattr(fn, "isolated", False) or getattr(inner, "isolated", False))


class ChildFailed(RuntimeError):
    """The child process running an isolated reward died or exceeded its memory limit."""


class ChildTimeout(ChildFailed):
    """The child did not answer within the time limit; it was killed."""


def _vm_size() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def run_in_child(call: Callable[[], Any], timeout: float, memory_limit: int = DEFAULT_MEMORY_LIMIT) -> Any:
    """`call()` in a forked child: its return value, or its exception re-raised here; `ChildTimeout` (child killed)
    after `timeout` seconds; `ChildFailed` if it dies or runs out of its memory."""
    base = _vm_size()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 0
        try:
            os.close(r)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            if base:
                resource.setrlimit(resource.RLIMIT_AS, (base + memory_limit, base + memory_limit))
            try:
                payload = pickle.dumps(("ok", call()))
            except MemoryError:
                payload = pickle.dumps(("memory", None))
            except BaseException as e:
                try:
                    payload = pickle.dumps(("error", e))
                except Exception:
                    payload = pickle.dumps(("error", RuntimeError(f"{type(e).__name__}: {e}")))
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view):]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline, timed_out = [], time.monotonic() + timeout, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        raise ChildTimeout(f"did not return within {timeout:g} s (its worker process was killed)")
    if not chunks:
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        raise ChildFailed(f"its worker process died ({why}) without an answer")
    kind, value = pickle.loads(b"".join(chunks))  # our own child's answer
    if kind == "memory":
        raise ChildFailed(f"ran out of its memory limit ({memory_limit / 2**30:g} GiB beyond the trainer's) and was stopped")
    if kind == "error":
        raise value
    return value


def stop_thread(thread: threading.Thread, exc_type: type[BaseException], wait: float = 1.0) -> bool:
    """Raise `exc_type` inside `thread` (at its next Python bytecode) and wait up to `wait` s; True if it stopped."""
    if thread.ident is None or not thread.is_alive():
        return True
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
    thread.join(wait)
    return not thread.is_alive()
