"""Bad input at run time: missing model path, failing rewards (stop or drop), dynamic sampling that cannot fill a
batch, non-finite losses; each a clear error or documented behaviour, and no checkpoint lost."""
import json

import pytest
import torch

from mmrl.checkpointing.checkpoint import latest_checkpoint, load_checkpoint
from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.rewards.combine import RewardError
from mmrl.training.trainer import Trainer, TrainingError
from tiny_world_fixtures import dataset_for, vowel_reward


def cfg_for(tmp_path, **kw):
    values = dict(method="grpo", family="causal_lm", max_steps=3, num_generations=4, per_device_train_batch_size=8,
                  max_completion_length=8, learning_rate=1e-3, output_dir=str(tmp_path), progress_bar=False, save_steps=1)
    values.update(kw)
    return load_config(None, values)


def trainer(cfg, reward):
    return Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[reward])


def test_missing_model_path_names_it(tmp_path):
    cfg = cfg_for(tmp_path, model_name_or_path=str(tmp_path / "no-such-model"))
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        Trainer(cfg, dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])


def test_failing_reward_stops_with_name_and_sample_and_keeps_checkpoints(tmp_path):
    calls = {"n": 0}

    def flaky(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # third rollout batch: after checkpoints 1 and 2 were written
            raise RuntimeError("judge server down")
        return vowel_reward(prompts, completions)

    with pytest.raises(RewardError) as e:
        trainer(cfg_for(tmp_path), flaky).train()
    assert "flaky" in str(e.value) and "judge server down" in str(e.value)
    ck = latest_checkpoint(tmp_path)
    assert ck is not None and ck.name == "checkpoint-000002"
    assert load_checkpoint(ck)["state"]["step"] == 2


def test_nan_reward_stops_by_default(tmp_path):
    def nan_reward(prompts, completions, **kw):
        return [float("nan") if i == 5 else 0.5 for i in range(len(completions))]

    with pytest.raises(RewardError, match=r"nan_reward.*sample 5|sample 5.*nan_reward"):
        trainer(cfg_for(tmp_path), nan_reward).train()


def test_nan_reward_drop_option_drops_the_group_and_counts_it(tmp_path):
    def sometimes_nan(prompts, completions, **kw):
        vals = vowel_reward(prompts, completions)
        # every response to prompts numbered 0 mod 4 fails
        return [float("nan") if int(p.split()[-1]) % 4 == 0 else v for p, v in zip(prompts, vals)]

    t = trainer(cfg_for(tmp_path, on_reward_error="drop", max_steps=2), sometimes_nan)
    t.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("rewards/dropped_groups", 0) for r in records) >= 1
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    # the buffer is still a full batch of whole groups (refilled from new prompts)
    assert t.buffer.rollout.num_responses == 8
    assert all(int(p.split()[-1]) % 4 != 0 for p in t.buffer.rollout.prompts)


def test_dynamic_sampling_that_cannot_fill_a_batch(tmp_path):
    def constant(prompts, completions, **kw):
        return [1.0] * len(completions)

    with pytest.raises(TrainingError, match=r"dynamic sampling could not fill a batch.*dynamic_sampling_max_tries"):
        trainer(cfg_for(tmp_path, method="dapo", dynamic_sampling_max_tries=3), constant).train()


def test_dynamic_sampling_drops_zero_variance_groups(tmp_path):
    def half_constant(prompts, completions, **kw):
        # prompts whose number is even get equal rewards in the whole group
        return [1.0 if int(p.split()[-1]) % 2 == 0 else v for p, v in zip(prompts, vowel_reward(prompts, completions))]

    t = trainer(cfg_for(tmp_path, method="dapo", max_steps=1), half_constant)
    t.train()
    assert all(int(p.split()[-1]) % 2 == 1 for p in t.buffer.rollout.prompts)
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["dynamic_sampling/rollout_batches"] >= 2
    # the answers sampled over every try (the cost of the refills): each prompt drawn, one group of answers
    assert rec["dynamic_sampling/sampled_responses"] == t.stream.position * t.cfg.num_generations > t.buffer.rollout.num_responses


def test_nonfinite_loss_skips_then_stops(tmp_path):
    t = trainer(cfg_for(tmp_path, max_nonfinite_steps=2, max_steps=5, save_steps=0), vowel_reward)
    with torch.no_grad():
        for p in t.policy.model.parameters():
            p.fill_(float("nan"))
    with pytest.raises(TrainingError, match="2 optimizer steps in a row had a non-finite loss or gradient"):
        t.train()
