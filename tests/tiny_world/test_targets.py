"""Rollouts-to-target (`mmrl.tiny_world.targets`): hand-computed curves."""
import pytest

from mmrl.tiny_world.targets import TargetHit, batches_curve, mean_curve, rollouts_to_target


def test_batches_curve_divides_steps_by_f():
    # F = 4: evaluations after steps 8, 20, 60 have seen 2, 5, 15 rollout batches; step 0 is the base
    assert batches_curve([(0, 0.1), (8, 0.2), (20, 0.3), (60, 0.4)], 4) == [(0, 0.1), (2, 0.2), (5, 0.3), (15, 0.4)]
    # an evaluation inside a batch's steps counts the batch it started: step 9 at F = 4 is in the third batch
    assert batches_curve([(9, 0.5)], 4) == [(3, 0.5)]
    with pytest.raises(ValueError, match="F"):
        batches_curve([(1, 0.1)], 0)


def test_first_point_reaching_the_target():
    curve = [(0, 0.16), (5, 0.15), (10, 0.18), (15, 0.17), (20, 0.19)]
    # 0.175: first reached at 10 batches (0.18), not at 20 although 0.17 at 15 lies below again
    assert rollouts_to_target(curve, 0.175, 128, 30) == TargetHit(10, 1280, True)
    # exactly equal counts as reached; unsorted input is sorted first
    assert rollouts_to_target(list(reversed(curve)), 0.19, 128, 30) == TargetHit(20, 2560, True)
    # the base already at the target: 0 rollouts
    assert rollouts_to_target(curve, 0.16, 128, 30) == TargetHit(0, 0, True)


def test_never_reached_is_censored_at_the_budget():
    assert rollouts_to_target([(0, 0.1), (5, 0.12), (15, 0.13)], 0.2, 128, 15) == TargetHit(15, 1920, False)
    with pytest.raises(ValueError):
        rollouts_to_target([], 0.2, 128, 15)


def test_mean_curve_pointwise_and_same_grid_only():
    assert mean_curve([[(5, 0.1), (10, 0.3)], [(5, 0.2), (10, 0.5)]]) == [(5, pytest.approx(0.15)), (10, pytest.approx(0.4))]
    with pytest.raises(ValueError, match="grids"):
        mean_curve([[(5, 0.1)], [(6, 0.1)]])
