"""Running a reward call under a time limit so that, when the limit passes, the work really stops and its result
is never used.

Three ways, chosen per reward by `RewardSet` when `timeout` is set:
- `WarmWorker` (every synchronous reward unless it is marked `in_process`: the built-in math, Countdown and Sudoku
  rewards and users' reward functions): the call runs in a worker process forked from the trainer once and kept
  warm across steps, with an address-space limit (`memory_limit` bytes beyond what the trainer maps), killed with
  SIGKILL at the deadline and forked again for the next call. A reward stuck in native code (a backtracking regex
  holds the GIL, so no thread of the trainer could even notice the deadline) is stopped all the same. In the worker
  the call runs in its main thread, so math-verify's own SIGALRM timeouts stay on; the worker ignores Ctrl-C and
  SIGTERM (the trainer decides when to stop it) and dies with the trainer (PR_SET_PDEATHSIG). A reward in a worker
  shares no memory with the trainer: state it keeps between calls lives in the worker (lost when it is killed).
- `stop_thread` (rewards marked `in_process`: those holding a GPU model, sockets or locks a forked process cannot
  use, e.g. `clip_score`, `geneval`, `http`): the call runs in a worker thread; at the deadline an exception is raised
  inside it, which stops Python code at its next bytecode; its result is discarded either way.
- async rewards run on an event loop in a thread of their own (`AsyncRunner`); the trainer waits for them with the
  deadline, so a coroutine that blocks the loop or swallows `CancelledError` cannot hold it; a loop left busy by
  such a coroutine is abandoned and a fresh one serves the next call.
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

POLL_SECONDS = 0.1
"""Longest a wait for a reward blocks in one system call: the trainer's stop requests (a signal handler, which
runs between two waits) are seen within this time."""

DEFAULT_MEMORY_LIMIT = 4 * 2**30
"""Bytes of address space an isolated reward call may add to what the trainer process maps."""


def isolated(fn: Callable) -> Callable:
    """Mark a reward as safe to run in a forked worker under a timeout (pure Python, no GPU, no threads, no sockets);
    since every synchronous reward not marked `in_process` runs there, this only documents it."""
    fn.isolated = True
    return fn


def in_process(fn: Callable) -> Callable:
    """Mark a reward (function or class) that must run in the trainer's process under a timeout (it holds a GPU
    model, sockets or locks a forked worker cannot use); at the deadline its thread is interrupted instead."""
    fn.in_process = True
    return fn


def runs_in_process(fn: Callable) -> bool:
    """Whether `fn` (or the function a `functools.partial` wraps, or its class) is marked `in_process`, or fork is
    unavailable."""
    inner = getattr(fn, "func", fn)
    return not hasattr(os, "fork") or bool(getattr(fn, "in_process", False) or getattr(inner, "in_process", False))


class ChildFailed(RuntimeError):
    """The child process running an isolated reward died or exceeded its memory limit."""


class ChildTimeout(ChildFailed):
    """The child did not answer within the time limit; it was killed."""


class NotPicklable(TypeError):
    """The call's arguments cannot be sent to a worker process (the caller runs it in its own process instead)."""


def _vm_size() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def _send_bytes(fd: int, payload: bytes) -> None:
    view = memoryview(len(payload).to_bytes(8, "little") + payload)
    while view:
        view = view[os.write(fd, view):]


def _send(fd: int, obj: Any) -> None:
    _send_bytes(fd, pickle.dumps(obj))


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes | None:
    """`n` bytes from `fd`, or None at EOF; raises `TimeoutError` when `deadline` (monotonic) passes first."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if not select.select([fd], [], [], min(left, POLL_SECONDS))[0]:
                continue
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None) -> Any:
    """One message from `fd` (None at EOF); `TimeoutError` at the deadline."""
    head = _read_exactly(fd, 8, deadline)
    if head is None:
        return None
    body = _read_exactly(fd, int.from_bytes(head, "little"), deadline)
    return None if body is None else pickle.loads(body)  # our own worker's answer


def _die_with_parent() -> None:
    """Linux: the kernel sends this process SIGKILL when the trainer dies (no orphaned worker keeps running)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


