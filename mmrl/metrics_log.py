"""Metric sinks: the JSONL record always; TensorBoard, W&B, MLflow and accelerate's other trackers when asked for
in `report_to` (`mmrl.trackers`).

Metric names follow TRL's GRPOTrainer where the concept is the same (`reward`, `reward_std`,
`rewards/<name>/mean`, `frac_reward_zero_std`, `completions/mean_length`, `entropy`, `kl`, `clip_ratio/*`), plus
`gcpo/*`, `dgpo/*`, `dmpo/*` and `perf/*`.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


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
                # drop records of steps after the checkpoint we resume from (they will be recomputed), and a last line
                # cut short by a killed process; rewritten through a temporary file so a kill now loses nothing
                keep = [line for line in path.read_text().splitlines() if (rec := _record(line)) is not None and rec.get("step", 0) <= resume_step]
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in keep))
                os.replace(tmp, path)
            elif resume_step is None and path.exists():
                path.unlink()
        from mmrl.trackers import TRACKER_NAMES, start_tracker

        for name in dict.fromkeys(report_to):
            if name in TRACKER_NAMES:
                tracker = start_tracker(name, self.run_dir, config=config, resume_step=resume_step)
                if tracker is not None:
                    self._trackers.append(tracker)
        self._jsonl = "jsonl" in report_to or True  # JSONL is the record the reports read; always written

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        clean = {k: _to_float(v) for k, v in metrics.items()}
        record = {"step": step, **clean}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        finite = {k: v for k, v in clean.items() if isinstance(v, float) and math.isfinite(v)}
        for tracker in self._trackers:
            tracker.log(finite, step=step)

    def log_completions(self, step: int, rows: list[dict]) -> None:
        """The completions table of a rollout batch (`mmrl.completions_log`): JSONL, TensorBoard text, W&B table."""
        if not self.enabled or not rows:
            return
        from mmrl.completions_log import extra_names, jsonl_lines, markdown_table

        with open(self.completions_path, "a") as f:
            f.write(jsonl_lines(step, rows))
        if self._trackers:
            from mmrl.trackers import log_table

            names = sorted({k for r in rows for k in r["rewards"]})
            extra = extra_names(rows)
            columns = ["step", "prompt", "completion", *names, *extra, "reward", "advantage"]
            data = [[step, r["prompt"], r["completion"], *(r["rewards"].get(n) for n in names),
                     *(r.get(x) if isinstance(r.get(x), (str, int, float, type(None))) else str(r.get(x)) for x in extra),
                     r["reward"], r["advantage"]] for r in rows]
            markdown = markdown_table(rows)
            for tracker in self._trackers:
                log_table(tracker, "completions", columns, data, markdown, step)

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
    return [rec for line in path.read_text().splitlines() if (rec := _record(line)) is not None] if path.exists() else []
