"""The optimizer and learning-rate schedule of a run: `mmrl.core.optim` (on the ground floor, so that
`TrainConfig.validate` can check the schedule without importing the training room), under its first import path."""
from mmrl.core.optim import OPTIMIZERS, build_optimizer, build_scheduler, check_schedule, warmup_step_count

__all__ = ["OPTIMIZERS", "build_optimizer", "build_scheduler", "check_schedule", "warmup_step_count"]
