"""LLaDA and Dream checkpoints in transformers-native bidirectional classes (issue 29).

LLaDA (Nie et al. 2025) is a Llama-architecture encoder: RMSNorm, RoPE, SwiGLU MLP, no biases, full attention. Its
checkpoints (`model_type: llada`, `LLaDAModelLM`) ship their own modelling code, which has no KV cache. Dream
(Ye et al. 2025) is Qwen2.5's architecture (q/k/v biases) with full attention and logits shifted right by one;
its parameter names are Qwen2's. Both are loaded here into `LlamaForCausalLM` / `Qwen2ForCausalLM` with
`config.is_causal = False` (bidirectional attention, `models.dllm_backbone`), so they get `logits_to_keep`, a
`DynamicCache` / `StaticCache` and hence Fast-dLLM's prefix and dual caches and batched threshold decoding, without
running any code shipped with the checkpoint (only `config.json` and the safetensors weights are read).

The mapping (LLaDA's `modeling_llada.py`, `LLaDALlamaBlock`; Dream's `modeling_dream.py`):

| LLaDA | Llama |
|---|---|
| `model.transformer.wte` | `model.embed_tokens` |
| `model.transformer.blocks.i.attn_norm` / `ff_norm` | `model.layers.i.input_layernorm` / `post_attention_layernorm` |
| `...blocks.i.q_proj` / `k_proj` / `v_proj` / `attn_out` | `...layers.i.self_attn.q_proj` / `k_proj` / `v_proj` / `o_proj` |
| `...blocks.i.ff_proj` / `up_proj` / `ff_out` | `...layers.i.mlp.gate_proj` / `up_proj` / `down_proj` (silu(gate) * up) |
| `model.transformer.ln_f` / `ff_out` | `model.norm` / `lm_head` (tied to the embedding with `weight_tying`) |

Where a LLaDA configuration uses something Llama cannot express (a sequential block, ALiBi, q/k layer norms, scaled
logits or embeddings, LayerNorm instead of RMSNorm, a q/k/v bias without an output bias, block groups, an activation
other than SiLU), `native_config` says why and the caller falls back to the remote code (with `trust_remote_code`).

Differences from the shipped code, by design: left padding gets a padding mask and position ids counted over real
tokens (Fast-dLLM's LLaDA passes no mask to attention and numbers positions from 0 at the left edge), and RoPE's
cos/sin are applied in the activations' dtype (LLaDA's `rope_full_precision` applies them in float32): equal
logits on unpadded float32 inputs, checked against the public modelling code by `scripts/check_native_dllm.py`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLADA_DEFAULTS: dict[str, Any] = {
    "d_model": 768, "n_heads": 12, "n_kv_heads": None, "n_layers": 12, "mlp_ratio": 4, "mlp_hidden_size": None,
    "activation_type": "swiglu", "block_type": "sequential", "block_group_size": 1, "alibi": False, "rope": False,
    "multi_query_attention": None, "attention_layer_norm": False, "input_emb_norm": False, "layer_norm_type": "default",
    "layer_norm_with_affine": True, "rms_norm_eps": 1e-5, "max_sequence_length": 1024, "rope_theta": 10000.0,
    "include_qkv_bias": False, "include_bias": False, "bias_for_layer_norm": None, "scale_logits": False,
    "vocab_size": 50257, "embedding_size": 50304, "weight_tying": True, "eos_token_id": 50256, "pad_token_id": 50256,
    "mask_token_id": 50256,
}
"""`ModelConfig` defaults of LLaDA's `configuration_llada.py` (the values a `config.json` without the key means)."""

LLADA_KEY_MAPPING = {
    r"^model\.transformer\.wte\.": "model.embed_tokens.",
    r"^model\.transformer\.ln_f\.": "model.norm.",
    r"^model\.transformer\.ff_out\.": "lm_head.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.": r"model.layers.\1.input_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.": r"model.layers.\1.post_attention_layernorm.",
    r"^model\.transformer\.blocks\.(\d+)\.q_proj\.": r"model.layers.\1.self_attn.q_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.k_proj\.": r"model.layers.\1.self_attn.k_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.v_proj\.": r"model.layers.\1.self_attn.v_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.attn_out\.": r"model.layers.\1.self_attn.o_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.": r"model.layers.\1.mlp.gate_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.up_proj\.": r"model.layers.\1.mlp.up_proj.",
    r"^model\.transformer\.blocks\.(\d+)\.ff_out\.": r"model.layers.\1.mlp.down_proj.",
}
"""LLaDA parameter name -> Llama parameter name (regular expressions, transformers' `key_mapping`)."""


def family_of(raw: dict) -> str | None:
    """"llada" or "dream" from a `config.json` dict, else None."""
    model_type = str(raw.get("model_type", "")).lower()
    if model_type.startswith("llada"):
        return "llada"
    if model_type == "dream":
        return "dream"
    return None


