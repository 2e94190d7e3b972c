"""Run every paper preset for two optimizer steps on its real architecture, scaled down only in width and depth.

    python scripts/check_real_architectures.py --llada /work/fetched/fast-dllm/llada/model \\
        --dream /work/fetched/fast-dllm/dream/model [--dllm-backbone remote] [--only dmpo_llada_8b ...] [--out record.json]

`--llada` / `--dream`: folders holding the public modeling code of LLaDA (`configuration_llada.py`,
`modeling_llada.py`) and Dream (`configuration_dream.py`, `modeling_dream.py`, `generation_utils.py`), e.g.
NVlabs/Fast-dLLM's `llada/model` and `dream/model`, fetched at development time and kept outside this repository
(nothing fetched is committed). Janus-Pro, Qwen2.5-VL, Qwen2.5 and aMUSEd use the transformers / diffusers classes.

Each architecture keeps its checkpoint's vocabulary size, special-token ids (mask, EOS, pad, image markers), image
token counts, codebook sizes, position scheme (RoPE theta, mRoPE sections scaled to the head size) and chat-template
layout; hidden sizes, heads and layers are scaled down, weights random. The tokenizer is a layout tokenizer: the
real vocabulary size with the special tokens at their real ids and one token per printable character (the real
BPE merges are not public here). LLaDA and Dream load with `trust_remote_code=True`, as their
checkpoints do: with `--dllm-backbone native` (the default, what the adapter does with a real checkpoint) their
weights go into transformers' Llama / Qwen2 classes (`models/dllm_native.py`); with `--dllm-backbone remote` the
native conversion is switched off, so they run through the fetched modelling code itself (`auto_map`), as a
configuration the native classes cannot express would. The others are built from their classes and saved/loaded
through the adapters' `from_pretrained`.

Each preset then runs its own method, sampler, estimator, LoRA targets and loss settings for two optimizer steps,
with these scale-downs (named in the record): G = 2 responses of 1 prompt per step, no gradient accumulation,
completions of 32 tokens (masked diffusion: one block of 32, the presets' block length, diffusion steps scaled by the same factor), float32
on CPU, and a stand-in reward (a deterministic function of the completion, tie-broken by row position when a call's
completions all score the same) so that groups have spread. The record
(one JSON line per preset: passed, error, loss, grad norm, which LoRA targets matched) goes to `--out` and stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import string
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

SCALE = {"num_generations": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 2,
         "torch_dtype": "float32", "mixed_precision": "no", "save_steps": 0, "credit_steps": 0, "eval_steps": 0,
         "progress_bar": False, "log_completions": False, "gradient_checkpointing": False, "max_nonfinite_steps": 1}
"""Scale-downs every preset gets (batch, steps, precision on CPU); a non-finite step fails the preset (the trainer
would skip it and go on)."""
TEXT_COMPLETION = 32
"""Completion length of the text presets here (the presets: 256 to 8192); masked diffusion: one block of 32."""


# ------------------------------------------------------------------------------------------- layout tokenizers


def layout_tokenizer(vocab_size: int, specials: dict[str, int], *, roles: dict[str, str], chat_template: str | None,
                     char_offset: int = 1000):
    """A `PreTrainedTokenizerFast` of exactly `vocab_size` ids: `specials` at their real ids, one token per printable
    character from `char_offset` on, placeholders elsewhere. `roles`: pad / bos / eos / unk / mask -> token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = dict(specials)
    taken = set(vocab.values())
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    i = char_offset
    for c in chars:
        while i in taken:
            i += 1
        vocab[c] = i
        taken.add(i)
    for j in range(vocab_size):
        if j not in taken:
            vocab[f"<|placeholder_{j}|>"] = j
    assert len(vocab) == vocab_size and max(vocab.values()) == vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=roles.get("unk", roles["pad"])))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    named = {f"{k}_token": v for k, v in roles.items()}
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **named,
                                  additional_special_tokens=[t for t in specials if t not in roles.values()])
    if chat_template:
        out.chat_template = chat_template
    for t, idx in specials.items():
        assert out.convert_tokens_to_ids(t) == idx, (t, idx)
    return out