class WarmWorker:
    """A forked worker process that runs `functions[name](**kwargs)` calls, one at a time, each under a deadline.

    Forked on first use (so it sees the rewards as the trainer has loaded them) and kept across calls; killed with
    SIGKILL when a call overruns its deadline, when the caller is interrupted (Ctrl-C / SIGTERM in the trainer), or
    on `close`, and forked again for the next call."""

    def __init__(self, functions: dict[str, Callable], memory_limit: int = DEFAULT_MEMORY_LIMIT):
        self.functions, self.memory_limit = functions, int(memory_limit)
        self.pid: int | None = None
        self._to = self._from = -1

    def _start(self) -> None:
        base = _vm_size()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            try:
                os.close(req_w)
                os.close(rep_r)
                _die_with_parent()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer decides
                if base:
                    resource.setrlimit(resource.RLIMIT_AS, (base + self.memory_limit, base + self.memory_limit))
                self._serve(req_r, rep_w)
            finally:
                os._exit(0)
        os.close(req_r)
        os.close(rep_w)
        self.pid, self._to, self._from = pid, req_w, rep_r

    def _serve(self, req: int, rep: int) -> None:
        while True:
            try:
                msg = _receive(req)
            except Exception:
                return
            if msg is None:
                return
            name, kwargs, want_logs = msg
            metrics: dict = {}
            extras: dict = {}
            if want_logs:
                kwargs["log_metric"] = lambda k, v: metrics.__setitem__(k, float(v))
                kwargs["log_extra"] = lambda k, vals: extras.__setitem__(k, list(vals))
            try:
                out = self.functions[name](**kwargs)
                if hasattr(out, "__await__"):
                    import asyncio

                    async def _wait(x):
                        return await x

                    out = asyncio.run(_wait(out))
                answer = ("ok", (out, metrics, extras))
            except MemoryError:
                answer = ("memory", None)
            except BaseException as e:
                answer = ("error", e)
            try:
                _send(rep, answer)
            except MemoryError:
                _send(rep, ("memory", None))
            except Exception:
                _send(rep, ("error", RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))

    def call(self, name: str, kwargs: dict, want_logs: bool, timeout: float) -> tuple[Any, dict, dict]:
        """(return value, logged metrics, logged extras) of `functions[name](**kwargs)`; its exception re-raised;
        `ChildTimeout` (worker killed) after `timeout` s; `ChildFailed` if the worker dies or runs out of memory."""
        if self.pid is None:
            self._start()
        deadline = time.monotonic() + timeout
        try:
            request = pickle.dumps((name, kwargs, want_logs))
        except Exception as e:  # a column or completion that cannot cross a process boundary
            raise NotPicklable(f"its arguments cannot be sent to the worker process ({type(e).__name__}: {e})") from e
        try:
            _send_bytes(self._to, request)
            answer = _receive(self._from, deadline)
        except TimeoutError:
            self.close()
            raise ChildTimeout(f"did not return within {timeout:g} s") from None
        except BrokenPipeError:
            answer = None
        except BaseException:  # interrupted (Ctrl-C / SIGTERM raised here) or a request that cannot be pickled
            self.close()
            raise
        if answer is None:
            status = self.close()
            why = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
                   ) if status is not None else "unknown status"
            raise ChildFailed(f"its worker process died ({why}) without an answer")
        kind, value = answer
        if kind == "memory":
            self.close()
            raise ChildFailed(f"ran out of its memory limit ({self.memory_limit / 2**30:g} GiB beyond the trainer's) and "
                              "was stopped")
        if kind == "error":
            raise value
        return value

    def close(self) -> int | None:
        """Kill and reap the worker (if any); its wait status."""
        if self.pid is None:
            return None
        for fd in (self._to, self._from):
            try:
                os.close(fd)
            except OSError:
                pass
        status = None
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.pid, self._to, self._from = None, -1, -1
        return status


def _result_by(fut, deadline: float | None):
    """`fut.result()`, waiting in slices of `POLL_SECONDS`; `concurrent.futures.TimeoutError` at the deadline."""
    import concurrent.futures as cf

    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise cf.TimeoutError
        try:
            return fut.result(POLL_SECONDS if left is None else min(left, POLL_SECONDS))
        except cf.TimeoutError:
            continue


def join_by(thread: threading.Thread, timeout: float) -> None:
    """`thread.join(timeout)`, in slices of `POLL_SECONDS`."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        thread.join(min(left, POLL_SECONDS))


class AsyncRunner:
    """An event loop in a daemon thread of its own, on which async rewards run; the caller waits with a deadline.

    A coroutine that blocks the loop (calls blocking code) or swallows `CancelledError` cannot hold the caller: at
    the deadline its future is cancelled and given up; the loop, if it is still busy after a short grace, is
    abandoned (stopped once it frees) and the next call gets a fresh one."""

    GRACE = 0.2
    """Seconds a cancelled coroutine gets to finish before its loop is abandoned."""

    def __init__(self):
        self._loop = None

    def _ensure(self):
        import asyncio

        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mmrl-async-rewards", daemon=True).start()
            self._loop = loop
        return self._loop

    def run(self, coros: dict[str, Any], timeout: float | None) -> dict[str, tuple[str, Any]]:
        """name -> ("ok", value) | ("error", exception) | ("timeout", None) for each coroutine, all run concurrently;
        a result that arrives after the deadline is never used."""
        import asyncio
        import concurrent.futures as cf

        loop = self._ensure()
        futures = {name: asyncio.run_coroutine_threadsafe(c, loop) for name, c in coros.items()}
        deadline = None if timeout is None else time.monotonic() + timeout
        out: dict[str, tuple[str, Any]] = {}
        try:
            for name, fut in futures.items():
                try:
                    out[name] = ("ok", _result_by(fut, deadline))
                except cf.TimeoutError:
                    out[name] = ("timeout", None)
                except (cf.CancelledError, asyncio.CancelledError):
                    out[name] = ("error", RuntimeError("the coroutine was cancelled"))
                except Exception as e:
                    out[name] = ("error", e)
        finally:
            late = [f for f in futures.values() if not f.done()]
            for f in late:
                f.cancel()
            if late:
                done, _ = cf.wait(late, timeout=self.GRACE)
                if len(done) < len(late):  # still running: blocked, or it swallowed the cancellation
                    self.abandon()
        return out

    def abandon(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)  # runs once the loop frees; the daemon thread then ends
            self._loop = None


def stop_thread(thread: threading.Thread, exc_type: type[BaseException], wait: float = 1.0) -> bool:
    """Raise `exc_type` inside `thread` (at its next Python bytecode) and wait up to `wait` s; True if it stopped."""
    if thread.ident is None or not thread.is_alive():
        return True
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))
    thread.join(wait)
    return not thread.is_alive()