def llada_llama_config(raw: dict):
    """(`LlamaConfig`, None) for a LLaDA `config.json` dict, or (None, the reason it has no Llama equivalent)."""
    from transformers import LlamaConfig

    c = {**LLADA_DEFAULTS, **raw}
    problems = []
    if c["block_type"] != "llama":
        problems.append(f"block_type={c['block_type']!r} (only 'llama' blocks)")
    if c["alibi"] or not c["rope"]:
        problems.append("no RoPE (ALiBi or learned positions)")
    if c["attention_layer_norm"]:
        problems.append("q/k layer norms")
    if c["layer_norm_type"] != "rms" or not c["layer_norm_with_affine"] or c["bias_for_layer_norm"]:
        problems.append(f"layer_norm_type={c['layer_norm_type']!r} (only affine RMSNorm without bias)")
    if c["activation_type"] != "silu":
        problems.append(f"activation_type={c['activation_type']!r} (only silu with the llama block's up_proj)")
    if c["scale_logits"] or c["input_emb_norm"]:
        problems.append("scaled logits or embeddings")
    if c["block_group_size"] != 1:
        problems.append(f"block_group_size={c['block_group_size']}")
    if bool(c["include_qkv_bias"]) and not c["include_bias"]:
        problems.append("a q/k/v bias without an output-projection bias")
    if problems:
        return None, "; ".join(problems)
    n_kv = c["n_kv_heads"] or (1 if c["multi_query_attention"] else c["n_heads"])
    config = LlamaConfig(
        vocab_size=c["embedding_size"] or c["vocab_size"], hidden_size=c["d_model"],
        intermediate_size=c["mlp_hidden_size"] or c["mlp_ratio"] * c["d_model"], num_hidden_layers=c["n_layers"],
        num_attention_heads=c["n_heads"], num_key_value_heads=n_kv, hidden_act="silu",
        max_position_embeddings=c["max_sequence_length"], rms_norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
        attention_bias=bool(c["include_bias"]), mlp_bias=bool(c["include_bias"]), tie_word_embeddings=bool(c["weight_tying"]),
        pad_token_id=c["pad_token_id"], eos_token_id=c["eos_token_id"], attn_implementation="sdpa",
    )
    config.mask_token_id = c["mask_token_id"]
    return config, None


def dream_qwen2_config(raw: dict):
    """(`Qwen2Config`, None) for a Dream `config.json` dict (logits shifted right: `shift_logits = True`), or (None,
    the reason)."""
    from transformers import Qwen2Config

    if raw.get("use_sliding_window"):
        return None, "sliding-window attention"
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
            "tie_word_embeddings", "pad_token_id", "bos_token_id", "eos_token_id")
    config = Qwen2Config(**{k: raw[k] for k in keys if k in raw}, attn_implementation="sdpa")
    config.mask_token_id = raw.get("mask_token_id")
    config.shift_logits = True  # Dream: the output at position i - 1 predicts token i
    return config, None


def native_config(raw: dict):
    """(the native config, None) for a LLaDA or Dream `config.json` dict, or (None, why not); `is_causal = False`."""
    fam = family_of(raw)
    if fam is None:
        raise ValueError(f"model_type={raw.get('model_type')!r} is neither LLaDA nor Dream")
    config, why = llada_llama_config(raw) if fam == "llada" else dream_qwen2_config(raw)
    if config is not None:
        config.is_causal = False
    return config, why


def load_native(path: Path, raw: dict | None = None, *, dtype=None):
    """(model, None) with a LLaDA / Dream checkpoint's weights in `LlamaForCausalLM` / `Qwen2ForCausalLM`, or (None,
    why the conversion does not apply: a configuration Llama / Qwen2 cannot express, or weights that do not map
    one to one). Reads only `config.json` and the weights (safetensors)."""
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    path = Path(path)
    raw = raw if raw is not None else json.loads((path / "config.json").read_text())
    config, why = native_config(raw)
    if config is None:
        return None, why
    if not any((path / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        return None, "no safetensors weights (model.safetensors or its index)"
    kwargs: dict[str, Any] = {"config": config, "use_safetensors": True}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if family_of(raw) == "llada":
        model, info = LlamaForCausalLM.from_pretrained(path, key_mapping=LLADA_KEY_MAPPING, output_loading_info=True, **kwargs)
    else:
        model, info = Qwen2ForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = sorted(set(info.get("missing_keys", [])) - tied)
    unexpected = sorted(info.get("unexpected_keys", []))
    if missing or unexpected:  # a silent random init of a missing tensor would train garbage
        return None, (f"its weights do not map onto {type(model).__name__}: missing {missing[:3]}"
                      f"{'...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}")
    model.config.is_causal = False
    return model.eval(), None
