"""Model-family adapters (installed as `mmrl.models`): each implements the protocol of `mmrl.core.protocol.Policy`.

Families are looked up by name; adapter modules are imported only when used.
"""
from __future__ import annotations

import importlib

from mmrl.core.registry import UnknownNameError

FAMILIES: dict[str, str] = {
    "causal_lm": "mmrl.models.causal_lm:CausalLMAdapter",
    "vlm": "mmrl.models.vlm:VLMAdapter",
    "janus": "mmrl.models.janus:JanusAdapter",
    "masked_diffusion": "mmrl.models.masked_diffusion:MaskedDiffusionAdapter",
    "masked_image": "mmrl.models.masked_image:MaskedImageAdapter",
}
"""family name -> "module:AdapterClass"."""


def adapter_class(family: str) -> type:
    """The adapter class of a family; an unknown family raises and lists the valid ones."""
    if family not in FAMILIES:
        raise UnknownNameError(f"unknown model family {family!r}; valid families: {sorted(FAMILIES)}")
    module, cls = FAMILIES[family].split(":")
    return getattr(importlib.import_module(module), cls)


def tiny_factory(family: str):
    """The tiny random model factory of a family (`mmrl.models.tiny_configs`, imported on first use)."""
    adapter_class(family)  # an unknown family: the same error
    return importlib.import_module("mmrl.models.tiny_configs").FACTORIES[family]


def tiny_policy(family: str, **options):
    """A tiny random model of `family` as a policy (tests, `model_name_or_path: tiny`); options as `Adapter.tiny`."""
    return tiny_factory(family)(None, **options)


def load_policy(family: str, model_path: str, **options):
    """`adapter_class(family).from_pretrained(model_path, **options)`: a local checkpoint as a policy."""
    return adapter_class(family).from_pretrained(model_path, **options)