LLADA_TEMPLATE = ("{{ '<|startoftext|>' }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                  "{{ m['content'] }}{% if not loop.last or m['role'] != 'assistant' %}<|eot_id|>{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
"""LLaDA-8B-Instruct's chat layout (Llama-3 headers; `<|eot_id|>` ends a turn)."""
QWEN_TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou are a "
                 "helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n"
                 "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
                 "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
                 "{% endfor %}{% endif %}{% if not loop.last or m['role'] != 'assistant' %}<|im_end|>\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""Qwen2.5's (and Dream's, Qwen2.5-VL's) ChatML layout with Qwen's default system message."""

QWEN_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                 "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656}
"""Qwen2.5 special-token ids (tokenizer_config.json of the Qwen2.5 / Qwen2.5-VL checkpoints)."""


def llada_tokenizer():
    specials = {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
                "<|start_header_id|>": 126346, "<|end_header_id|>": 126347, "<|eot_id|>": 126348}
    return layout_tokenizer(126464, specials, chat_template=LLADA_TEMPLATE,
                            roles={"bos": "<|startoftext|>", "eos": "<|eot_id|>", "pad": "<|endoftext|>", "mask": "<|mdm_mask|>"})


def qwen_tokenizer(vocab_size: int, extra: dict[str, int] | None = None, mask: str | None = None):
    specials = {**QWEN_SPECIALS, **(extra or {})}
    roles = {"eos": "<|im_end|>", "pad": "<|endoftext|>"}
    if mask:
        roles["mask"] = mask
    return layout_tokenizer(vocab_size, specials, chat_template=QWEN_TEMPLATE, roles=roles)


# ------------------------------------------------------------------------------------------- architectures


def _remote_checkpoint(code_dir: Path, out: Path, files: list[str], config: dict, auto_map: dict, tokenizer) -> Path:
    """A checkpoint folder with the fetched modeling code, `config.json` (`auto_map`) and random weights, built by
    the remote class itself (resolved from `auto_map` as transformers does, with the adapter's transformers-5 shims)."""
    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    from mmrl.models.masked_diffusion import ensure_default_rope, transformers5_compatible

    out.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(code_dir / f, out / f)
    (out / "config.json").write_text(json.dumps({**config, "auto_map": auto_map}))
    cfg = AutoConfig.from_pretrained(out, trust_remote_code=True)
    ensure_default_rope()  # the adapter's own shims for remote code written for transformers 4 (models/masked_diffusion.py)
    torch.manual_seed(0)
    model = transformers5_compatible(get_class_from_dynamic_module(auto_map["AutoModel"], str(out)))(cfg)
    model.save_pretrained(out)
    for f in files:  # save_pretrained may rewrite the folder; the code must stay next to config.json
        shutil.copy(code_dir / f, out / f)
    tokenizer.save_pretrained(out)
    return out


def llada_checkpoint(code_dir: Path, out: Path) -> Path:
    """LLaDA-8B-Instruct's config.json scaled to d_model 64, 2 layers (vocab 126464, mask 126336, RoPE 5e5)."""
    config = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "d_model": 64, "n_heads": 4, "n_kv_heads": 4,
              "n_layers": 2, "mlp_hidden_size": 128, "mlp_ratio": 2, "vocab_size": 126464, "embedding_size": 126464,
              "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081, "rope": True,
              "rope_theta": 500000.0, "max_sequence_length": 4096, "block_type": "llama", "activation_type": "silu",
              "layer_norm_type": "rms", "rms_norm_eps": 1e-5, "include_bias": False, "include_qkv_bias": False,
              "weight_tying": False, "alibi": False, "attention_layer_norm": False, "flash_attention": False,
              "init_device": "cpu", "init_fn": "mitchell", "scale_logits": False, "input_emb_norm": False,
              "use_cache": False, "torch_dtype": "float32"}
    auto = {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"}
    return _remote_checkpoint(code_dir, out, ["configuration_llada.py", "modeling_llada.py"], config, auto, llada_tokenizer())


def dream_checkpoint(code_dir: Path, out: Path) -> Path:
    """Dream-v0-Instruct-7B's config.json scaled to hidden 64, 2 layers (vocab 152064, mask 151666, RoPE 1e6, GQA)."""
    config = {"model_type": "Dream", "architectures": ["DreamModel"], "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 152064,
              "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "mask_token_id": 151666,
              "pad_token_id": 151643, "bos_token_id": 151643, "eos_token_id": 151643, "tie_word_embeddings": False,
              "hidden_act": "silu", "use_cache": False, "torch_dtype": "float32"}
    auto = {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}
    files = ["configuration_dream.py", "modeling_dream.py", "generation_utils.py"]
    return _remote_checkpoint(code_dir, out, files, config, auto, qwen_tokenizer(152064, {"<|mask|>": 151666}, "<|mask|>"))


def qwen25_policy():
    """Qwen2.5-7B-Instruct's Qwen2 layout scaled to hidden 64 (vocab 152064, RoPE 1e6, GQA 7:1 -> 2:1, untied)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.models import adapter_class

    tok = qwen_tokenizer(152064)
    cfg = Qwen2Config(vocab_size=152064, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False,
                      bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    torch.manual_seed(0)
    return adapter_class("causal_lm")(Qwen2ForCausalLM(cfg).eval(), tok)


def qwen25_vl_policy():
    """Qwen2.5-VL-7B-Instruct scaled to hidden 64 / vision depth 2 (vocab 152064, image pad 151655, patch 14, merge 2,
    temporal patch 2, window 112, mRoPE sections [16, 24, 24] of head 128 scaled to [4, 6, 6] of head 32)."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    from mmrl.models import adapter_class

    tok = qwen_tokenizer(152064)
    sizes = dict(patch_size=14, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})
    proc = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), tokenizer=tok,
                               video_processor=Qwen2VLVideoProcessor(**sizes), chat_template=QWEN_TEMPLATE)
    text = dict(vocab_size=152064, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=128000,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
                bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=64, fullatt_block_indexes=[1])
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=151655, video_token_id=151656,
                           vision_start_token_id=151652, vision_end_token_id=151653)
    torch.manual_seed(0)
    return adapter_class("vlm")(Qwen2_5_VLForConditionalGeneration(cfg).eval(), proc)


