"""A TRL user's configuration: method defaults from Python as from YAML, TRL's command-line spellings and key names,
num_train_epochs, gradient checkpointing."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from mmrl.config.train_config import METHOD_DEFAULTS, ConfigError, TrainConfig, load_config
from mmrl.models import adapter_class
from mmrl.cli.train import parse
from mmrl.training.trainer import Trainer


@pytest.mark.parametrize("method", sorted(METHOD_DEFAULTS))
def test_python_constructor_applies_method_defaults_like_yaml(method, tmp_path):
    # a method that works on one family only (stage: janus) is checked with that family
    family = {"stage": "janus"}.get(method)
    extra = {} if family is None else {"family": family}
    (tmp_path / "c.yaml").write_text(f"method: {method}\n" + "".join(f"{k}: {v}\n" for k, v in extra.items()))
    from_python = TrainConfig(method=method, **extra)
    words = [f"method={method}", *(f"{k}={v}" for k, v in extra.items())]
    assert from_python == load_config(tmp_path / "c.yaml") == load_config(None, words)
    for key, value in METHOD_DEFAULTS[method].items():
        assert getattr(from_python, key) == value


def test_dapo_from_python_has_clip_higher_dynamic_sampling_overlong():
    cfg = TrainConfig(method="dapo")
    assert (cfg.epsilon_high, cfg.dynamic_sampling, cfg.overlong_penalty) == (0.28, True, True)
    # an explicit value wins, also when it equals the dataclass default
    cfg = TrainConfig(method="dapo", epsilon_high=None, dynamic_sampling=False)
    assert cfg.epsilon_high is None and cfg.dynamic_sampling is False and cfg.overlong_penalty is True
    # replace() with another method gets that method's defaults for the fields never given
    assert dataclasses.replace(TrainConfig(method="grpo"), method="dmpo").num_iterations == 8


def test_trl_key_names():
    cfg = load_config(None, {"bf16": True, "resume_from_checkpoint": True}, validate=False)
    assert cfg.mixed_precision == "bf16" and cfg.resume_from == "auto"
    assert load_config(None, {"fp16": "true"}, validate=False).mixed_precision == "fp16"
    assert load_config(None, {"bf16": False}, validate=False).mixed_precision == "no"
    assert load_config(None, {"resume_from_checkpoint": "/ck/x"}, validate=False).resume_from == "/ck/x"
    with pytest.raises(ConfigError, match="contradicts"):
        load_config(None, {"bf16": True, "mixed_precision": "fp16"}, validate=False)
    cfg = load_config(None, ["gradient_checkpointing=true", "log_completions=true", "num_train_epochs=2",
                             "chat_template_kwargs={enable_thinking: false}"])
    assert cfg.gradient_checkpointing and cfg.log_completions and cfg.num_train_epochs == 2.0
    assert cfg.chat_template_kwargs == {"enable_thinking": False}


def test_cli_spellings_are_parsed():
    """TRL's command line (transformers' HfArgumentParser) beside key=value words: the same values, typed."""
    path, values, own = parse(["--config", "x.yaml", "--max_steps", "2", "--bf16", "--use-peft", "false",
                               "--lr_scheduler_type=linear", "--reward_funcs", "a.b.c", "f.py:g", "seed=3", "--print-config"])
    assert path == "x.yaml" and own.print_config and not own.help_config
    assert values == {"max_steps": 2, "bf16": True, "use_peft": False, "lr_scheduler_type": "linear",
                      "reward_funcs": ["a.b.c", "f.py:g"], "seed": 3}
    assert parse(["--gradient_checkpointing", "--max_steps", "1"])[1] == {"gradient_checkpointing": True, "max_steps": 1}
    _, values, _ = parse(["--no_progress_bar", "--max_prompt_length", "null", "--reward_weights", "1", "2",
                          "--chat_template_kwargs", "{enable_thinking: false}", "--eval_split", "3"])
    words = ["progress_bar=false", "max_prompt_length=null", "reward_weights=[1, 2]",
             "chat_template_kwargs={enable_thinking: false}", "eval_split=3", "reward_funcs=[gsm8k, gsm8k_accuracy]"]
    assert load_config(None, {**values, "reward_funcs": ["gsm8k", "gsm8k_accuracy"]}) == load_config(None, words)
    cfg = load_config(None, words)
    assert (cfg.progress_bar, cfg.max_prompt_length, cfg.reward_weights, cfg.eval_split) == (False, None, [1.0, 2.0], 3.0)
    assert parse(["x.yaml", "max_steps=2"])[:2] == ("x.yaml", {"max_steps": 2})
    assert parse(["--bf16", "x.yaml", "--use_peft", "--seed", "1"])[:2] == ("x.yaml", {"bf16": True, "use_peft": True, "seed": 1})
    assert parse(["--bf16", "false", "x.yaml"])[:2] == ("x.yaml", {"bf16": False})
    with pytest.raises(ConfigError, match=r"argument --max_steps/--max-steps: invalid int value: 'x'"):
        parse(["--max_steps", "x"])
    with pytest.raises(ConfigError, match="unexpected argument 'b.yaml'"):
        parse(["a.yaml", "b.yaml"])


def test_cli_trl_spelling_gives_the_same_config(tmp_path, capsys):
    from mmrl.cli import main

    (tmp_path / "c.yaml").write_text("method: dapo\nfamily: causal_lm\n")

    def printed(*args):
        assert main(["train", *args, "--print-config"]) == 0
        return json.loads(capsys.readouterr().out)

    a = printed("--config", str(tmp_path / "c.yaml"), "--max_steps", "2", "--bf16", "--output_dir", "o")
    b = printed(str(tmp_path / "c.yaml"), "max_steps=2", "mixed_precision=bf16", "output_dir=o")
    assert a == b and a["max_steps"] == 2 and a["epsilon_high"] == 0.28
    assert main(["train", "--max_stepz", "2", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'max_stepz'" in err and "max_steps" in err


def test_num_train_epochs_sets_max_steps(tmp_path):
    from mmrl.training.epochs import steps_for_epochs

    assert steps_for_epochs(1, 16, 2, 1) == 8 and steps_for_epochs(1.5, 10, 4, 2) == 8  # ceil(3.75) = 4 rollouts x 2
    rows = [{"prompt": f"say a {i}"} for i in range(6)]
    cfg = load_config(None, dict(family="causal_lm", max_steps=-1, num_train_epochs=1, num_generations=2,
                                 per_device_train_batch_size=4, max_completion_length=4, output_dir=str(tmp_path),
                                 progress_bar=False, save_steps=0, report_to=["jsonl"]))
    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=rows,
                reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]])
    assert t.cfg.max_steps == 3  # 6 prompts, 2 per rollout batch
    t.train()
    assert t.step == 3 and t.stream.position == 6  # one pass over the data
    with pytest.raises(ConfigError, match="max_steps=-1 needs num_train_epochs"):
        load_config(None, {"max_steps": -1})


@pytest.mark.parametrize("family", ["causal_lm", "masked_diffusion", "vlm", "janus"])
def test_gradient_checkpointing_gives_the_same_gradients(tmp_path, family):
    """Recomputed activations give the same update: one step with and without checkpointing lands on the same
    weights, and checkpointing was really active (the layers' forward ran twice per micro-batch)."""
    from tiny_world_fixtures import dataset_for, reward_for

    from transformers.modeling_layers import GradientCheckpointingLayer

    from mmrl.training import grad_checkpointing

    def run(gc: bool, out):
        kw = dict(max_completion_length=8, block_length=4) if family == "masked_diffusion" else {}
        cfg = load_config(None, dict(family=family, method="grpo", max_steps=1, num_generations=2, per_device_train_batch_size=4,
                                     learning_rate=1e-2, output_dir=str(out), progress_bar=False, save_steps=0,
                                     report_to=["jsonl"], gradient_checkpointing=gc, max_completion_length=kw.get("max_completion_length", 6),
                                     **({"block_length": 4} if kw else {})))
        policy = adapter_class(family).tiny(seed=0)
        t = Trainer(cfg, policy=policy, dataset=dataset_for(family, 4), reward_funcs=[reward_for(family)])
        layers = grad_checkpointing.checkpointed_layers(policy.model)
        first = [m for m in policy.model.modules() if isinstance(m, GradientCheckpointingLayer)][-1]  # a decoder layer
        calls = []
        first.mlp.register_forward_pre_hook(lambda m, a: calls.append(1))  # inside the checkpointed forward
        t.train()
        return {k: v.detach().clone() for k, v in policy.unwrapped.state_dict().items()}, layers, len(calls)

    plain, no_layers, plain_calls = run(False, tmp_path / "a")
    ckpt, layers, ckpt_calls = run(True, tmp_path / "b")
    assert not no_layers and layers
    assert all(not m.training for m in layers)  # switched on only around the gradient forwards
    assert ckpt_calls == plain_calls + 1  # the one gradient micro-batch's layer ran again in the backward
    assert torch.is_grad_enabled()
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=0, atol=1e-6, msg=k)


