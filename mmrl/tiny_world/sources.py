"""The `tiny-world:NAME` model source (`mmrl.core.registry.MODEL_SOURCES`), added by `mmrl.tiny_world.register()`."""
from __future__ import annotations

from mmrl.core.registry import MODEL_SOURCES
from mmrl.tiny_world.models import load_base_policy, model_dir, spec_for

_BUILD_MISSING = {"on": False}


def register_sources(*, build_missing: bool = False) -> None:
    """Add the source; `build_missing` (sticky for the process) pre-trains a missing model on first use."""
    _BUILD_MISSING["on"] = _BUILD_MISSING["on"] or build_missing
    MODEL_SOURCES["tiny-world"] = load_registered_model


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