def janus_policy():
    """Janus-Pro-7B (transformers' `JanusForConditionalGeneration`) scaled to hidden 64: text vocab 102400, VQ
    codebook 16384 of dim 8, 24 x 24 = 576 image tokens, 16x VQ down-sampling (channel multipliers [1, 1, 2, 2, 4]:
    384 px). Ids (docs/sources.md "Real architectures" gives the source of each): BOS 100000, EOS 100001, pad 100015
    (Janus-Pro-7B; 100002 in 1B), `<image_placeholder>` 100581 (transformers' `JanusConfig` default),
    `<begin_of_image>` 100016 and `<end_of_image>` 100593 (corroborated by two public codebases, not by the tokenizer
    file), `<|User|>` / `<|Assistant|>` 100588 / 100589 (unverified placeholders). The adapter reads every id from the
    tokenizer and generation config, so they matter only to this check."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    from mmrl.models import adapter_class
    from mmrl.models.image_codecs import VQCodec

    specials = {"<｜begin▁of▁sentence｜>": 100000, "<｜end▁of▁sentence｜>": 100001, "<｜▁pad▁｜>": 100015,
                "<begin_of_image>": 100016, "<end_of_image>": 100593, "<image_placeholder>": 100581,
                "<|User|>": 100588, "<|Assistant|>": 100589}
    tok = layout_tokenizer(102400, specials, chat_template=None, roles={
        "bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>", "pad": "<｜▁pad▁｜>"})
    text = dict(model_type="llama", vocab_size=102400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16384, rope_theta=10000.0,
                pad_token_id=100015, bos_token_id=100000, eos_token_id=100001)
    vision = dict(image_size=384, patch_size=16, num_image_tokens=576, hidden_size=32, projection_dim=64,
                  num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2)
    vq = dict(embed_dim=8, num_embeddings=16384, num_patches=24, latent_channels=32, base_channels=32,
              channel_multiplier=[1, 1, 2, 2, 4], num_res_blocks=1, projection_dim=64, image_token_embed_dim=64)
    cfg = JanusConfig(text_config=text, vision_config=vision, vq_config=vq, image_token_id=100581)
    torch.manual_seed(0)
    model = JanusForConditionalGeneration(cfg).eval()
    gen = model.generation_config
    gen.pad_token_id, gen.bos_token_id, gen.eos_token_id = 100015, 100000, 100001
    gen.boi_token_id = 100016
    gen.generation_kwargs = {"boi_token_id": 100016}
    return adapter_class("janus")(model, tok, codec=VQCodec(model))


def amused_policy():
    """aMUSEd-256 scaled to hidden 64: codebook 8192 (mask id 8192), 16 x 16 image tokens, 4 VQ down-samplings
    (256 px), CLIP text encoder of 77 positions."""
    from mmrl.models import adapter_class
    from mmrl.models.masked_image import tiny_amused_components

    parts = tiny_amused_components(seed=0, words=("a", "photo", "of", "an", "and", "cat", "dog", "red", "blue"), grid=16,
                                   codebook_size=8192, hidden_size=64, num_hidden_layers=2, text_hidden_size=64,
                                   model_max_length=77)
    return adapter_class("masked_image")(parts["transformer"], parts["vqvae"], parts["text_encoder"], parts["tokenizer"],
                                         mask_token_id=parts["scheduler"].config.mask_token_id)


# ------------------------------------------------------------------------------------------- presets


def text_rows(n: int = 4) -> list[dict]:
    from mmrl.data.tasks import user_message

    return [{"prompt": user_message(f"{a}+{b}?"), "answer": str(a + b)}
            for a, b in zip(range(2, 2 + n), range(3, 3 + n))]


TIE_BREAK = 0.05
"""Added per row position when every completion of a reward call scores the same: a random tiny model at the
presets' temperature (0.2 for DMPO) often samples one completion twice, and a group of equal rewards gives DMPO
weights equal to their baseline, hence a zero loss and no gradient, which would show nothing of the update path."""


def stand_in_reward(prompts, completions, **kwargs):
    """A deterministic reward with spread: the share of digits among the completion's characters (text), or the mean
    brightness of the image; `TIE_BREAK` times the row position when all of them are equal."""
    out = _stand_in_scores(completions)
    if len(out) > 1 and len(set(out)) == 1:
        out = [v + TIE_BREAK * i for i, v in enumerate(out)]
    return out


def _stand_in_scores(completions) -> list[float]:
    out = []
    for c in completions:
        if hasattr(c, "convert"):
            import numpy as np

            out.append(float(np.asarray(c.convert("L"), dtype=np.float32).mean() / 255.0))
        else:
            text = c if isinstance(c, str) else " ".join(m.get("content", "") for m in c if isinstance(m, dict))
            out.append(sum(ch.isdigit() for ch in text) / max(1, len(text)) + 0.01 * (len(text) % 7))
    return out


def geneval_rows(n: int = 4) -> list[dict]:
    from mmrl.geneval.prompts import training_suite

    return [{"prompt": r["prompt"], "metadata": r} for r in training_suite()[:n]]


def vqa_rows(n: int = 4) -> list[dict]:
    from PIL import Image

    rows = []
    for i in range(n):
        img = Image.new("RGB", (84, 84), (40 * i, 120, 200 - 30 * i))
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"How many {i}?"}]}]
        rows.append({"prompt": {"prompt": messages, "images": [img]}, "answer": str(i)})
    return rows


def dllm_scale(cfg_path: Path) -> dict:
    """Masked diffusion: completions of TEXT_COMPLETION tokens, diffusion steps scaled by the same factor."""
    from mmrl.config import load_config

    cfg = load_config(cfg_path)
    factor = TEXT_COMPLETION / cfg.max_completion_length
    out = {"max_completion_length": TEXT_COMPLETION}
    if cfg.diffusion_steps:
        out["diffusion_steps"] = max(1, int(cfg.diffusion_steps * factor))
    return out


PRESETS = {
    "d1_diffu_grpo_llada_8b": "llada",
    "dmpo_llada_8b": "llada", "dmpo_llada_8b_gsm8k": "llada", "dmpo_llada_8b_math500": "llada",
    "dmpo_llada_8b_countdown": "llada", "dmpo_llada_8b_sudoku": "llada",
    "dmpo_dream_7b": "dream", "dmpo_dream_7b_gsm8k": "dream", "dmpo_dream_7b_math500": "dream",
    "dmpo_dream_7b_countdown": "dream", "dmpo_dream_7b_sudoku": "dream",
    "gcpo_janus_pro_7b_geneval": "janus", "grpo_janus_pro_7b_geneval": "janus", "stage_janus_pro_7b_geneval": "janus",
    "dmpo_amused_256_geneval": "amused",
    "gcpo_qwen25_vl_7b": "qwen25_vl",
    "dgpo_dapo_qwen25_7b": "qwen25", "dapo_qwen25_7b": "qwen25",
}
"""Every paper preset and the architecture it names."""


def lora_matches(policy, targets) -> dict:
    """Which of the preset's LoRA target names occur as module names of the backbone."""
    names = {n.rsplit(".", 1)[-1] for n, _ in policy.unwrapped.named_modules()}
    return {t: t in names for t in (targets or [])}


