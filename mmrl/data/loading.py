"""Rows of a dataset through `datasets.load_dataset`, as TRL users pass data: a JSON/JSONL/CSV/Parquet file, a
directory written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or a Hub dataset name (online only).

Values reach the rewards as written in the file. CSV columns are read as strings (a Sudoku grid `0030...` keeps its
leading zeros; numbers a reward needs it converts itself), as Python's csv module reads them. JSON / JSONL files
are parsed by Python's `json`, not by `datasets` (whose Arrow schema inference decodes the strings of a column that
mixes strings with numbers: `"0030"` became 30, `"null"` None, `"true"` True): every value keeps its JSON type, a
row without a column gets None for it (as `datasets`), and a column that mixes strings with numbers or booleans
is read as strings (the numbers as written in JSON, `30` -> "30", `true` -> "true"), with a warning naming the
column and the file. Every failure is a `DatasetError` whose one-line message
names the path (or Hub name) and what is wrong, raised before any model is loaded.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

import json
import logging

from mmrl.data.validate import DataError, check_csv, check_parquet, check_prompt_sizes, read_json_list, read_jsonl

logger = logging.getLogger(__name__)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> the `datasets` builder that reads it."""


DatasetError = DataError
"""A dataset that cannot be used: missing, malformed, or without a needed column (the message names it); the same
class as `mmrl.data.validate.DataError`, so one `except` catches every bad-data error."""


def is_saved_dataset(path: Path) -> bool:
    """A directory written by `save_to_disk` (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json", "dataset_info.json"))


EVAL_SPLITS = ("test", "validation")
"""Splits a task's evaluation rows come from, in order of preference (`datasets` maps valid / dev / eval to
validation)."""


def local_splits(source: str | Path) -> dict[str, list[dict]]:
    """Every split of a local dataset, as `datasets.load_dataset` finds them: a data file (`train`), a directory
    written by `save_to_disk` (a Dataset: `train`; a DatasetDict: its splits, e.g. only train, or train + validation),
    or a directory of data files named by split as `datasets` names them (`train.jsonl`, `test.csv`, a downloaded Hub
    snapshot's `data/train-00000-of-00002.parquet` shards, `validation.json`; files without a split name are
    `train`). Files are read by `load_rows` (JSON values as written); shards are concatenated in name order."""
    path = Path(source).expanduser()
    if not path.exists():
        raise DatasetError(_not_found(path))
    if path.is_file():
        return {"train": load_rows(path)}
    if is_saved_dataset(path):
        import datasets

        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise DatasetError(f"{path}: could not read the saved dataset ({type(e).__name__}: {first[:300]})") from e
        if isinstance(ds, datasets.DatasetDict):
            out = {str(k): v.to_list() for k, v in ds.items()}
        else:
            out = {"train": ds.to_list()}
        for name, rows in out.items():
            check_prompt_sizes(rows, f"{path} ({name})")
        return out
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        files = DataFilesDict.from_patterns(get_data_patterns(str(path)), base_path=str(path))
    except Exception:  # no data files at all (datasets raises EmptyDatasetError)
        files = {}
    out: dict[str, list[dict]] = {}
    for split, found in files.items():
        usable = sorted(str(f) for f in found if Path(str(f)).suffix.lower() in FILE_BUILDERS)
        if usable:
            out[str(split)] = [row for f in usable for row in load_rows(Path(f))]
    if not out:
        raise DatasetError(f"{path}: a directory without data files ({', '.join(sorted(FILE_BUILDERS))}, by split: "
                           "train.jsonl, test.csv, data/train-*.parquet, ...) and not written by save_to_disk")
    return out


def _not_found(path: Path) -> str:
    """A missing local path, with the files of its nearest existing folder that look like what was meant."""
    import difflib

    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    msg = f"dataset file not found: {path}"
    if parent.is_dir():
        names = sorted(p.name for p in parent.iterdir() if not p.name.startswith("."))
        close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.5)
        if close:
            msg += f" (in {parent}: did you mean {', '.join(close)}?)"
        elif parent != path.parent:
            msg += f" (the folder {path.parent} does not exist)"
    return msg


def load_rows(source: str | Path, *, split: str = "train") -> list[dict]:
    """The rows of `source` (see the module docstring); `split` picks the split of a DatasetDict or Hub dataset."""
    import datasets

    path = Path(source).expanduser()
    try:
        if path.is_file():
            builder = FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise DatasetError(f"{path}: unsupported dataset format {path.suffix!r}; use one of {sorted(FILE_BUILDERS)}, "
                                   "or a directory written by datasets' save_to_disk")
            if builder == "json":  # Python's json: values as written (see the module docstring)
                rows = read_jsonl(path) if path.suffix.lower() == ".jsonl" else read_json_list(path)
                rows = as_written(rows, str(path))
                check_prompt_sizes(rows, str(path))
                return rows
            if builder == "parquet":
                check_parquet(path)
            kwargs: dict[str, Any] = {}
            if builder == "csv":
                check_csv(path)
                kwargs["features"] = datasets.Features({c: datasets.Value("string") for c in _csv_header(path)})
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        elif is_saved_dataset(path):
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DatasetError(f"{path}: no split {split!r} in the saved dataset (splits: {sorted(ds)})")
                ds = ds[split]
        elif path.exists():
            raise DatasetError(f"{path}: a directory, but not one written by save_to_disk (no dataset_dict.json or "
                               "state.json); pass a data file or a saved dataset")
        elif _looks_like_hub_name(str(source)):
            ds = _hub(str(source), split)
        else:
            raise DatasetError(_not_found(path))
    except DatasetError:
        raise
    except Exception as e:  # malformed JSON, ragged CSV, unreadable parquet, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DatasetError(f"{source}: could not read the dataset ({type(e).__name__}: {first[:300]})") from e
    rows = ds.to_list()
    check_prompt_sizes(rows, str(source))
    return rows


_SCALARS = (bool, int, float)


def as_written(rows: list[dict], where: str) -> list[dict]:
    """JSON rows with the columns of all rows (None where a row lacks one, in order of first appearance, as
    `datasets` fills them); a column that mixes strings with numbers or booleans becomes strings (JSON's spelling
    of the numbers), with a warning naming the column and `where`."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    mixed = []
    for col in columns:
        values = [row.get(col) for row in rows]
        if any(isinstance(v, str) for v in values) and any(isinstance(v, _SCALARS) for v in values):
            mixed.append(col)
    for col in mixed:
        for row in rows:
            v = row.get(col)
            if isinstance(v, _SCALARS):
                row[col] = json.dumps(v)
    if mixed:
        logger.warning("%s: column(s) %s mix strings with numbers or booleans; read as strings, as written in the "
                       "file", where, ", ".join(repr(c) for c in mixed))
    return [{c: row.get(c) for c in columns} for row in rows]


