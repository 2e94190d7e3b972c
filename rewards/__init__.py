"""Reward functions and reward models (installed as `mmrl.rewards`); registered by name in `REWARDS`."""
from mmrl.algorithms.registry import REWARDS

__all__ = ["REWARDS"]
