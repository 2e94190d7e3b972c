"""TRL's behaviour and meanings for what a TRL user reads off a run: samples no reward applies to (advantage 0, a
warning), `reward_std` (the batch std), the clip extremes (over completions), per-reward means under
`on_reward_error=drop`, `rewards/dropped` (a count), and `log_extra` columns in the completions table. Reference
values are recomputed by hand from the logged rewards (TRL 1.16 `GRPOTrainer._generate_and_score_completions`)."""
from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from mmrl.algorithms import group_advantages, policy_loss
from mmrl.config.train_config import load_config
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for


def cfg(tmp_path, **kw):
    v = dict(family="causal_lm", method="grpo", max_steps=1, num_generations=4, per_device_train_batch_size=8,
             max_completion_length=6, learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
             report_to=["jsonl"], log_completions=True)
    v.update(kw)
    return load_config(None, v)


def rows_of(tmp_path):
    return [json.loads(x) for x in (tmp_path / "completions.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------ advantages of unscorable

@pytest.mark.parametrize("scale", ["group", "none", "batch"])
def test_unscorable_samples_are_left_out_of_their_group_and_get_zero(scale):
    r = torch.tensor([1.0, 0.0, 5.0, 2.0, 3.0, 3.0, 9.0, 1.0])
    ok = torch.tensor([True, True, False, True, True, True, True, False])
    adv = group_advantages(r, 4, scale=scale, scorable=ok)
    assert adv[2] == 0 and adv[7] == 0
    # by hand: group 1 is {1, 0, 2}, group 2 {3, 3, 9}; the batch std is over the six scored rewards
    g1, g2 = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([3.0, 3.0, 9.0])
    den = {"group": (g1.std(), g2.std()), "none": (1.0, 1.0),
           "batch": (torch.tensor([1.0, 0, 2, 3, 3, 9]).std(),) * 2}[scale]
    want1 = (g1 - g1.mean()) / (den[0] + (1e-6 if scale != "none" else 0))
    want2 = (g2 - g2.mean()) / (den[1] + (1e-6 if scale != "none" else 0))
    assert adv[[0, 1, 3]].tolist() == pytest.approx(want1.tolist(), abs=1e-5)
    assert adv[[4, 5, 6]].tolist() == pytest.approx(want2.tolist(), abs=1e-5)
    # all scorable: exactly the unmasked function
    assert torch.equal(group_advantages(r, 4, scale=scale, scorable=torch.ones(8, dtype=torch.bool)),
                       group_advantages(r, 4, scale=scale))


def test_a_group_with_one_scorable_sample_has_no_signal():
    r = torch.tensor([1.0, 7.0, 3.0, 2.0])
    adv = group_advantages(r, 4, scale="group", scorable=torch.tensor([False, True, False, False]))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def trl_example_4(completions, ground_truth=None, **kwargs):
    """TRL docs, "Using a reward function for a subset of tasks" (Example 4 shape): None where it does not apply."""
    return [None if gt is None else float(len(c) % 2) for c, gt in zip(completions, ground_truth)]


def test_samples_no_reward_applies_to_train_with_advantage_zero_and_a_warning(tmp_path, caplog):
    data = [{"prompt": f"say a {i}", "ground_truth": None if i % 2 else "x"} for i in range(16)]
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards.combine"):
        last = Trainer(cfg(tmp_path), policy=adapter_class("causal_lm").tiny(seed=0), dataset=data,
                       reward_funcs=[trl_example_4]).train()
    assert math.isfinite(last["loss"])
    rows = rows_of(tmp_path)
    none_rows = [r for r in rows if r["rewards"]["trl_example_4"] is None]
    assert none_rows and all(r["advantage"] == 0.0 for r in none_rows)
    warned = [r.getMessage() for r in caplog.records if "every reward returned None" in r.getMessage()]
    assert warned and none_rows[0]["prompt"] in warned[0]
    scored = torch.tensor([r["reward"] for r in rows if r["rewards"]["trl_example_4"] is not None])
    assert last["reward"] == pytest.approx(float(scored.mean()))  # unscorable rows are not averaged in (TRL)


# ------------------------------------------------------------------------------------------------ reward_std

def test_reward_std_is_the_std_of_the_whole_batch(tmp_path):
    def by_length(completions, **kw):
        return [float(len(c)) for c in completions]

    last = Trainer(cfg(tmp_path), policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                   reward_funcs=[by_length]).train()
    r = torch.tensor([row["reward"] for row in rows_of(tmp_path)], dtype=torch.float64)  # [8]
    assert last["reward_std"] == pytest.approx(float(r.std()), rel=1e-5)  # TRL: nanstd(rewards), n - 1
    mean_of_group_stds = float(r.view(-1, 4).std(-1).mean())
    if abs(mean_of_group_stds - float(r.std())) > 1e-6:  # the old meaning would fail here
        assert last["reward_std"] != pytest.approx(mean_of_group_stds, rel=1e-6)
    assert last["rewards/by_length/std"] == pytest.approx(float(r.std()), rel=1e-5)


# --------------------------------------------------------------------------------------------- clip extremes

def test_clip_extremes_are_over_completions():
    # three completions: token clip fractions (low) 1/2, 0, 1 and (high) 0, 1/2, 0, by construction
    logp = torch.zeros(3, 2)
    old = torch.tensor([[1.0, 0.0], [0.0, -1.0], [1.0, 1.0]])  # ratio e^-1 (below 0.8) or e^1 (above 1.2) or 1
    adv = torch.tensor([-1.0, 1.0, -1.0])
    mask = torch.ones(3, 2, dtype=torch.bool)
    _, m = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    assert float(m["clip_ratio/low_mean"]) == pytest.approx(3 / 6)
    assert float(m["clip_ratio/low_min"]) == 0.0  # completion 2 has no low-clipped token
    assert float(m["clip_ratio/high_max"]) == pytest.approx(0.5)  # completion 2: half its tokens
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(1 / 6)


# ---------------------------------------------------------------------------- drop mode: means and the count

def test_per_reward_means_are_finite_and_dropped_is_a_count_under_drop(tmp_path):
    calls = {"n": 0}

    def flaky(completions, **kw):  # first call: the first group fails; second call (the refill): every sample fails
        calls["n"] += 1
        if calls["n"] == 2:
            return [float("nan")] * len(completions)
        return [float("nan") if calls["n"] == 1 and i < 4 else 1.0 for i in range(len(completions))]

    last = Trainer(cfg(tmp_path, on_reward_error="drop", dynamic_sampling_max_tries=4),
                   policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                   reward_funcs=[flaky]).train()
    assert calls["n"] == 3
    assert last["rewards/flaky/mean"] == 1.0  # was NaN: the all-dropped refill try averaged in
    assert last["rewards/dropped"] == 8.0  # 4 samples of the first try + 4 of the refill (a count, not a mean)
    assert last["rewards/dropped_groups"] == 2
    assert read_metrics(tmp_path)[-1]["rewards/dropped"] == 8.0


# ------------------------------------------------------------------------------------- log_extra in the table

def test_log_extra_columns_are_written_to_the_completions_table(tmp_path):
    def with_answers(completions, answer, log_extra=None, **kw):  # TRL's accuracy-reward pattern
        log_extra("golden_answer", list(answer))
        log_extra("extracted_answer", [c[:2] for c in completions])
        return [{"score": 1.0, "length": len(c)} for c in completions]

    data = [{"prompt": f"say a {i}", "answer": f"gold{i}"} for i in range(16)]
    Trainer(cfg(tmp_path), policy=adapter_class("causal_lm").tiny(seed=0), dataset=data,
            reward_funcs=[with_answers]).train()
    rows = rows_of(tmp_path)
    assert len(rows) == 8
    for r in rows:
        assert r["golden_answer"] == "gold" + r["prompt"].split()[-1]
        assert r["extracted_answer"] == r["completion"][:2]
        assert r["with_answers/length"] == len(r["completion"])
    from mmrl.reporting.completions import markdown_table

    head = markdown_table(rows).splitlines()[0]
    assert "golden_answer" in head and "extracted_answer" in head
