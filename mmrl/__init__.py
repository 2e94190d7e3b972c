"""mmrl: reinforcement learning for generative models (Janus-Pro, Qwen2.5-VL, LLaDA/Dream, causal LMs).

Methods: GCPO, DGPO, DMPO beside GRPO, DAPO, Dr.GRPO and diffu-GRPO, all through one adapter protocol.

    from mmrl import Trainer, TrainConfig      # mmrl.training.trainer.Trainer, mmrl.config.train_config.TrainConfig

The entry points load on first use, so `import mmrl` stays light (no torch).
"""
import os as _os
import sys as _sys

# With OMP's default busy-waiting, any second process on the same cores slows CPU training ~10x
# (docs/sources.md, "CPU measurements behind defaults"). It only takes effect if set before torch is first imported.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

_ENTRY_POINTS = {"Trainer": "mmrl.training.trainer", "train": "mmrl.training.trainer",
                 "TrainConfig": "mmrl.config.train_config", "load_config": "mmrl.config.train_config"}
"""Public name -> the module that defines it (docs/design.md, "Layers")."""
__all__ = ["Trainer", "TrainConfig", "__version__", "load_config", "train"]


def __getattr__(name: str):
    if name in _ENTRY_POINTS:
        import importlib

        return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(f"module 'mmrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ENTRY_POINTS))
