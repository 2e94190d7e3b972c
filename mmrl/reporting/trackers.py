"""Experiment trackers through accelerate's tracker API (`accelerate.tracking`): TensorBoard, W&B, MLflow, Comet,
Aim, ClearML, DVCLive, SwanLab, Trackio, named in `report_to` as TRL names them.

Each tracker writes inside the run directory where it writes files at all (TensorBoard in `<run>/tensorboard`,
W&B's local files in `<run>/wandb`, MLflow in `<run>/mlflow`). A resumed run continues the same W&B run: the run id
is kept in `<run>/wandb_run_id` and passed to `wandb.init(id=..., resume="allow")`; TensorBoard drops the events
after the checkpoint's step (`purge_step`), as `metrics.jsonl` drops its records.
"""
from __future__ import annotations

import uuid
import warnings
from pathlib import Path
from typing import Any

TRACKER_NAMES = ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
"""`report_to` names of accelerate's trackers (`accelerate.tracking.LOGGER_TYPE_TO_CLASS`)."""

PROJECT = "mmrl"
"""Project / experiment name the trackers file runs under when the environment names none."""

PROJECT_ENV = {"wandb": "WANDB_PROJECT", "mlflow": "MLFLOW_EXPERIMENT_NAME", "comet_ml": "COMET_PROJECT_NAME"}
"""The environment variables transformers' callbacks read the project of each tracker from."""


def project_name(tracker: str) -> str:
    """The tracker's project: its environment variable (WANDB_PROJECT, ...), as transformers reads it, else PROJECT."""
    import os

    env = PROJECT_ENV.get(tracker)
    return (os.environ.get(env) or PROJECT) if env else PROJECT


def run_name(config: dict | None, run_dir: Path) -> str:
    """transformers' `run_name`: the config's, else the run directory's name."""
    return str((config or {}).get("run_name") or Path(run_dir).resolve().name)

WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: Path, resuming: bool) -> str:
    """The W&B run id of this run directory: the stored one when resuming, else a new one, stored for the next
    resume (a fresh run restarts at step 1, which the old W&B run would refuse)."""
    path = Path(run_dir) / WANDB_ID_FILE
    if resuming and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:16]
    path.write_text(run_id + "\n")
    return run_id


def start_tracker(name: str, run_dir: Path, *, config: dict | None, resume_step: int | None):
    """An accelerate tracker, started; None (with a warning) when its package is not installed."""
    from accelerate import tracking

    cls = tracking.LOGGER_TYPE_TO_CLASS[name]
    run_dir = Path(run_dir)
    if name == "tensorboard":
        tracker = cls("tensorboard", run_dir, purge_step=(resume_step + 1) if resume_step is not None else None)
    elif name == "wandb":
        tracker = cls(project_name(name), dir=str(run_dir), config=config or {}, id=wandb_run_id(run_dir, resume_step is not None),
                      resume="allow", name=run_name(config, run_dir))
    elif name == "mlflow":
        tracker = cls(experiment_name=project_name(name), logging_dir=str(run_dir / "mlflow"), run_name=run_name(config, run_dir))
    elif getattr(cls, "requires_logging_directory", False):
        tracker = cls(PROJECT, str(run_dir / name))
    else:
        tracker = cls(PROJECT)
    try:
        tracker.start()
    except (ImportError, ModuleNotFoundError) as e:
        warnings.warn(f"report_to includes {name} but it cannot start ({type(e).__name__}: {e}); not logging to it", RuntimeWarning)
        return None
    if config and name not in ("tensorboard", "wandb"):  # TensorBoard's hparams take scalars only; W&B got it at init
        try:
            tracker.store_init_configuration({k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
                                              for k, v in config.items()})
        except Exception as e:  # a tracker's own restrictions on configuration values
            warnings.warn(f"{name}: could not store the configuration ({type(e).__name__}: {e})", RuntimeWarning)
    return tracker


def log_table(tracker: Any, name: str, columns: list[str], data: list[list], markdown: str, step: int) -> None:
    """A table to a tracker that has tables (W&B, ...), else its markdown text (TensorBoard's text tab)."""
    if getattr(tracker, "name", None) != "tensorboard" and hasattr(tracker, "log_table"):
        tracker.log_table(name, columns=columns, data=data, step=step)
    else:
        tracker.log({name: markdown}, step=step)
