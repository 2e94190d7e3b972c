"""Gradient checkpointing for every family through transformers' `gradient_checkpointing_enable` (named
`activation_checkpointing_enable` from transformers 5.24).

transformers recomputes a layer's activations only when that layer is in training mode
(`GradientCheckpointingLayer.__call__`: `self.gradient_checkpointing and self.training`). mmrl keeps the policy in
eval mode so that dropout never runs (the importance ratio must be exactly 1 at the first inner step); so the
trainer switches on the `training` flag of the checkpointed layers alone, and only around the gradient forwards
(`active`). Dropout modules inside them keep their own flag, off.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from mmrl.models.base import is_peft_model, unwrap


def _hf_models(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformers `PreTrainedModel`s inside an adapter's model (the outermost ones)."""
    from transformers import PreTrainedModel

    root = unwrap(model)
    if is_peft_model(root):
        root = root.get_base_model()
    if isinstance(root, PreTrainedModel):
        return [root]
    found: list[torch.nn.Module] = []
    for m in root.modules():
        if isinstance(m, PreTrainedModel) and not any(m in f.modules() for f in found):
            found.append(m)
    return found


def enable(model: torch.nn.Module) -> None:
    """Turn on activation recomputation in every transformers model of `model`; a model class that does not
    support it is an error naming the class."""
    models = _hf_models(model)
    if not models:
        raise ValueError(f"gradient_checkpointing=true: {type(unwrap(model)).__name__} holds no transformers model")
    for m in models:
        if not getattr(m, "supports_gradient_checkpointing", False):
            raise ValueError(f"gradient_checkpointing=true: {type(m).__name__} does not support gradient checkpointing "
                             "(supports_gradient_checkpointing is False); set gradient_checkpointing=false")
        # non-reentrant checkpointing needs no input that requires grad (LoRA freezes the embeddings);
        # transformers >= 5.24 names it activation_checkpointing_enable (the old name warns, and goes in v6)
        kwargs = {"use_reentrant": False}
        if hasattr(m, "activation_checkpointing_enable"):
            m.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers whose activations are recomputed (empty when checkpointing is off)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in unwrap(model).modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]


@contextmanager
def active(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, checkpointed layers recompute their activations (their own `training` flag on; nothing
    else changes mode). A no-op when checkpointing is off."""
    layers = [m for m in checkpointed_layers(model) if not m.training]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False
