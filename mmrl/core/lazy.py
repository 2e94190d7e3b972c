"""Heavy models (CLIP, detectors) load lazily, on first use, and once per process per configuration."""
from __future__ import annotations

import threading
from typing import Any, Callable, Hashable

_CACHE: dict[Hashable, Any] = {}
_LOCK = threading.Lock()


def load_once(key: Hashable, loader: Callable[[], Any]) -> Any:
    """`loader()` the first time `key` is asked for, the cached object afterwards (thread-safe)."""
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = loader()
        return _CACHE[key]


def loaded_keys() -> list[Hashable]:
    """Keys of everything loaded so far (for tests and logging)."""
    with _LOCK:
        return list(_CACHE)


def clear() -> None:
    """Forget every loaded model (frees memory; the next use loads again)."""
    with _LOCK:
        _CACHE.clear()
