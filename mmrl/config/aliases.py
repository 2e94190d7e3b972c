"""TRL's / transformers' spellings of configuration keys that mmrl names differently, accepted in YAML files and on
the command line (`mmrl train --resume_from_checkpoint auto --bf16`).

    resume_from_checkpoint: X   ->  resume_from: X                (true -> auto, false -> null)
    bf16: true                  ->  mixed_precision: bf16        (bf16: false -> mixed_precision: no)
    fp16: true                  ->  mixed_precision: fp16

Giving both spellings of one setting with different values is an error naming both.
"""
from __future__ import annotations

from typing import Any

RENAMED = {"resume_from_checkpoint": "resume_from"}
"""TRL name -> mmrl field, same meaning and values."""

PRECISION_FLAGS = {"bf16": "bf16", "fp16": "fp16"}
"""transformers' boolean precision flags -> the `mixed_precision` value they mean."""


def alias_names() -> list[str]:
    return sorted([*RENAMED, *PRECISION_FLAGS])


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return value.lower() in ("true", "yes", "1", "on")
    from mmrl.config.errors import ConfigError

    raise ConfigError(f"{key}={value!r}: expected true or false")


def translate(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with TRL spellings replaced by mmrl's field names (other keys untouched)."""
    from mmrl.config.errors import ConfigError

    out: dict[str, Any] = {}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key in RENAMED:
            key_to, value_to = RENAMED[key], value
            if key == "resume_from_checkpoint" and (value is True or str(value).lower() == "true"):
                value_to = "auto"  # TRL: True resumes from the latest checkpoint of output_dir
            elif key == "resume_from_checkpoint" and (value is False or str(value).lower() == "false"):
                value_to = None
        elif key in PRECISION_FLAGS:
            if not _as_bool(key, value):
                if any(k.replace("-", "_") == "mixed_precision" for k in values) or any(
                        k != key and k in PRECISION_FLAGS and _as_bool(k, v) for k, v in values.items()):
                    continue  # `bf16: false` beside an explicit precision says nothing more
                key_to, value_to = "mixed_precision", "no"
            else:
                key_to, value_to = "mixed_precision", PRECISION_FLAGS[key]
        else:
            key_to, value_to = key, value
        if key_to in out and out[key_to] != value_to:
            raise ConfigError(f"{key}={value!r} contradicts {key_to}={out[key_to]!r}; give the setting once")
        out[key_to] = value_to
    return out
