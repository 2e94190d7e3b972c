"""group_advantages against a loop reference, hand-computed cases, edge cases (docs/algorithms.md section 1)."""
import math

import pytest
import torch

from mmrl.algorithms import ADVANTAGES, UnknownNameError, group_advantages


def loop_advantages(rewards, group_size, scale, eps=1e-6):
    r = [float(x) for x in rewards]
    n = len(r)
    batch_mean = sum(r) / n
    batch_std = math.sqrt(sum((x - batch_mean) ** 2 for x in r) / (n - 1))
    out = []
    for g in range(n // group_size):
        grp = r[g * group_size : (g + 1) * group_size]
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1))
        for x in grp:
            if max(grp) == min(grp):
                out.append(0.0)
            elif scale == "group":
                out.append((x - mean) / (std + eps))
            elif scale == "batch":
                out.append((x - mean) / (batch_std + eps))
            else:
                out.append(x - mean)
    return torch.tensor(out)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("n_groups,group_size", [(1, 2), (3, 4), (5, 8), (2, 16)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference(scale, n_groups, group_size, seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(n_groups * group_size, generator=g)
    if seed == 2:  # discrete rewards with some all-equal groups
        rewards = torch.randint(0, 2, (n_groups * group_size,), generator=g).float()
    got = group_advantages(rewards, group_size, scale=scale)
    torch.testing.assert_close(got, loop_advantages(rewards.tolist(), group_size, scale), atol=1e-5, rtol=1e-5)


def test_hand_computed():
    # group 1: rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735
    # A = +-0.5 / 0.57735 = +-0.866025
    # group 2: rewards [3, 1]: mean 2, std sqrt((1 + 1) / 1) = 1.41421 -> A = +-0.707107
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(group_advantages(r, 4), torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-5, rtol=0)
    torch.testing.assert_close(group_advantages(torch.tensor([3.0, 1.0]), 2), torch.tensor([0.707107, -0.707107]), atol=1e-5, rtol=0)
    # Dr.GRPO / d1: no std -> [0.5, -0.5, -0.5, 0.5]
    torch.testing.assert_close(group_advantages(r, 4, scale="none"), torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_all_equal_rewards_give_exact_zero():
    for value in [0.0, 0.1, 1.0 / 3.0, 7.25, -2.0]:
        r = torch.full((6,), value)
        for scale in ["group", "batch", "none"]:
            a = group_advantages(r, 3, scale=scale)
            assert torch.equal(a, torch.zeros(6)), (value, scale, a)
    # one equal group beside a varied one
    a = group_advantages(torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 2.0]), 3)
    assert torch.equal(a[:3], torch.zeros(3)) and torch.isfinite(a).all()


def test_group_size_errors():
    with pytest.raises(ValueError, match=r"\(10\).*group_size \(4\)"):
        group_advantages(torch.zeros(10), 4)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages(torch.tensor([0.0, float("nan")]), 2)


def test_unknown_scale_lists_valid_names():
    with pytest.raises(UnknownNameError, match=r"'median'.*\['batch', 'group', 'none'\]"):
        group_advantages(torch.zeros(4), 2, scale="median")
    assert set(ADVANTAGES) == {"group", "batch", "none"}
