"""TRL's `GRPOConfig` / transformers' `TrainingArguments` fields with their meanings: warmup_steps (steps or a ratio),
dtype, lr_scheduler_kwargs, optim, steps_per_generation / generation_batch_size, sync_ref_model,
top_entropy_quantile, run_name and the W&B project, attn_implementation, eval_strategy, push_to_hub's token check;
unsupported fields refused with their reason, and the README's table of every field."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.config import ConfigError, TrainConfig, describe_fields, load_config
from mmrl.models import adapter_class
from mmrl.training.optim import build_optimizer, build_scheduler, warmup_step_count
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward

ROOT = Path(__file__).resolve().parents[2]


def cfg(tmp_path, **kw):
    v = dict(family="causal_lm", method="grpo", max_steps=1, num_generations=4, per_device_train_batch_size=8,
             max_completion_length=6, learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
             report_to=["jsonl"])
    v.update(kw)
    return load_config(None, v)


def lrs(c, n):
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], c)
    sch = build_scheduler(opt, c)
    out = []
    for _ in range(n):
        out.append(sch.get_last_lr()[0])
        opt.step()
        sch.step()
    return out


# ----------------------------------------------------------------------------------- warm-up and schedules

def test_warmup_steps_is_a_step_count_or_a_ratio_below_one(tmp_path):
    c = cfg(tmp_path, lr_scheduler_type="linear", warmup_steps=3, max_steps=10, learning_rate=1.0)
    # by hand: linear warm-up k / 3 over 3 steps, then linear decay (10 - k) / 7
    want = [k / 3 for k in range(3)] + [(10 - k) / 7 for k in range(3, 10)]
    assert lrs(c, 10) == pytest.approx(want)
    ratio = cfg(tmp_path, lr_scheduler_type="linear", warmup_steps=0.25, max_steps=10, learning_rate=1.0)
    assert warmup_step_count(0.25, 0.0, 10) == 3  # ceil(2.5), transformers 5's rule
    assert lrs(ratio, 10) == pytest.approx(want)
    assert warmup_step_count(0.0, 0.25, 10) == 3  # transformers 4's warmup_ratio, the same steps
    with pytest.raises(ConfigError, match="both set the warm-up"):
        cfg(tmp_path, warmup_steps=3, warmup_ratio=0.1)
    with pytest.raises(ConfigError, match="warmup_steps=2.5 must be a whole number"):
        cfg(tmp_path, warmup_steps=2.5)


def test_lr_scheduler_kwargs_reach_the_scheduler_and_bad_ones_fail_at_start_up(tmp_path):
    c = cfg(tmp_path, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr": 0.1}, max_steps=4,
            learning_rate=1.0)
    # by hand: cosine from 1 to min_lr: min_lr + (1 - min_lr) * (1 + cos(pi k / 4)) / 2
    assert lrs(c, 4) == pytest.approx([0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)])
    with pytest.raises(ConfigError, match=r"lr_scheduler_kwargs=\{'nope': 1\} do not fit lr_scheduler_type='cosine'"):
        cfg(tmp_path, lr_scheduler_type="cosine", lr_scheduler_kwargs={"nope": 1})
    with pytest.raises(ConfigError, match="lr_scheduler_type='cosinus' is not a transformers scheduler"):
        cfg(tmp_path, lr_scheduler_type="cosinus")


def test_optim_fused_adamw_takes_the_same_step(tmp_path):
    torch.manual_seed(0)
    w0, g = torch.randn(5, 3), torch.randn(5, 3)
    out = {}
    for name in ("adamw_torch", "adamw_torch_fused"):
        p = torch.nn.Parameter(w0.clone())
        opt = build_optimizer([p], cfg(tmp_path, optim=name, weight_decay=0.1))
        assert opt.defaults.get("fused") == (True if name.endswith("fused") else None)
        for _ in range(3):
            p.grad = g.clone()
            opt.step()
        out[name] = p.detach()
    assert torch.allclose(out["adamw_torch"], out["adamw_torch_fused"], atol=1e-6)
    with pytest.raises(ConfigError, match="optim='adafactor' is not supported; choose one of"):
        cfg(tmp_path, optim="adafactor")


def test_dtype_is_transformers_5s_name_of_torch_dtype(tmp_path):
    assert cfg(tmp_path, dtype="bfloat16").torch_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="contradicts"):
        cfg(tmp_path, dtype="bfloat16", torch_dtype="float16")


# --------------------------------------------------------------------------------------- generation batch

class CountingPolicy:
    """The real tiny adapter, counting its `sample` calls (attribute access passes through)."""

    def __init__(self, inner):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "calls", 0)

    def sample(self, *a, **kw):
        object.__setattr__(self, "calls", self.calls + 1)
        return self._inner.sample(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def test_steps_per_generation_samples_once_for_several_optimizer_steps(tmp_path):
    c = cfg(tmp_path, per_device_train_batch_size=4, steps_per_generation=2, max_steps=4)
    assert c.rollout_batch_size == 8 and c.steps_per_pass == 2 and c.steps_per_rollout == 2
    pol = CountingPolicy(adapter_class("causal_lm").tiny(seed=0))
    t = Trainer(c, policy=pol, dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    t.train()
    assert pol.calls == 2  # two generations of 8 responses for four optimizer steps of 4
    from mmrl.reporting.metrics_log import read_metrics

    rec = read_metrics(tmp_path)
    # the second step of a generation trains on the other half with generation-time log-probs: off-policy by now
    assert rec[0]["policy/first_inner_logp_max_diff"] == 0.0 and rec[1]["policy/first_inner_logp_max_diff"] > 0.0
    same = cfg(tmp_path, per_device_train_batch_size=4, generation_batch_size=8)
    assert same.generation_steps == 2
    with pytest.raises(ConfigError, match="steps_per_generation=3 must be a positive multiple of gradient_accumulation_steps=2"):
        cfg(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=3)
    with pytest.raises(ConfigError, match="give one"):
        cfg(tmp_path, per_device_train_batch_size=4, steps_per_generation=2, generation_batch_size=8)


# ------------------------------------------------------------------------------------ reference sync

def test_mix_into_reference_by_hand():
    from mmrl.algorithms.reference_sync import mix_into_reference

    ref, pol = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    torch.nn.init.zeros_(ref.weight), torch.nn.init.ones_(pol.weight)
    torch.nn.init.constant_(ref.bias, 2.0), torch.nn.init.zeros_(pol.bias)
    mix_into_reference(ref, pol, 0.6)
    assert torch.allclose(ref.weight, torch.full((2, 2), 0.6)) and torch.allclose(ref.bias, torch.full((2,), 0.8))


def test_sync_ref_model_moves_the_reference_every_n_steps(tmp_path):
    c = cfg(tmp_path, beta=0.04, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5, max_steps=2)
    t = Trainer(c, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    ref0 = {k: v.clone() for k, v in t.policy.ref_model.named_parameters()}
    t.train()
    pol = dict(t.accelerator.unwrap_model(t.policy.model).named_parameters())
    for k, v in t.policy.ref_model.named_parameters():
        assert torch.allclose(v, 0.5 * pol[k].detach() + 0.5 * ref0[k], atol=1e-6), k
    assert any(not torch.equal(v, ref0[k]) for k, v in t.policy.ref_model.named_parameters())
    with pytest.raises(ConfigError, match="sync_ref_model=true needs a separate reference model"):
        cfg(tmp_path, sync_ref_model=True, use_peft=True)


# -------------------------------------------------------------------------------- top entropy quantile

def test_high_entropy_mask_by_hand():
    from mmrl.algorithms import high_entropy_mask

    ent = torch.tensor([[1.0, 2.0, 3.0, 4.0], [9.0, 0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    # valid entropies 1, 2, 3, 4, 9, 0.5; torch.quantile(., 0.5) = 2.5: keep 3, 4, 9
    want = torch.tensor([[False, False, True, True], [True, False, False, False]])
    assert torch.equal(high_entropy_mask(ent, mask, 0.5), want)
    assert torch.equal(high_entropy_mask(ent, mask, 1.0), mask)


def test_top_entropy_quantile_masks_the_loss(tmp_path):
    last = Trainer(cfg(tmp_path, top_entropy_quantile=0.2), policy=adapter_class("causal_lm").tiny(seed=0),
                   dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    assert 0 < last["entropy_mask/kept_frac"] <= 0.35
    with pytest.raises(ConfigError, match="method 'dmpo' has none"):
        cfg(tmp_path, method="dmpo", top_entropy_quantile=0.2)
    with pytest.raises(ConfigError, match=r"top_entropy_quantile=0.0 must be in \(0, 1\]"):
        cfg(tmp_path, top_entropy_quantile=0.0)


# ----------------------------------------------------------------------------- trackers: names, project

def test_run_name_and_wandb_project_from_the_environment(tmp_path, monkeypatch):
    from accelerate import tracking

    started = []

    class WandBStandIn(tracking.GeneralTracker):  # wandb is not installed here: same constructor call
        name, requires_logging_directory, main_process_only = "wandb", False, False

        def __init__(self, project, **kwargs):
            super().__init__()
            self.project, self.kwargs = project, kwargs

        def start(self):
            started.append(self)

        @property
        def tracker(self):
            return self

        def log(self, values, step=None, **kw):
            pass

        def finish(self):
            pass

    monkeypatch.setitem(tracking.LOGGER_TYPE_TO_CLASS, "wandb", WandBStandIn)
    monkeypatch.setenv("WANDB_PROJECT", "my-team-project")
    Trainer(cfg(tmp_path / "a", report_to=["wandb"], run_name="grpo-lr1e-2"), policy=adapter_class("causal_lm").tiny(seed=0),
            dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    monkeypatch.delenv("WANDB_PROJECT")
    Trainer(cfg(tmp_path / "b", report_to=["wandb"]), policy=adapter_class("causal_lm").tiny(seed=0),
            dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    (a, b) = started
    assert a.project == "my-team-project" and a.kwargs["name"] == "grpo-lr1e-2"
    assert b.project == "mmrl" and b.kwargs["name"] == "b"  # no run_name: the output_dir's name


# ------------------------------------------------------------------------------------ attention, eval

def test_attn_implementation_switches_the_kernel(tmp_path):
    from mmrl.training.policy_factory import AttentionError, build_policy

    pol = build_policy(cfg(tmp_path, attn_implementation="eager", beta=0.04))
    assert pol.model.config._attn_implementation == "eager" and pol.ref_model.config._attn_implementation == "eager"
    with pytest.raises(ConfigError, match="attn_implementation='flash' is not allowed"):
        cfg(tmp_path, attn_implementation="flash")
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        with pytest.raises(AttentionError, match="attn_implementation='flash_attention_2' cannot be used with Qwen2ForCausalLM"):
            build_policy(cfg(tmp_path, attn_implementation="flash_attention_2"))


def test_eval_strategy_intervals(tmp_path):
    from mmrl.training.epochs import eval_interval

    c = cfg(tmp_path, eval_strategy="steps", logging_steps=3)
    assert eval_interval(c, 16, 1) == 3  # transformers: eval_steps defaults to logging_steps
    assert eval_interval(cfg(tmp_path, eval_strategy="steps", eval_steps=5), 16, 1) == 5
    assert eval_interval(cfg(tmp_path, eval_strategy="no", eval_steps=5), 16, 1) == 0
    # 16 prompts, 2 per rollout batch (8 responses / 4): one epoch = 8 rollout batches = 8 optimizer steps
    assert eval_interval(cfg(tmp_path, eval_strategy="epoch"), 16, 1) == 8
    assert eval_interval(cfg(tmp_path, eval_strategy="epoch", num_iterations=2), 16, 1) == 16
    with pytest.raises(ConfigError, match="eval_strategy='sometimes' is not allowed"):
        cfg(tmp_path, eval_strategy="sometimes")


def test_push_to_hub_without_a_token_fails_at_start_up(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    monkeypatch.setattr(hc, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf" / "stored_tokens"))
    with pytest.raises(ConfigError, match="push_to_hub=true needs a Hugging Face token: set HF_TOKEN"):
        cfg(tmp_path, push_to_hub=True)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_not_real")
    assert cfg(tmp_path, push_to_hub=True, hub_model_id="me/my-model").push_to_hub
    with pytest.raises(ConfigError, match="hub_model_id='a/b/c' must be"):
        cfg(tmp_path, hub_model_id="a/b/c")


# ------------------------------------------------------------------------ unsupported keys and values

def test_use_vllm_alone_is_a_flag_and_vllm_server_keys_say_why_they_are_refused():
    import importlib.util

    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "--use_vllm", "--vllm_server_host", "0.0.0.0"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "needs a value" not in r.stderr
    assert "'vllm_server_host' is a TRL GRPOConfig field mmrl does not support: vLLM runs in colocate mode only" in r.stderr
    if importlib.util.find_spec("vllm") is None:
        r = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "--use_vllm"], capture_output=True, text=True)
        assert r.returncode == 2 and "use_vllm=true needs vLLM, which is not importable here" in r.stderr
    with pytest.raises(ConfigError, match="'use_liger_kernel' is a TRL GRPOConfig field mmrl does not support"):
        load_config(None, {"use_liger_kernel": True})
    with pytest.raises(ConfigError, match="loss_type='sapo': loss_type sapo is not implemented"):
        load_config(None, {"loss_type": "sapo"})
    assert load_config(None, {"loss_type": "cispo"}).loss_type == "cispo"  # mmrl.algorithms.cispo


def test_unknown_generation_kwargs_are_refused_at_start_up():
    with pytest.raises(ConfigError, match=r"generation_kwargs: \['min_p', 'repetition_penalty'\] are not sampling options of the causal_lm"):
        load_config(None, {"generation_kwargs": {"repetition_penalty": 1.1, "min_p": 0.05}})
    with pytest.raises(ConfigError, match="top_pp: did you mean top_p"):
        load_config(None, {"generation_kwargs": {"top_pp": 0.9}})
    assert load_config(None, {"generation_kwargs": {"top_p": 0.9}}).generation_kwargs == {"top_p": 0.9}
    with pytest.raises(ConfigError, match="not sampling options of the masked_diffusion family"):
        load_config(None, {"family": "masked_diffusion", "generation_kwargs": {"top_k": 3}})


def test_help_config_shows_the_default_loss_type_a_run_gets():
    line = next(x for x in describe_fields().splitlines() if x.startswith("loss_type "))
    assert line.startswith(f"loss_type (default {TrainConfig().loss_type!r} with method='grpo'")
    assert TrainConfig().loss_type == load_config(None, {}).loss_type == "grpo"


# -------------------------------------------------------------------------------------- the README table

def test_readme_lists_every_trl_grpo_config_field():
    trl = pytest.importorskip("trl")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import trl_config_table
    finally:
        sys.path.pop(0)
    rows = trl_config_table.rows()
    assert len(rows) == len([f for f in dataclasses.fields(trl.GRPOConfig) if not f.name.startswith("_")])
    assert not [n for n, st, _ in rows if st == "unclassified"]
    readme = (ROOT / "README.md").read_text()
    assert trl_config_table.table() in readme  # regenerate with scripts/trl_config_table.py --write
    for name, status, _ in rows:  # what the table says is what load_config does
        if status == "not supported":
            with pytest.raises(ConfigError, match="does not support"):
                load_config(None, {name: None}, validate=False)
    for name in ("warmup_steps", "lr_scheduler_kwargs", "optim", "steps_per_generation", "generation_batch_size",
                 "sync_ref_model", "top_entropy_quantile", "run_name", "push_to_hub", "hub_model_id",
                 "eval_strategy", "disable_tqdm"):
        assert dict((n, s) for n, s, _ in rows)[name] in ("accepted", "renamed"), name


def test_a_trl_grpo_config_style_yaml_runs_unchanged(tmp_path):
    """A YAML as a TRL user writes it for `trl grpo --config` (GRPOConfig / TrainingArguments names)."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"prompt": [{{"role": "user", "content": "say a {i}"}}]}}\n' for i in range(16)))
    (tmp_path / "grpo.yaml").write_text(f"""
output_dir: {tmp_path / 'run'}
run_name: trl-style
dtype: float32
learning_rate: 1.0e-3
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs: {{min_lr: 1.0e-5}}
warmup_steps: 0.25
optim: adamw_torch_fused
max_steps: 4
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
steps_per_generation: 2
num_generations: 4
max_completion_length: 6
beta: 0.04
sync_ref_model: true
ref_model_sync_steps: 2
top_entropy_quantile: 0.5
loss_type: dapo
scale_rewards: group
logging_steps: 1
save_steps: 0
report_to: [jsonl]
disable_tqdm: true
seed: 42
task: jsonl
dataset_path: {data}
reward_funcs: [trl.rewards.think_format_reward]
""")
    pytest.importorskip("trl")
    r = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "--config", str(tmp_path / "grpo.yaml")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    from mmrl.reporting.metrics_log import read_metrics

    rec = read_metrics(tmp_path / "run")
    assert [x["step"] for x in rec] == [1, 2, 3, 4]
    # the learning rate after each step (as transformers logs it): one warm-up step (ceil(0.25 x 4)) from 0 to 1e-3,
    # then cosine towards min_lr over the remaining 3; without the warm-up step 1 would log 0.854e-3
    assert rec[0]["learning_rate"] == pytest.approx(1e-3) and 1e-5 < rec[1]["learning_rate"] < 1e-3
    assert (tmp_path / "run" / "model.safetensors").is_file() and (tmp_path / "run" / "README.md").is_file()
