"""`trust_remote_code`: loading a checkpoint that ships its own modelling code runs that code. mmrl passes the flag to
transformers only when the user asks for it, and warns every time it is used."""
from __future__ import annotations

import os
import warnings


class RemoteCodeWarning(UserWarning):
    """A checkpoint is loaded with `trust_remote_code=True`."""


def warn_remote_code(path: str | os.PathLike) -> None:
    """Warn that loading `path` with `trust_remote_code=True` may execute Python code that came with it."""
    warnings.warn(
        f"trust_remote_code=True: loading {os.fspath(path)!r} may run Python code shipped with the checkpoint "
        "(its modelling and tokenizer files) with your permissions; use it only for checkpoints from a source you trust",
        RemoteCodeWarning,
        stacklevel=3,
    )
