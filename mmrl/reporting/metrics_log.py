"""Metric sinks: the JSONL record always; TensorBoard, W&B, MLflow and accelerate's other trackers when asked for
in `report_to` (`mmrl.reporting.trackers`).

Metric names follow TRL's GRPOTrainer where the concept is the same (`reward`, `reward_std`,
`rewards/<name>/mean`, `frac_reward_zero_std`, `completions/mean_length`, `entropy`, `kl`, `clip_ratio/*`), plus
`gcpo/*`, `dgpo/*`, `dmpo/*` and `perf/*`.
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterator

logger = logging.getLogger(__name__)


class MetricLogger:
    """Writes one record per logged step to `<run>/metrics.jsonl` and to every tracker of `report_to`."""

    def __init__(self, run_dir: str | Path, report_to: list[str], *, config: dict | None = None, resume_step: int | None = None, enabled: bool = True):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self.completions_path = self.run_dir / "completions.jsonl"
        self._trackers: list = []
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.path, self.completions_path):
            if resume_step is not None and path.exists():
                keep_records_up_to(path, resume_step)
            elif resume_step is None and path.exists():
                # a rerun that resumes nothing (a fresh run, or resume_from=auto before the first checkpoint): the
                # earlier run's log is moved aside, never deleted
                aside = move_aside(path)
                logger.warning("%s holds the log of an earlier run here; moved it to %s", path, aside.name)
        from mmrl.reporting.trackers import TRACKER_NAMES, start_tracker

        for name in dict.fromkeys(report_to):
            if name in TRACKER_NAMES:
                tracker = start_tracker(name, self.run_dir, config=config, resume_step=resume_step)
                if tracker is not None:
                    self._trackers.append(tracker)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _to_float(v) for k, v in metrics.items()}
        record = {"step": step, **clean}
        _append(self.path, json.dumps(record) + "\n")
        finite = {k: v for k, v in clean.items() if isinstance(v, float) and math.isfinite(v)}
        for tracker in self._trackers:
            tracker.log(finite, step=step)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        """The completions table of a rollout batch (`mmrl.reporting.completions`): JSONL, TensorBoard text, W&B table."""
        if not self.enabled or not rows:
            return
        from mmrl.reporting.completions import extra_names, jsonl_lines, markdown_table

        _append(self.completions_path, jsonl_lines(step, rows))
        if self._trackers:
            from mmrl.reporting.trackers import log_table

            names = sorted({k for r in rows for k in r["rewards"]})
            extra = extra_names(rows)
            columns = ["step", "prompt", "completion", *names, *extra, "reward", "advantage"]
            data = [[step, r["prompt"], r["completion"], *(r["rewards"].get(n) for n in names),
                     *(r.get(x) if isinstance(r.get(x), (str, int, float, type(None))) else str(r.get(x)) for x in extra),
                     r["reward"], r["advantage"]] for r in rows]
            markdown = markdown_table(rows)
            for tracker in self._trackers:
                log_table(tracker, "completions", columns, data, markdown, step)

    def sync(self) -> None:
        """fsync the JSONL logs (called before every checkpoint, so a checkpoint is never ahead of its logs on disk)."""
        if not self.enabled:
            return
        for path in (self.path, self.completions_path):
            if path.exists():
                try:
                    with open(path, "ab") as f:
                        os.fsync(f.fileno())
                except OSError as e:
                    raise _named(e, path, "syncing") from e

    def close(self) -> None:
        for tracker in self._trackers:
            tracker.finish()


def _to_float(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return v


def _named(e: OSError, path: Path, doing: str) -> OSError:
    """`e` with a message naming the log file; a full disk (ENOSPC / EDQUOT) says what to do."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OSError(e.errno, f"No space left on device while {doing} {path}; the records up to the last checkpoint are "
                                "on disk (a line cut short is skipped on resume): free space, then resume with resume_from=auto")
    return OSError(e.errno, f"{type(e).__name__} while {doing} {path}: {e}")


def _append(path: Path, text: str) -> None:
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise _named(e, path, "appending to") from e


def move_aside(path: Path) -> Path:
    """Rename `path` to `<stem>.previous-<n><suffix>` (the first free n) and return the new path."""
    n = 1
    while (aside := path.with_name(f"{path.stem}.previous-{n}{path.suffix}")).exists():
        n += 1
    os.replace(path, aside)
    return aside


def iter_records(path: Path) -> Iterator[tuple[bytes, dict]]:
    """(raw line, record) of each usable line of a JSONL log, read one line at a time (a log of gigabytes never sits
    in memory). A line that is not UTF-8 JSON of an object (a last line cut short by a killed process, a damaged
    byte) is skipped, with a warning naming its line number."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                rec = _record(raw.decode("utf-8"))
            except UnicodeDecodeError:
                rec = None
            if rec is None:
                if raw.strip():
                    logger.warning("%s:%d: not a JSON record (cut short or damaged); skipped", path, lineno)
                continue
            yield raw if raw.endswith(b"\n") else raw + b"\n", rec


def keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records of steps after `step` (they will be recomputed) and unusable lines, streaming through a
    temporary file that replaces `path` atomically (a kill meanwhile loses nothing)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        for raw, rec in iter_records(path):
            if rec.get("step", 0) <= step:
                out.write(raw)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _record(line: str) -> dict | None:
    """One JSONL record, or None for a blank line or one cut short by a killed process."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of `<run_dir>/metrics.jsonl` (a last line cut short by a kill is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    return [rec for _, rec in iter_records(path)] if path.exists() else []