def _csv_header(path: Path) -> list[str]:
    with open(path, newline="") as f:
        header = next(csv.reader(f), None)
    if not header:
        raise DatasetError(f"{path}: empty CSV file (no header row)")
    return header


LOCAL_SUFFIXES = (*FILE_BUILDERS, ".arrow", ".txt", ".tsv", ".gz", ".zip")
"""A name ending so is a mistyped local file, never a Hub dataset id."""


def _looks_like_hub_name(name: str) -> bool:
    """`owner/name`, neither part a file name nor the owner an existing local folder (a typo such as
    `data/nope.jsonl` is reported at once, not tried on the Hub for half a minute)."""
    parts = name.split("/")
    return (len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and not Path(parts[0]).suffix
            and not name.lower().endswith(LOCAL_SUFFIXES) and not Path(parts[0]).is_dir())


def _hub(name: str, split: str, config: str | None = None):
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, or the hub is unreachable
        raise DatasetError(f"{name}: not a local path, and loading it from the Hugging Face Hub failed "
                           f"({type(e).__name__}); download it once and pass its local path") from e


def hub_rows(name: str, config: str | None, split: str) -> list[dict]:
    """Rows of a public Hub prompt set (never model weights)."""
    return _hub(name, split, config).to_list()


def require_column(rows: Sequence[dict], column: str, where: str) -> None:
    """Rows exist and every row has `column`; else a DatasetError naming the column, the first row without it
    and its keys."""
    if len(rows) == 0:
        raise DatasetError(f"{where}: the dataset has no rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or column not in r:
            keys = sorted(r) if isinstance(r, dict) else type(r).__name__
            raise DatasetError(f"{where}: row {i} has no {column!r} column (columns: {keys})")


def holdout(rows: list[dict], eval_split: float | int) -> tuple[list[dict], list[dict]]:
    """(train, test): the last `eval_split` rows (a count >= 1, or a fraction in (0, 1) of them, at least one) as
    the test split; 0 holds nothing out."""
    if not eval_split:
        return list(rows), []
    n = int(eval_split) if eval_split >= 1 else max(1, round(len(rows) * float(eval_split)))
    if n >= len(rows):
        raise DatasetError(f"eval_split={eval_split} holds out {n} of {len(rows)} rows: nothing left to train on")
    return list(rows[:-n]), list(rows[-n:])
