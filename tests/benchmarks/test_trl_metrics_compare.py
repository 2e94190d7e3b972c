"""benchmarks/trl_metrics.py: the definitions it checks both trainers' reward metrics against, by hand (the full
TRL-against-mmrl run takes about a minute: `python benchmarks/trl_metrics.py`)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import trl_metrics  # noqa: E402


def test_definitions_by_hand():
    per = {"a": [1.0, 1.0, 0.0, 2.0], "b": [None, 1.0, None, None]}  # sample 0 scored by a only, sample 1 by both
    d = trl_metrics.definitions(per, group=2)
    totals = [1.0, 2.0, 0.0, 2.0]
    m = sum(totals) / 4
    assert d["reward"] == pytest.approx(m)
    assert d["reward_std"] == pytest.approx(math.sqrt(sum((t - m) ** 2 for t in totals) / 3))
    assert d["rewards/b/mean"] == 1.0 and math.isnan(d["rewards/b/std"])  # one scored sample: no std
    assert d["frac_reward_zero_std"] == 0.0
    assert trl_metrics.definitions({"a": [1.0, 1.0, None, None]}, group=2)["frac_reward_zero_std"] == 0.5


def test_compare_flags_a_metric_of_another_meaning():
    per = {"a": [0.0, 1.0, 2.0, 3.0]}
    good = trl_metrics.definitions(per, 2)
    assert good["reward_std"] == pytest.approx(math.sqrt(5 / 3))
    bad = dict(good, reward_std=math.sqrt(0.5))  # the mean of the group stds: not TRL's reward_std
    r = trl_metrics.compare(good, per, bad, per, 2)
    assert r["meaning"]["reward_std"]["trl"]["agrees"] and not r["meaning"]["reward_std"]["mmrl"]["agrees"]
    assert not r["all_agree"]
