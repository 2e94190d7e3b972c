"""Which settings may differ between a run and the checkpoint it resumes from, and what happens when they do.

A checkpoint records its run's configuration (`trainer_state.json`, "config"). On resume each field is one of:
- `FIXED_ON_RESUME`: the resumed run would not be the same run (another seed gives other data order and samples,
  another group size or batch geometry does not fit the saved rollout buffer, another model does not fit the saved
  weights). Refused before the model loads, naming the field, both values, and the way out (a new `output_dir`).
- `CHECKPOINT_WINS`: optimizer and schedule settings that live in the saved optimizer/scheduler state; the
  checkpoint's values are used (as TRL/accelerate do when they load the state), the run's config is set to them, so
  that the next checkpoint records what was trained with, and a warning says so.
- `FREE`: where and how often to log, save, evaluate, and how long to train; changed silently.
- any other field (loss, clipping, KL, rewards, sampling options): the new value is applied, with a warning.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

from mmrl.config.train_config import ConfigError, TrainConfig

FIXED_ON_RESUME = (
    "method", "family", "model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_target_modules", "torch_dtype",
    "use_dora", "use_rslora", "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type",
    "seed", "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations",
    "steps_per_generation", "generation_batch_size", "max_completion_length", "block_length", "task", "dataset_path",
)
CHECKPOINT_WINS = ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps", "optim", "adam_beta1",
                   "adam_beta2", "adam_epsilon", "weight_decay", "init_optimizer_from_base")
FREE = (
    "max_steps", "output_dir", "resume_from", "logging_steps", "report_to", "save_steps", "save_total_limit", "eval_steps",
    "eval_limit", "eval_generation", "credit_steps", "progress_bar", "eval_strategy", "run_name", "push_to_hub",
    "hub_model_id", "hub_private_repo",
)


class ResumeWarning(UserWarning):
    """A setting given to a resumed run differs from its checkpoint's."""


def _norm(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))  # the form trainer_state.json stores (lists, no tuples)


def changed_settings(cfg: TrainConfig, saved: dict) -> dict[str, tuple[Any, Any]]:
    """Fields whose value in `cfg` differs from the saved config: name -> (saved, now). Fields absent from `saved`
    (older checkpoints) are not compared."""
    now = _norm(cfg.to_dict())
    return {k: (saved[k], now[k]) for k in now if k in saved and _norm(saved[k]) != now[k]}


def check_resume_settings(cfg: TrainConfig, saved: dict, path: str | Path) -> None:
    """Raise `ConfigError` naming every `FIXED_ON_RESUME` field that differs from checkpoint `path`'s."""
    diff = changed_settings(cfg, saved)
    bad = [f"{k}={now!r} (the checkpoint has {old!r})" for k, (old, now) in diff.items() if k in FIXED_ON_RESUME]
    if bad:
        raise ConfigError(f"cannot resume from {path} with changed settings: {', '.join(bad)}. These fix the run's data "
                          "order, batches and model; resume with the checkpoint's values, or start a new run in a new "
                          "output_dir (a new run may load the weights with model_name_or_path=<checkpoint>/model)")


def apply_resume_settings(cfg: TrainConfig, saved: dict, path: str | Path) -> TrainConfig:
    """The config a resumed run continues with: refuses changed `FIXED_ON_RESUME` fields, takes `CHECKPOINT_WINS`
    fields from the checkpoint, keeps the other new values; warns about every change that is not `FREE`."""
    check_resume_settings(cfg, saved, path)
    diff = changed_settings(cfg, saved)
    wins = {k: old for k, (old, now) in diff.items() if k in CHECKPOINT_WINS}
    if wins:
        warnings.warn(f"resuming from {path}: the checkpoint's optimizer and scheduler state is used, so "
                      + ", ".join(f"{k}={old!r} (not {diff[k][1]!r})" for k, old in wins.items())
                      + "; start a new run to change them", ResumeWarning, stacklevel=3)
    applied = {k: v for k, v in diff.items() if k not in CHECKPOINT_WINS and k not in FREE}
    if applied:
        warnings.warn(f"resuming from {path} with changed settings (applied from now on): "
                      + ", ".join(f"{k} {old!r} -> {now!r}" for k, (old, now) in applied.items()), ResumeWarning, stacklevel=3)
    if not wins:
        return cfg
    types = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    values = {k: (float(v) if "float" in str(types[k]) and isinstance(v, (int, float)) else v) for k, v in wins.items()}
    return dataclasses.replace(cfg, **values)


def check_before_loading(cfg: TrainConfig, run_dir: str | Path) -> None:
    """`check_resume_settings` against the checkpoint a resume would start from, before any model is loaded (an
    unreadable state file is left to the verified load, which names it)."""
    from mmrl.checkpointing.checkpoint import latest_checkpoint

    path = latest_checkpoint(run_dir) if cfg.resume_from == "auto" else Path(cfg.resume_from)
    if path is None:
        return
    try:
        state = json.loads((path / "trainer_state.json").read_text())
        saved, step = state.get("config") or {}, int(state.get("step", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return
    if isinstance(saved, dict):
        check_resume_settings(cfg, saved, path)
    if cfg.max_steps is not None and 0 < cfg.max_steps < step:
        raise ConfigError(f"resume_from={cfg.resume_from!r}: checkpoint {path.name} is at step {step}, beyond max_steps="
                          f"{cfg.max_steps}, so there is nothing to train; raise max_steps above {step}, or resume from "
                          "an earlier checkpoint")


def dataset_digest(rows) -> str:
    """SHA-256 of the training rows as the run reads them (values, not object identities: images and arrays by their
    bytes), so a resume can tell whether the dataset's content changed."""
    import hashlib

    h = hashlib.sha256()

    def encode(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            return {"bytes": hashlib.sha256(v).hexdigest()}
        if hasattr(v, "tobytes") and callable(v.tobytes):  # PIL images, numpy arrays, tensors
            try:
                return {"bytes": hashlib.sha256(v.tobytes()).hexdigest(), "shape": str(getattr(v, "size", getattr(v, "shape", "")))}
            except Exception:
                pass
        return type(v).__name__  # never a repr: it may hold a memory address

    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=encode).encode())
        h.update(b"\n")
    return h.hexdigest()


def check_dataset_unchanged(cfg: TrainConfig, run_dir: str | Path, digest: str) -> None:
    """Refuse (before the model loads) to resume a checkpoint whose run trained on rows with another `digest`
    (`dataset_digest`); checkpoints written before the digest was recorded are not checked."""
    from mmrl.checkpointing.checkpoint import latest_checkpoint

    path = latest_checkpoint(run_dir) if cfg.resume_from == "auto" else Path(cfg.resume_from)
    if path is None:
        return
    try:
        saved = json.loads((path / "trainer_state.json").read_text()).get("dataset_sha256")
    except (OSError, ValueError, AttributeError):
        return
    if saved and saved != digest:
        raise ConfigError(f"cannot resume from {path}: the training dataset's content changed since it was written "
                          f"(rows SHA-256 {digest[:12]}..., the checkpoint's run had {saved[:12]}...); a resumed run must "
                          "read the same rows in the same order. Restore the data, or train on the new data in a new "
                          "output_dir")
