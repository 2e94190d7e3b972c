"""The `tiny-world:NAME` model source (`mmrl.core.registry.MODEL_SOURCES`) and its pre-training optimizer state
(`OPTIMIZER_STATES`), added by `mmrl.tiny_world.register()`."""
from __future__ import annotations

from pathlib import Path

from mmrl.checkpointing.optimizer_state import OPTIMIZER_FILE
from mmrl.core.registry import MODEL_SOURCES, OPTIMIZER_STATES
from mmrl.tiny_world.models import cache_root, load_base_policy, model_dir, spec_for

OPTIMIZER_STATE_FAMILIES = ("masked_diffusion", "causal_lm")
"""The tiny-world families whose base build saves its final AdamW state (their loops in `mmrl.tiny_world.pretrain`
take `keep_optimizer`)."""

_BUILD_MISSING = {"on": False}


def register_sources(*, build_missing: bool = False) -> None:
    """Add the source; `build_missing` (sticky for the process) pre-trains a missing model on first use."""
    _BUILD_MISSING["on"] = _BUILD_MISSING["on"] or build_missing
    MODEL_SOURCES["tiny-world"] = load_registered_model
    OPTIMIZER_STATES["tiny-world"] = base_optimizer_file


def load_registered_model(name: str, family: str | None = None):
    """The cached base model `name` as a policy; a model not built yet raises unless `build_missing` was asked for
    (no pre-training hidden inside `Trainer.__init__`)."""
    spec_for(name)  # an unknown name raises and lists the valid ones
    if not _BUILD_MISSING["on"] and not (model_dir(name) / "tiny_spec.json").is_file():
        raise FileNotFoundError(
            f"tiny-world model {name!r} is not built yet (cache: {model_dir(name)}); build it with `mmrl pretrain-tiny "
            f"{name}` (about a minute on 2 cores), or call mmrl.tiny_world.register(build_missing=True) to build it on "
            "first use (the mmrl command does)")
    return load_base_policy(name, family=family)


def base_optimizer_file(name: str) -> Path:
    """The pre-training AdamW state file (`OPTIMIZER_FILE`) of the tiny-world base `name`. A cached base without it
    (built before bases kept their optimizer state) raises a one-line FileNotFoundError naming the base and the
    command that rebuilds it (same weights, same digest: `weights_digest` leaves the file out); a base of a family
    that keeps none raises ValueError; a base not built yet is built with the file, so its path is returned as is."""
    family = spec_for(name).family
    if family not in OPTIMIZER_STATE_FAMILIES:
        raise ValueError(f"init_optimizer_from_base: the {family} base {name!r} keeps no optimizer state (only the "
                         f"{', '.join(OPTIMIZER_STATE_FAMILIES)} builds save it)")
    folder = model_dir(name)
    path = folder / OPTIMIZER_FILE
    if (folder / "tiny_spec.json").is_file() and not path.is_file():
        raise FileNotFoundError(
            f"init_optimizer_from_base: the cached base {name!r} ({folder}) has no {OPTIMIZER_FILE} (built before bases kept "
            f"their AdamW state); rebuild it with `MMRL_CACHE={cache_root().parent} mmrl pretrain-tiny --force --no-eval {name}` "
            "(same weights and digest)")
    return path
