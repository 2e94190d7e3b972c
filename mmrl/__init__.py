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

_EXPORTS = {"Trainer": "mmrl.training.trainer", "train": "mmrl.training.trainer", "TrainConfig": "mmrl.config.train_config",
            "load_config": "mmrl.config.train_config", "RewardSet": "mmrl.rewards"}
"""`from mmrl import Trainer, TrainConfig` (TRL's `from trl import GRPOTrainer, GRPOConfig`), imported on first use so
that `import mmrl` stays light."""

__all__ = ["Trainer", "TrainConfig", "load_config", "RewardSet", "train", "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mmrl' has no attribute {name!r}")
