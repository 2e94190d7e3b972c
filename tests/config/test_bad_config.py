"""Bad configuration values fail before any model (or dataset) is loaded, with a message naming the field, the value
and what is allowed (the issue's list: negative learning rate, zero temperature where sampling is needed, group size
1, block length not dividing the generation length, unknown keys; plus reward failure handling, NaN values, ranges)."""
import pytest

import mmrl.data.tasks
import mmrl.training.policy_factory
import mmrl.training.trainer
from mmrl.config.train_config import ConfigError, load_config


@pytest.mark.parametrize("values,needle", [
    ({"learning_rate": -1e-5}, "learning_rate=-1e-05 must be > 0"),
    ({"learning_rate": float("nan")}, "learning_rate=nan must be a finite number"),
    ({"max_grad_norm": float("nan")}, "max_grad_norm=nan must be a finite number"),
    ({"beta": float("inf")}, "beta=inf must be a finite number"),
    ({"temperature": 0}, "temperature=0.0 must be > 0 for the causal_lm family (sampling needs a positive temperature)"),
    ({"family": "vlm", "temperature": 0}, "temperature=0.0 must be > 0 for the vlm family"),
    ({"family": "janus", "temperature": 0}, "temperature=0.0 must be > 0 for the janus family"),
    ({"family": "masked_diffusion", "max_completion_length": 64, "temperature": 0},
     "temperature=0 with the 'low_confidence' sampler is greedy and deterministic: the num_generations responses of a "
     "prompt would be identical (all advantages 0); use temperature > 0, or a sampler that stays random at temperature 0: "
     "['random', 'random_order']"),
    ({"family": "masked_diffusion", "max_completion_length": 64, "temperature": 0, "sampler": "threshold"},
     "temperature=0 with the 'threshold' sampler is greedy"),
    ({"family": "masked_diffusion", "max_completion_length": 64, "temperature": -0.5}, "temperature=-0.5 must be >= 0 (0 = greedy)"),
    ({"num_generations": 1}, "num_generations=1: a group needs at least 2 responses (group-relative advantages); use >= 2"),
    ({"family": "masked_diffusion", "max_completion_length": 100, "block_length": 32},
     "block_length=32 does not divide max_completion_length=100; choose a divisor of 100"),
    ({"on_reward_error": "ignore"}, "on_reward_error='ignore' is not allowed; choose one of ['raise', 'drop']"),
    ({"reward_timeout": 0}, "reward_timeout=0.0 must be > 0 seconds (or null for no limit)"),
    ({"reward_retries": -1}, "reward_retries=-1 must be >= 0"),
    ({"reward_retry_backoff": -2}, "reward_retry_backoff=-2.0 must be >= 0 seconds"),
    ({"reward_funcs": ["http"], "reward_kwargs": {"http": 5}},
     "reward_kwargs: the configuration of each reward is a mapping of options, got {'http': 'int'}"),
    ({"reward_funcs": ["countdown"], "reward_kwargs": {"gsm8k": {}}},
     "reward_kwargs configures ['gsm8k'], which are not in reward_funcs=['countdown']"),
    ({"adam_beta2": 1.0}, "adam_beta2=1.0 must be in [0, 1)"),
    ({"adam_epsilon": 0}, "adam_epsilon=0.0 must be > 0"),
    ({"lora_dropout": 1.0}, "lora_dropout=1.0 (in [0, 1))"),
    ({"overlong_buffer_len": 0}, "overlong_buffer_len=0 must be in [1, max_completion_length=256] (or null)"),
    ({"eval_limit": 0}, "eval_limit=0 must be >= 1 (or null)"),
    ({"max_prompt_length": -3}, "max_prompt_length=-3 must be >= 1 (or null)"),
])
def test_bad_value_names_field_value_and_allowed(values, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, values)
    assert needle in str(e.value)


def test_unknown_key_names_it_and_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown config key 'reward_retry' \(did you mean reward_retries.*valid keys:"):
        load_config(None, {"reward_retry": 3})


def test_zero_temperature_is_fine_where_sampling_stays_random():
    cfg = load_config(None, {"family": "masked_diffusion", "max_completion_length": 64, "temperature": 0, "sampler": "random_order"})
    assert cfg.temperature == 0.0
    load_config(None, {"family": "masked_diffusion", "max_completion_length": 64, "temperature": 0,
                       "generation_kwargs": {"sampler": "random"}})


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        load_config(None, {"learning_rate": 0, "num_generations": 1, "reward_retries": -1})
    msg = str(e.value)
    assert msg.startswith("invalid configuration:") and all(s in msg for s in ("learning_rate=0", "num_generations=1", "reward_retries=-1"))


def test_trainer_rejects_bad_values_before_loading_data_or_model(monkeypatch, tmp_path):
    loaded = []
    monkeypatch.setattr(mmrl.training.policy_factory, "build_policy", lambda *a, **k: loaded.append("model"))
    monkeypatch.setattr(mmrl.training.trainer, "build_policy", lambda *a, **k: loaded.append("model"))
    monkeypatch.setattr(mmrl.data.tasks, "load_task", lambda *a, **k: loaded.append("task"))
    cfg = load_config(None, {"learning_rate": -1.0, "output_dir": str(tmp_path / "run")}, validate=False)
    with pytest.raises(ConfigError, match="learning_rate=-1.0 must be > 0"):
        mmrl.training.trainer.Trainer(cfg)
    assert loaded == [] and not (tmp_path / "run").exists()
