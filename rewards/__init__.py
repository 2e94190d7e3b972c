"""Reward functions and reward models (installed as `mmrl.rewards`), registered by name in `REWARDS`.

A reward is TRL's reward function `fn(prompts, completions, **columns) -> list[float | None]` (a dict with a "score"
key per sample is accepted too; its other keys are logged). `RewardSet` combines named rewards with weights.

Text: gsm8k (d1's five parts summed) and its parts gsm8k_xmlcount / gsm8k_soft_format / gsm8k_strict_format /
gsm8k_int / gsm8k_correctness, gsm8k_accuracy, math500 (= math500_correctness + math500_format), boxed_accuracy,
countdown, sudoku. Images: clip_score, geneval, geneval_strict, geneval_partial. Remote: http (a reward server,
`mmrl.rewards.http` documents the protocol).
"""
from mmrl.core.registry import REWARDS
from mmrl.rewards import countdown, geneval, http, image_clip, sudoku, text_math  # noqa: F401  (register the rewards)
from mmrl.rewards.combine import RewardError, RewardOutput, RewardSet, RewardTimeout, RewardUnavailable, build_reward

__all__ = ["REWARDS", "RewardError", "RewardOutput", "RewardSet", "RewardTimeout", "RewardUnavailable", "build_reward"]
