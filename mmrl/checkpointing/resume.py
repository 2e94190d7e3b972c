"""The trainer's side of checkpoints: what goes into a checkpoint's `model/` folder, and finding the newest intact
checkpoint of a run to resume (`mmrl/checkpointing/checkpoint.py` holds the atomic writes, manifests and
verification; `mmrl.training.trainer.Trainer._restore` puts a checkpoint back into the trainer)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

from mmrl.checkpointing.checkpoint import CheckpointDamaged, checkpoint_dir, list_checkpoints, quarantine, remove_stale, resume_newest_intact
from mmrl.models.base import is_peft_model
from mmrl.checkpointing.rank_state import Ranks
from mmrl.checkpointing.sharded_save import write_full_weights


def save_model_dir(policy, path: Path, base_model: str | None, full_state: dict | None) -> None:
    """The full model through the adapter's `save_pretrained`; with LoRA only the adapter weights (peft format,
    load with `peft.PeftModel.from_pretrained(base, path)`) plus `mmrl_adapter.json` naming the base model; in a
    sharded run (FSDP / ZeRO-3) the gathered `full_state` replaces the shard's weights."""
    if is_peft_model(policy.model):
        policy.unwrapped.save_pretrained(path)
        meta = {"family": policy.family, "peft_adapter": True, "base_model": base_model,
                "generation_defaults": getattr(policy, "generation_defaults", {})}
        (path / "mmrl_adapter.json").write_text(json.dumps(meta, indent=2, default=str))
    else:
        policy.save_pretrained(path)
    if full_state is not None:
        write_full_weights(path, full_state)


def resume_run(run_dir: Path, resume_from: str | None, restore: Callable, accelerator, is_main: bool,
               load: Callable[[Path], dict] | None = None) -> bool:
    """Restore (`restore(path, load(path))`; `load`: `load_checkpoint` of this process's files) the newest intact
    checkpoint of `resume_from` ("auto": the run's own); damaged ones are named, moved aside and skipped
    (`resume_newest_intact`). Every process must resume the same checkpoint: if they chose differently (a per-process
    file damaged in a checkpoint without a manifest), all stop naming each one's choice. False when there is nothing
    to resume."""
    if not resume_from:
        return False
    candidates = list_checkpoints(run_dir) if resume_from == "auto" else [Path(resume_from)]
    if not candidates:
        return False  # nothing to resume: a fresh run
    used, damaged = resume_newest_intact(candidates, restore, warn=lambda m: warnings.warn(m, RuntimeWarning, stacklevel=4),
                                         load=load)
    ranks = Ranks(accelerator.process_index, accelerator.num_processes)
    chosen = ranks.gather(str(used))
    if len(set(chosen)) > 1:
        raise CheckpointDamaged("the processes resumed different checkpoints (" +
                                ", ".join(f"rank {r}: {c}" for r, c in enumerate(chosen)) +
                                "): a per-process file of the newer one is damaged; restore it or resume from the older one "
                                "with resume_from=<checkpoint dir>")
    accelerator.wait_for_everyone()
    if is_main:
        for bad in damaged:
            if bad.parent == checkpoint_dir(run_dir):
                warnings.warn(f"damaged checkpoint {bad.name} moved aside to {quarantine(bad).name}", RuntimeWarning, stacklevel=3)
        remove_stale(run_dir)
    accelerator.wait_for_everyone()
    return True
