"""The config: YAML + overrides, method defaults, field docs, presets, and bad values caught before any model loads."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.config.train_config import METHOD_DEFAULTS, ConfigError, TrainConfig, field_docs, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_has_a_docstring():
    names = [f.name for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")]
    docs = field_docs()
    missing = [n for n in names if not docs.get(n)]
    assert not missing, missing


def test_yaml_overrides_and_method_defaults(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("method: dapo\nnum_generations: 4\nper_device_train_batch_size: 8\nepsilon_high: 0.3\n")
    cfg = load_config(p, ["learning_rate=3e-6", "reward_funcs=[gsm8k,gsm8k_accuracy]", "dynamic_sampling=false"])
    assert cfg.learning_rate == 3e-6 and isinstance(cfg.learning_rate, float)
    assert cfg.reward_funcs == ["gsm8k", "gsm8k_accuracy"]
    assert cfg.epsilon_high == 0.3  # explicit beats the method default 0.28
    assert cfg.dynamic_sampling is False  # explicit beats the method default True
    assert cfg.loss_type == "dapo" and cfg.overlong_penalty is True  # method defaults fill the rest
    assert load_config(None, ["method=dr_grpo"]).scale_rewards == "none"
    from mmrl.methods import METHODS

    # every registered method has its defaults, and no defaults name a method that does not exist
    assert set(METHOD_DEFAULTS) == set(METHODS) and len(METHODS) >= 9  # every registered method has its defaults


def test_base_preset_inheritance(tmp_path):
    (tmp_path / "base.yaml").write_text("method: dmpo\nfamily: masked_diffusion\nmax_completion_length: 64\nblock_length: 16\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\ntask: countdown\ndmpo_baseline: group\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.method, cfg.family, cfg.task, cfg.dmpo_baseline, cfg.num_iterations) == ("dmpo", "masked_diffusion", "countdown", "group", 8)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml")))
def test_every_preset_validates(path):
    cfg = load_config(ROOT / path)
    assert cfg.method and cfg.family


@pytest.mark.parametrize("override,needle", [
    ("method=ppo", "method='ppo' is not allowed; choose one of ['grpo', 'dapo', 'dr_grpo', 'diffu_grpo', 'gcpo', 'stage', 'dgpo', 'dmpo', 'gspo']"),
    ("family=rnn", "family='rnn' is not allowed; choose one of ['causal_lm', 'vlm', 'janus', 'masked_diffusion', 'masked_image']"),
    ("learning_rate=-1e-5", "learning_rate=-1e-05 must be > 0"),
    ("num_generations=1", "num_generations=1: a group needs at least 2 responses"),
    ("temperature=0", "temperature=0.0 must be > 0 for the causal_lm family"),
    ("reward_funcs=[gsm8k,nope]", "reward_funcs: unknown rewards ['nope']; valid:"),
    ("loss_type=sum", "loss_type='sum' is not allowed"),
    ("dmpo_num_copies=3", "must be even (antithetic pairs)"),
])
def test_bad_values_name_field_value_and_allowed(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_batch_must_hold_whole_groups():
    with pytest.raises(ConfigError, match=r"per_device_train_batch_size x gradient_accumulation_steps = 6 .* not a multiple of num_generations=4"):
        load_config(None, ["per_device_train_batch_size=3", "gradient_accumulation_steps=2", "num_generations=4"])


def test_block_length_must_divide_generation_length():
    with pytest.raises(ConfigError, match=r"block_length=12 does not divide max_completion_length=32"):
        load_config(None, ["family=masked_diffusion", "max_completion_length=32", "block_length=12"])


def test_unknown_key_lists_valid_keys_and_suggests():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["num_generation=4"])
    msg = str(e.value)
    assert "unknown config key 'num_generation' (did you mean num_generations" in msg and "valid keys:" in msg and "learning_rate" in msg


def test_type_errors():
    with pytest.raises(ConfigError, match=r"num_generations='four': expected int"):
        load_config(None, {"num_generations": "four"})
    with pytest.raises(ConfigError, match="expected"):
        load_config(None, {"use_peft": "maybe"})


def test_cli_rejects_bad_config_before_loading_any_model(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "method=dmpo", "family=masked_diffusion", "block_length=5",
                          "model_name_or_path=/does/not/exist", f"output_dir={tmp_path}"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "block_length=5 does not divide max_completion_length=256" in out.stderr
    assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "--help-config"], capture_output=True, text=True, check=True)
    assert "num_generations (default 8):" in out.stdout


def test_interval_rules_read_as_written():
    from mmrl.config.train_config import Interval

    cfg = TrainConfig(max_completion_length=64)
    cases = [("[0, 1)", "in [0, 1)", {0: True, 0.5: True, 1: False, -0.01: False}),
             ("(0, 1]", "in (0, 1]", {0: False, 1: True}),
             ("(0, inf)", "> 0", {0: False, 1e-12: True, 1e30: True}),
             ("[1, inf)", ">= 1", {1: True, 0: False}),
             ("[1, max_completion_length]", "in [1, max_completion_length=64]", {64: True, 65: False, 1: True})]
    for text, rule, values in cases:
        interval = Interval(text)
        assert interval.rule(cfg) == rule
        assert {v: interval.contains(v, cfg) for v in values} == values, text
    with pytest.raises(ValueError, match="not an interval"):
        Interval("0..1")


def _just_outside(interval, cfg):
    """A value just outside `interval`: the open bound itself, or one step past a closed one."""
    lo, hi = interval._bound(interval.lo, cfg), interval._bound(interval.hi, cfg)
    if lo != float("-inf"):
        return lo if not interval.lo_closed else lo - 1
    return hi if not interval.hi_closed else hi + 1


def test_every_declared_range_and_choice_is_checked():
    """Each field's metadata is the rule: a value just outside its range (or not among its choices) is refused with
    the field and the value named, and the default is inside."""
    base = TrainConfig()
    ranged = {f.name: f.metadata["range"] for f in dataclasses.fields(TrainConfig) if "range" in f.metadata}
    chosen = [f.name for f in dataclasses.fields(TrainConfig) if "choices" in f.metadata]
    assert len(ranged) >= 40 and len(chosen) >= 15
    for name, interval in ranged.items():
        default = getattr(base, name)
        assert default is None or interval.contains(default, base), name
        bad = _just_outside(interval, base)
        bad = int(bad) if typing_is_int(name) else float(bad)
        with pytest.raises(ConfigError) as e:
            load_config(None, {name: bad})
        assert f"{name}={bad}" in str(e.value), (name, str(e.value))
    for name in chosen:
        with pytest.raises(ConfigError, match=rf"{name}='no-such-value' is not allowed; choose one of \["):
            load_config(None, {name: "no-such-value"})


def typing_is_int(name):
    import typing

    tp = typing.get_type_hints(TrainConfig)[name]
    return tp is int or int in typing.get_args(tp) and float not in typing.get_args(tp)


def test_fields_given_together_are_reported_together():
    with pytest.raises(ConfigError) as e:
        load_config(None, {"lora_dropout": 1.0})
    assert "lora_r=16 (>= 1), lora_alpha=32 (> 0), lora_dropout=1.0 (in [0, 1))" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, {"save_total_limit": 0})
    assert "save_steps=50 (>= 0), save_total_limit=0 (>= 1), credit_steps=0 (>= 0)" in str(e.value)


def test_method_defaults_need_no_patched_constructor():
    assert "__init__" in vars(TrainConfig) and TrainConfig.__init__.__qualname__ == "TrainConfig.__init__"
    cfg = TrainConfig(method="dmpo", num_iterations=2)
    assert (cfg.num_iterations, cfg.max_grad_norm, cfg._explicit) == (2, 0.2, frozenset({"method", "num_iterations"}))
