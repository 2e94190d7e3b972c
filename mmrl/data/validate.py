"""Start-up checks of dataset files and rows: every problem named by file, line and column, before a model loads.

- `read_lines(path)`: the file's text lines; a byte that is not UTF-8 is reported by line and column, not by offset.
- `read_jsonl(path)`: one JSON object per non-blank line; a malformed line or a row that is not an object (a list, a
  number) names its own line and column.
- `check_rows(rows, where)`: a non-empty list of dict rows.
- `check_prompts(rows, where)`: every row has a usable `prompt` (a non-empty string, a list of chat messages, or a
  dict with a `prompt`, as the VLM rows carry), so that a null prompt stops the run here, not after the model loads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


class DataError(ValueError):
    """A dataset file or row that cannot be used; the message names the file, the line (or row) and the problem."""


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (an initial BOM dropped); `DataError` naming line and column for bad bytes."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as UTF-8") from None
    return text.splitlines()


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file: one JSON object per non-blank line."""
    path = Path(path)
    rows = []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{lineno}:{e.colno}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise DataError(f"{path}:{lineno}: JSON nested too deeply") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: each line must be a JSON object of columns, got {type(row).__name__}")
        rows.append(row)
    check_rows(rows, str(path))
    return rows


def check_rows(rows: Sequence[Any], where: str) -> None:
    """`rows` is a non-empty sequence of dicts (`where` names the source in the message)."""
    if len(rows) == 0:
        raise DataError(f"{where}: no rows (empty)")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{where}: row {i} must be an object of columns, got {type(row).__name__} {str(row)[:60]!r}")


def check_prompts(rows: Sequence[Any], where: str) -> None:
    """Every row has a usable `prompt`; `DataError` naming the first bad row (0-based) and what a prompt may be."""
    check_rows(rows, where)
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, dict):  # VLM rows: {"prompt": text, "images": [...]}
            prompt = prompt.get("prompt")
        ok = (isinstance(prompt, str) and prompt.strip()) or (isinstance(prompt, list) and prompt
                                                              and all(isinstance(m, dict) for m in prompt))
        if not ok:
            what = "missing" if "prompt" not in row else f"{type(prompt).__name__} {repr(prompt)[:40]}"
            raise DataError(f"{where}: row {i}: the prompt is {what}; a prompt is a non-empty string or a list of chat "
                            "messages ({'role': ..., 'content': ...})")