@contextlib.contextmanager
def dllm_backbone(kind: str):
    """`native`: the adapter as it is. `remote`: its native conversion reports "not applicable", so LLaDA / Dream
    load through their own modelling code (the adapter's remote-code path, with its transformers-5 shims)."""
    if kind == "native":
        yield
        return
    import mmrl.models.masked_diffusion as md

    original = md.load_native
    md.load_native = lambda *args, **kwargs: (None, "switched off by --dllm-backbone remote")
    try:
        yield
    finally:
        md.load_native = original


RECORDED_METRICS = ("reward_std", "frac_reward_zero_std", "dmpo/log_ref_minus_v_mean", "dmpo/masked_ce")
"""Metrics of the last step kept in the record beside loss and grad norm (a zero loss from a group of equal rewards
is told apart from a broken one)."""


def run_preset(name: str, arch: str, checkpoints: dict[str, Path], work: Path, backbone: str = "native") -> dict:
    from mmrl.config import load_config
    from mmrl.models.dllm_backbone import base_model
    from mmrl.training.trainer import Trainer

    path = CONFIGS / f"{name}.yaml"
    overrides = dict(SCALE, output_dir=str(work / "runs" / name))
    policy = None
    if arch in ("llada", "dream"):
        overrides.update(dllm_scale(path), model_name_or_path=str(checkpoints[arch]), trust_remote_code=True,
                         max_prompt_length=200)
        rows = text_rows()
    elif arch == "janus":
        policy, rows = janus_policy(), geneval_rows()
    elif arch == "amused":
        policy, rows = amused_policy(), geneval_rows()
    elif arch == "qwen25_vl":
        policy, rows = qwen25_vl_policy(), vqa_rows()
        overrides.update(max_completion_length=TEXT_COMPLETION)
    else:
        policy, rows = qwen25_policy(), text_rows()
        overrides.update(max_completion_length=TEXT_COMPLETION, overlong_buffer_len=16)
    cfg = load_config(path, overrides)
    t0 = time.perf_counter()
    with dllm_backbone(backbone if arch in ("llada", "dream") else "native"):
        trainer = Trainer(cfg, policy=policy, dataset=rows, reward_funcs=[stand_in_reward])
    lora = lora_matches(trainer.policy, cfg.lora_target_modules) if cfg.use_peft else {}
    last = trainer.train()
    loss, grad = last.get("loss"), last.get("grad_norm")
    finite = all(v is None or v == v and abs(v) != float("inf") for v in (loss, grad))
    return {"preset": name, "architecture": arch, "backbone": type(base_model(trainer.policy.model)).__name__,
            "passed": finite and trainer.step == cfg.max_steps, "steps": trainer.step, "loss": loss, "grad_norm": grad,
            "reward": last.get("reward"), **{k: last.get(k) for k in RECORDED_METRICS if k in last},
            "method": cfg.method, "sampler": getattr(cfg, "sampler", None), "estimator": cfg.logprob_estimator,
            "lora_targets_found": lora, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llada", type=Path, help="folder with LLaDA's configuration_llada.py and modeling_llada.py")
    p.add_argument("--dream", type=Path, help="folder with Dream's configuration_dream.py, modeling_dream.py, generation_utils.py")
    p.add_argument("--dllm-backbone", choices=("native", "remote"), default="native",
                   help="LLaDA / Dream: transformers' native classes (the adapter's default) or the fetched modelling code")
    p.add_argument("--only", nargs="*", help="preset names (default: all)")
    p.add_argument("--out", type=Path, help="write the record (JSON lines) here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    names = args.only or list(PRESETS)
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        p.error(f"unknown presets {unknown}; valid: {list(PRESETS)}")
    needs = {PRESETS[n] for n in names} & {"llada", "dream"}
    for arch in needs:
        if getattr(args, arch) is None or not getattr(args, arch).is_dir():
            p.error(f"--{arch} DIR (a folder of its public modeling code) is needed for {sorted(n for n in names if PRESETS[n] == arch)}")
    records = []
    with tempfile.TemporaryDirectory(prefix="mmrl-real-arch-") as tmp:
        work = Path(tmp)
        checkpoints = {}
        for arch in sorted(needs):
            try:
                build = llada_checkpoint if arch == "llada" else dream_checkpoint
                checkpoints[arch] = build(getattr(args, arch), work / arch)
            except Exception as e:  # noqa: BLE001 - recorded, the other architectures still run
                for n in names:
                    if PRESETS[n] == arch:
                        records.append({"preset": n, "architecture": arch, "passed": False,
                                        "error": f"building the checkpoint: {type(e).__name__}: {e}",
                                        "traceback": traceback.format_exc(limit=4)})
        for n in names:
            if PRESETS[n] in ("llada", "dream") and PRESETS[n] not in checkpoints:
                continue
            try:
                rec = run_preset(n, PRESETS[n], checkpoints, work, args.dllm_backbone)
            except Exception as e:  # noqa: BLE001
                rec = {"preset": n, "architecture": PRESETS[n], "passed": False, "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()}
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "traceback"}), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    failed = [r["preset"] for r in records if not r["passed"]]
    print(f"{len(records) - len(failed)} of {len(records)} presets passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
