"""Training methods, one module per family of methods, behind the `METHODS` registry (docs/design.md, "Methods").

- `policy_gradient`: GRPO, DAPO, Dr.GRPO, diffu-GRPO (one clipped surrogate; config defaults differ)
- `gcpo`: guidance-contrastive token weights on the policy-gradient family
- `stage`: STAGE's similarity-aware token masks (GCPO's T2I GRPO baseline)
- `dgpo`: distribution-guided token weights on the policy-gradient family
- `dmpo`: importance-weighted denoising (WDCE / WDDO)
- `gspo`: sequence-level ratio (the worked example of adding a method, docs/design.md)

Adding a method is one module here (a `Method` subclass registered under its name) imported below, plus its
defaults in `mmrl.config.train_config.METHOD_DEFAULTS`; the trainer does not change.
"""
from mmrl.methods.base import METHODS, LossOutput, Method, MicroBatch, behaviour_is_current
from mmrl.methods import policy_gradient, gcpo, stage, dgpo, dmpo, gspo  # noqa: F401, I001  (registration, in this order)


def method_class(name: str) -> type[Method]:
    """The `Method` subclass registered under `name`; an unknown name raises and lists the valid ones."""
    return METHODS[name]


__all__ = ["METHODS", "LossOutput", "Method", "MicroBatch", "behaviour_is_current", "method_class"]
