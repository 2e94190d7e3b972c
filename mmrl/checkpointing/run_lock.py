"""One trainer per `output_dir`: an exclusive lock on `<output_dir>/mmrl.lock`, which holds the owner's pid and host.

The lock is an advisory `flock` on the file, so the kernel releases it when its process dies in any way (SIGKILL, OOM,
power loss of a local disk): a lock file left behind by a dead run is stale and simply taken over. A second trainer
on the same directory stops before loading a model, naming the running one (metrics and checkpoints of two runs
would otherwise interleave). With several processes only the main one takes the lock.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

LOCK_NAME = "mmrl.lock"


class RunLocked(RuntimeError):
    """Another live process holds the lock of this output_dir."""


class RunLock:
    """`RunLock(output_dir).acquire()` ... `.release()`; also a context manager. Re-acquiring a held lock is a no-op."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        import fcntl

        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                raise RunLocked(f"output_dir {str(self.path.parent)!r} is in use by another trainer ({owner}; lock file "
                                f"{self.path}); wait for it to finish or stop it, or choose another output_dir") from None
            # the file may have been unlinked by its previous owner between our open and our flock: lock the live one
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # while still locked: nobody can have locked this file meanwhile
        finally:
            os.close(fd)  # releases the flock

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # a Trainer dropped without train() finishing
        try:
            self.release()
        except Exception:
            pass


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "owner unknown"


def remove_unfinished_run(run_dir: str | os.PathLike) -> None:
    """Delete the folder of an unfinished run (a stopped earlier call's) before running it again, unless a live
    trainer is writing it: the folder's lock is taken first, so a second job started on the same output (e.g. the same
    comparison launched twice) stops with `RunLocked` instead of deleting the lock of the running one and then
    training beside it into the same files. Everything but the lock file is removed while the lock is held."""
    import shutil

    run_dir = Path(run_dir)
    if not run_dir.exists():
        return
    lock = RunLock(run_dir).acquire()
    try:
        for p in run_dir.iterdir():
            if p.name == LOCK_NAME:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    finally:
        lock.release()
    try:
        run_dir.rmdir()
    except OSError:  # a new run took the folder between the release and here: it is that run's now
        pass
