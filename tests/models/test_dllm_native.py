"""LLaDA and Dream checkpoints load into transformers-native bidirectional classes (`models/dllm_native.py`, issue
29): the key mapping and the configuration mapping, checked by round trips (a tiny Llama / Qwen2 written in LLaDA's /
Dream's checkpoint layout loads back into the same function), the fall-back and its errors. Fidelity to the shipped
modelling code is checked at development time by `scripts/check_native_dllm.py` (that code is not in the repo)."""
from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import save_file

from mmrl.models.dllm_native import LLADA_KEY_MAPPING, llada_llama_config, load_native
from mmrl.models.masked_diffusion import MaskedDiffusionAdapter as MDA

LLADA_NAMES = {  # Llama name -> LLaDA name (the inverse of LLADA_KEY_MAPPING, written out independently)
    "model.embed_tokens.weight": "model.transformer.wte.weight",
    "model.norm.weight": "model.transformer.ln_f.weight",
    "lm_head.weight": "model.transformer.ff_out.weight",
}
LLADA_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm", "self_attn.q_proj": "q_proj",
               "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
               "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}


def _to_llada_name(name: str) -> str:
    if name in LLADA_NAMES:
        return LLADA_NAMES[name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
    return f"model.transformer.blocks.{m.group(1)}.{LLADA_LAYER[m.group(2)]}.weight"


def _perturbed(adapter: MDA) -> MDA:
    with torch.no_grad():  # norms away from 1, so a swapped norm would show
        for name, p in adapter.model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return adapter


def _llada_checkpoint(tmp_path, tied: bool = False) -> tuple[MDA, object]:
    a = _perturbed(MDA.tiny(seed=0, initializer_range=0.3))
    c = a.model.config
    state = {_to_llada_name(k): v.contiguous() for k, v in a.model.state_dict().items()}
    raw = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "auto_map": {"AutoModel": "modeling_llada.LLaDAModelLM"},
           "d_model": c.hidden_size, "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
           "n_layers": c.num_hidden_layers, "mlp_hidden_size": c.intermediate_size, "activation_type": "silu",
           "block_type": "llama", "rope": True, "rope_theta": c.rope_parameters["rope_theta"], "layer_norm_type": "rms",
           "rms_norm_eps": c.rms_norm_eps, "weight_tying": False, "include_bias": False, "vocab_size": c.vocab_size,
           "embedding_size": c.vocab_size, "mask_token_id": a.mask_token_id, "eos_token_id": a.eos_token_ids[0],
           "pad_token_id": a.pad_token_id, "max_sequence_length": 256}
    d = tmp_path / "llada"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    a.tokenizer.save_pretrained(d)
    return a, d


def test_llada_checkpoint_loads_natively_with_the_same_logits(tmp_path):
    a, d = _llada_checkpoint(tmp_path)
    b = MDA.from_pretrained(d)  # no trust_remote_code: nothing shipped with the checkpoint runs
    assert type(b.model).__name__ == "LlamaForCausalLM" and b.backbone == "native"
    assert b.mask_token_id == a.mask_token_id and not b.shift_logits
    fn = b.backbone_logits(torch.ones(2, 3, dtype=torch.bool), 6)
    assert fn.supports_cache and fn.supports_dual_cache  # Fast-dLLM's caches now apply
    x = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(b.model(x).logits, a.model(x).logits, rtol=0, atol=1e-5)
    # and the same samples as the original bidirectional Llama, cache or not
    out_a = a.sample(["ab", "hello"], 2, seeds=[0, 1, 2, 3], gen_length=8, block_length=4, steps=4, temperature=0.0)
    out_b = b.sample(["ab", "hello"], 2, seeds=[0, 1, 2, 3], gen_length=8, block_length=4, steps=4, temperature=0.0,
                     cache="prefix")
    out_c = b.sample(["ab", "hello"], 2, seeds=[0, 1, 2, 3], gen_length=8, block_length=4, steps=4, temperature=0.0)
    assert torch.equal(out_a.response_ids, out_c.response_ids)
    assert out_b.response_ids.shape == out_a.response_ids.shape


def test_dream_checkpoint_loads_natively_with_shifted_logits(tmp_path):
    a = _perturbed(MDA.tiny(seed=1, arch="qwen2", initializer_range=0.3, shift_logits=True))
    c = a.model.config
    raw = {"model_type": "Dream", "architectures": ["DreamModel"], "auto_map": {"AutoModel": "modeling_dream.DreamModel"},
           "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
           "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "hidden_act": "silu", "max_position_embeddings": 256,
           "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_parameters["rope_theta"], "tie_word_embeddings": False,
           "mask_token_id": a.mask_token_id, "pad_token_id": a.pad_token_id, "eos_token_id": a.eos_token_ids[0]}
    d = tmp_path / "dream"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in a.model.state_dict().items()}, str(d / "model.safetensors"), metadata={"format": "pt"})
    a.tokenizer.save_pretrained(d)
    b = MDA.from_pretrained(d)
    assert type(b.model).__name__ == "Qwen2ForCausalLM" and b.backbone == "native" and b.shift_logits
    x = torch.randint(5, 90, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(b.model(x).logits, a.model(x).logits, rtol=0, atol=1e-5)


def test_configurations_llama_cannot_express_fall_back_with_the_reason(tmp_path):
    base = {"block_type": "llama", "rope": True, "layer_norm_type": "rms", "activation_type": "silu"}
    assert llada_llama_config(base)[0] is not None
    for change, word in (({"block_type": "sequential"}, "block_type"), ({"alibi": True}, "RoPE"),
                         ({"attention_layer_norm": True}, "layer norms"), ({"scale_logits": True}, "scaled"),
                         ({"activation_type": "swiglu"}, "activation"), ({"include_qkv_bias": True}, "bias")):
        config, why = llada_llama_config({**base, **change})
        assert config is None and word in why
    # a convertible configuration whose weights do not map: the reason, and the error asks for remote code
    _, d = _llada_checkpoint(tmp_path)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "n_layers": raw["n_layers"] + 1}))
    model, why = load_native(d)
    assert model is None and "missing" in why
    with pytest.raises(ValueError, match="trust_remote_code"):
        MDA.from_pretrained(d)


def test_the_key_mapping_covers_every_llama_tensor():
    a = MDA.tiny(seed=0)
    for name in a.model.state_dict():
        llada = _to_llada_name(name)
        mapped = [re.sub(p, r, llada) for p, r in LLADA_KEY_MAPPING.items() if re.match(p, llada)]
        assert mapped == [name], (name, llada, mapped)
