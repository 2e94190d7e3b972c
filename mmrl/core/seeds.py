"""Derived random seeds: every random stream of a run is seeded from (seed, what, index...), so a resumed run
continues exactly like an uninterrupted one."""
from __future__ import annotations

import hashlib
from typing import Any


def derived_seed(*parts: Any) -> int:
    """A 62-bit seed from a tuple (seed, purpose, index...): independent streams that survive a restart."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2