def test_eval_reads_the_family_from_the_checkpoint(tmp_path, capsys):
    from mmrl.checkpointing.checkpoint import latest_checkpoint
    from mmrl.cli import main

    rows = [{"nums": [3, 4, 5], "target": 17}, {"nums": [2, 9, 7], "target": 25}]
    (tmp_path / "cd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, dict(family="masked_diffusion", method="dmpo", max_steps=1, num_generations=2, per_device_train_batch_size=2,
                                 max_completion_length=8, block_length=4, output_dir=str(tmp_path / "run"), progress_bar=False,
                                 report_to=["jsonl"], task="countdown", dataset_path=str(tmp_path / "cd.jsonl")))
    Trainer(cfg).train()
    ck = latest_checkpoint(tmp_path / "run")
    common = ["--task", "countdown", "--dataset-path", str(tmp_path / "cd.jsonl"), "--limit", "2", "--gen-length", "8",
              "--block-length", "4", "--steps", "4"]
    assert main(["eval", "--model", str(ck), *common]) == 0
    assert main(["eval", "--model", str(ck / "model"), *common, "--metric", "countdown3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("countdown: countdown_accuracy accuracy") and " on 2 rows" in out[-2]
    assert out[-1].startswith("countdown: countdown3 accuracy")
    assert main(["eval", "--model", str(ck), *common, "--metric", "nope"]) == 2
    plain = tmp_path / "plain"
    plain.mkdir()
    assert main(["eval", "--model", str(plain), *common]) == 2
    assert "pass --family" in capsys.readouterr().err


def test_every_hard_dependency_is_imported_and_fast_movers_are_bounded():
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    module_of = {"pyyaml": "yaml", "pillow": "PIL", "math-verify": "math_verify"}
    indirect = {"torchvision": "transformers' Qwen2-VL image processors", "tensorboard": "torch.utils.tensorboard"}
    source = "\n".join(p.read_text() for d in ("mmrl", "models", "rewards") for p in (root / d).rglob("*.py"))
    for dep in project["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower()
        mod = module_of.get(name, name.replace("-", "_"))
        if name in indirect:
            continue
        assert re.search(rf"^\s*(import|from) {mod}\b", source, re.M), f"{name} is a hard dependency that mmrl never imports"
    deps = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower(): d for d in project["dependencies"]}
    assert "diffusers" not in deps and "open_clip_torch" not in deps
    for name in ("transformers", "accelerate"):
        assert "<" in deps[name], f"{name} needs an upper bound"
    assert any(d.startswith("trl") and "<" in d for d in project["optional-dependencies"]["bench"])
    assert "deepspeed" in project["optional-dependencies"]


def test_gradient_checkpointing_benchmark_smoke():
    """benchmarks/gradient_checkpointing.py's measurement at its smoke size, in this process (the script runs each
    variant in a fresh one; timings and memory are never checked here: the machine may be busy)."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import gradient_checkpointing as bench

    args = bench.parse_args(["--smoke"])
    off, on = bench.child(args, False), bench.child(args, True)
    for r in (off, on):
        assert r["memory"]["peak_bytes"] > 0 and r["step_time"]["n"] == args.steps == 1
    assert off["response_tokens"] == on["response_tokens"]  # the same rollouts in both variants


def test_the_parser_is_hf_argument_parser_over_the_fields():
    """`mmrl train --help` is transformers' HfArgumentParser: one option per field with the field's help; strings
    from YAML or Python are typed by the same parser (`3e-6`, which YAML 1.1 reads as a string, is a float)."""
    from transformers import HfArgumentParser

    from mmrl.cli.train import build_parser

    parser = build_parser()
    assert isinstance(parser, HfArgumentParser)
    text = " ".join(parser.format_help().split())
    assert "--num_generations" in text and "G: responses sampled per prompt (group size), >= 2." in text
    assert "--no_progress_bar" in text and "--bf16" in text and "--help-config" in text
    assert all(isinstance(f.type, str) for f in dataclasses.fields(TrainConfig))  # the dataclass is left as it was
    assert load_config(None, {"learning_rate": "3e-6"}).learning_rate == 3e-6
    with pytest.raises(ConfigError, match=r"learning_rate=\[1\]: expected float"):
        load_config(None, {"learning_rate": [1]})
