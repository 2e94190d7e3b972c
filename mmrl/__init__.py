"""mmrl: reinforcement learning for generative models (Janus-Pro, Qwen2.5-VL, LLaDA/Dream, causal LMs).

Methods: GCPO, DGPO, DMPO beside GRPO, DAPO, Dr.GRPO and diffu-GRPO, all through one adapter protocol.
"""
import os as _os
import sys as _sys

# With OMP's default busy-waiting, any second process on the same cores slows CPU training ~10x
# (docs/sources.md, "CPU measurements behind defaults"). It only takes effect if set before torch is first imported.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
