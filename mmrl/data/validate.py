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


def read_json_list(path: str | Path) -> list[dict]:
    """Rows of a JSON file holding one list of row objects."""
    path = Path(path)
    try:
        data = json.loads("\n".join(read_lines(path)))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply") from None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
    check_rows(data, str(path))
    return data


def check_csv(path: str | Path) -> None:
    """A CSV file that Python's csv module reads as the user meant: UTF-8, a header, at least one row, every row
    with the header's number of fields, and no quoted field left open (an unterminated quote would swallow the rest
    of the file into one field). `DataError` names the file and line."""
    import csv
    import io

    path = Path(path)
    lines = read_lines(path)
    reader = csv.reader(io.StringIO("\n".join(lines)), strict=True)
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"{path}: no rows (empty)")
        rows = 0
        start = reader.line_num + 1
        for fields in reader:
            if fields and len(fields) != len(header):  # a blank line is skipped, as pandas does
                raise DataError(f"{path}:{start}: {len(fields)} fields where the header has {len(header)} "
                                f"({', '.join(header)[:200]}); quote fields that contain commas")
            rows += bool(fields)
            start = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{start}: malformed CSV ({e}): a quote opened on line {start} is never closed"
                        if "end of data" in str(e) or "EOF" in str(e) else f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    if rows == 0:
        raise DataError(f"{path}: no rows (only a header)")


def check_parquet(path: str | Path) -> None:
    """A Parquet file that pyarrow can open and that holds rows; `DataError` naming the file otherwise."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as e:  # pyarrow's ArrowInvalid / OSError for a truncated or foreign file
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"{path}: not a readable Parquet file ({type(e).__name__}: {first})") from None
    if rows == 0:
        raise DataError(f"{path}: no rows (an empty Parquet file)")


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
    check_prompt_sizes(rows, where)


MAX_PROMPT_CHARS = 2**20
"""Characters a prompt may hold (a million: beyond every supported model's context; a 9 MB prompt row used to abort
the process deep inside tokenisation without naming the row)."""


def _text_size(value: Any) -> int:
    """Characters of the text in a prompt: a string, chat messages, or content parts."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for k, v in value.items() if k in ("prompt", "content", "text"))
    if isinstance(value, (list, tuple)):
        return sum(_text_size(v) for v in value)
    return 0


def check_prompt_sizes(rows: Sequence[Any], where: str) -> None:
    """No prompt longer than `MAX_PROMPT_CHARS`; `DataError` naming the row (0-based) and its size otherwise."""
    for i, row in enumerate(rows):
        size = _text_size(row.get("prompt")) if isinstance(row, dict) else 0
        if size > MAX_PROMPT_CHARS:
            raise DataError(f"{where}: row {i}: the prompt holds {size:,} characters, more than the {MAX_PROMPT_CHARS:,} "
                            "allowed; drop or shorten that row")
