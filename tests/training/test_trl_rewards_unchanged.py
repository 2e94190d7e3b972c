"""`trl.rewards` run unchanged in mmrl's trainer, from Python and from the command line, including the case TRL's
docs' Example 4 and `accuracy_reward` on an unparseable gold answer produce: samples no reward applies to (advantage
0, a warning, training goes on). Skipped where trl is not installed (it is no dependency of mmrl)."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

trl_rewards = pytest.importorskip("trl.rewards")

from mmrl.config import load_config  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402


def chat_rows(n=16):
    # half the gold answers are unparseable: accuracy_reward returns None for them (TRL: skip the example)
    return [{"prompt": [{"role": "user", "content": f"say a {i}"}], "solution": "4" if i % 2 == 0 else "no math here"}
            for i in range(n)]


def cfg(tmp_path, **kw):
    v = dict(family="causal_lm", method="grpo", max_steps=1, num_generations=4, per_device_train_batch_size=8,
             max_completion_length=6, learning_rate=1e-2, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0,
             report_to=["jsonl"], log_completions=True)
    v.update(kw)
    return load_config(None, v)


def test_every_trl_reward_runs_unchanged_from_python(tmp_path, caplog):
    rewards = [trl_rewards.accuracy_reward, trl_rewards.think_format_reward, trl_rewards.reasoning_accuracy_reward,
               trl_rewards.get_repetition_penalty_reward(ngram_size=2), trl_rewards.get_soft_overlong_punishment(6, 2),
               trl_rewards.get_cosine_scaled_reward(max_len=6)]
    last = Trainer(cfg(tmp_path), rewards, policy=adapter_class("causal_lm").tiny(seed=0), dataset=chat_rows()).train()
    for name in ("accuracy_reward", "think_format_reward", "reasoning_accuracy_reward"):
        assert f"rewards/{name}/mean" in last, name
    rows = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all("gold_parsed" in r and "answer_parsed" in r for r in rows)  # the rewards' log_extra columns reach the table


def test_accuracy_reward_alone_with_unparseable_gold_answers_trains_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="mmrl.rewards.combine"):
        last = Trainer(cfg(tmp_path), [trl_rewards.accuracy_reward], policy=adapter_class("causal_lm").tiny(seed=0),
                       dataset=chat_rows()).train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    skipped = [r for r in rows if r["rewards"]["accuracy_reward"] is None]
    assert skipped and all(r["advantage"] == 0.0 for r in skipped)
    assert any("every reward returned None" in r.getMessage() for r in caplog.records)
    assert last["rewards/accuracy_reward/mean"] == pytest.approx(0.0)  # over the parseable rows: no boxed answers


def test_trl_reward_by_import_path_from_the_command_line(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chat_rows()))
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "--task", "jsonl", "--dataset_path", str(data),
                        "--reward_funcs", "trl.rewards.accuracy_reward",
                        "--max_steps", "1", "--num_generations", "4", "--per_device_train_batch_size", "8",
                        "--max_completion_length", "6", "--output_dir", str(tmp_path / "run"), "--report_to", "jsonl",
                        "--progress_bar", "false", "--save_steps", "0"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "every reward returned None" in r.stderr  # the all-None case: warned, not fatal
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "rewards/accuracy_reward/mean" in last and "loss" in last


def test_a_reward_needing_a_missing_column_fails_at_start_up(tmp_path):
    from mmrl.data.loading import DatasetError

    rows = [{"prompt": [{"role": "user", "content": f"say a {i}"}]} for i in range(16)]  # no `solution`
    with pytest.raises(DatasetError, match=r"reward 'accuracy_reward' needs the dataset column\(s\) \['solution'\]"):
        Trainer(cfg(tmp_path), [trl_rewards.accuracy_reward], policy=adapter_class("causal_lm").tiny(seed=0), dataset=rows)
