"""Tiny random models of every family, for tests, the bitwise refactor check and `model_name_or_path: tiny`.

Real transformers / diffusers classes in tiny configurations (a few thousand to ~100k parameters), seeded without
touching the global RNG, over the offline tokenizers of `mmrl.models.tokenizers`: never a download. The adapters
reach them as `Adapter.tiny(...)` (`mmrl.models.base.BaseAdapter.tiny`), or `mmrl.models.tiny_policy(family)`.
Each factory takes the adapter class to build (a subclass, say) first; None is the family's adapter.
"""
from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from mmrl.models import causal_lm, janus, masked_diffusion, masked_image, vlm
from mmrl.models.image_codecs import ImageCodec

FACTORIES: dict[str, Any] = {}
"""family -> its tiny factory fn(cls=None, *, seed=0, **options) -> adapter."""


def _family(name: str):
    def deco(fn):
        FACTORIES[name] = fn
        return fn

    return deco


@_family("causal_lm")
def tiny_causal_lm(cls=None, *, seed: int = 0, **overrides: Any) -> "causal_lm.CausalLMAdapter":
    """A tiny randomly initialised `Qwen2ForCausalLM` (hidden 32, 2 layers, ~25k parameters) over the offline
    char tokenizer (`models.tokenizers.char_tokenizer`), seeded without touching the global RNG.

    `overrides`: generation options (see `GENERATION_DEFAULTS`; `max_new_tokens` defaults to 16 here),
    `ref_model=True` for an identical frozen reference copy, anything else is a `Qwen2Config` field.
    """
    cls = cls or causal_lm.CausalLMAdapter
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.models.tokenizers import char_tokenizer

    tok = char_tokenizer()
    gen = {k: overrides.pop(k) for k in list(overrides) if k in causal_lm.GENERATION_DEFAULTS}
    gen.setdefault("max_new_tokens", 16)
    with_ref = bool(overrides.pop("ref_model", False))
    cfg = dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    cfg.update(overrides)
    config = Qwen2Config(**cfg)

    def build() -> torch.nn.Module:
        return _seeded_model(Qwen2ForCausalLM, config, tok, seed)

    return cls(build(), tok, ref_model=build() if with_ref else None, **gen)


def _seeded_model(model_cls, config, tok, seed: int) -> torch.nn.Module:
    """`model_cls(config)` initialised from `seed` without touching the global RNG, its generation config carrying the
    tokenizer's special ids, in eval mode."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        m = model_cls(config)
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.pad_token_id
    m.generation_config.bos_token_id = tok.bos_token_id
    return m.eval()


@_family("vlm")
def tiny_vlm(cls=None, *, seed: int = 0, model_type: str = "qwen2_5_vl", **overrides: Any) -> "vlm.VLMAdapter":
    """A tiny randomly initialised `Qwen2_5_VLForConditionalGeneration` (text: hidden 32, 2 layers; vision: 1
    block of width 32 on 4-pixel patches; ~50k parameters) with `tiny_processor()`, seeded without touching
    the global RNG. `model_type="qwen3_vl"`: the same sizes as a `Qwen3VLForConditionalGeneration` (learned
    absolute position embeddings for an 8 x 8 patch grid, resampled to other grids by the model; no DeepStack
    layers unless `vision_config={"deepstack_visual_indexes": [...]}`).

    `overrides`: generation options (`max_new_tokens` defaults to 16 here), `ref_model=True` for an identical
    frozen reference copy, `min_pixels` / `max_pixels` / `words` (a word-level tokenizer) for `tiny_processor`, `text_config={...}` /
    `vision_config={...}` field overrides, other top-level config fields.
    """
    cls = cls or vlm.VLMAdapter
    import transformers

    if model_type not in ("qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"tiny_vlm: model_type must be 'qwen2_5_vl' or 'qwen3_vl', got {model_type!r}")
    qwen3 = model_type == "qwen3_vl"
    processor = cls.tiny_processor(model_type=model_type, **{k: overrides.pop(k) for k in ("min_pixels", "max_pixels", "words") if k in overrides})
    tok = processor.tokenizer
    gen = {k: overrides.pop(k) for k in list(overrides) if k in causal_lm.GENERATION_DEFAULTS}
    gen.setdefault("max_new_tokens", 16)
    with_ref = bool(overrides.pop("ref_model", False))
    text = dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )
    text.update(overrides.pop("text_config", {}))
    if qwen3:  # Qwen3VLTextConfig's head_dim defaults to 128 rather than hidden / heads
        text.setdefault("head_dim", text["hidden_size"] // text["num_attention_heads"])
        text.pop("bos_token_id", None), text.pop("eos_token_id", None)  # not fields of Qwen3VLTextConfig
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=4, spatial_merge_size=2,
        temporal_patch_size=2, out_hidden_size=text["hidden_size"],
        **(dict(num_position_embeddings=64, deepstack_visual_indexes=[]) if qwen3 else dict(window_size=16, fullatt_block_indexes=[0])),
    )
    vision.update(overrides.pop("vision_config", {}))
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in zip(
        ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), vlm.VISION_TOKENS)}
    config_cls, model_cls = ((transformers.Qwen3VLConfig, transformers.Qwen3VLForConditionalGeneration) if qwen3
                             else (transformers.Qwen2_5_VLConfig, transformers.Qwen2_5_VLForConditionalGeneration))
    config = config_cls(text_config=text, vision_config=vision, **{**ids, **overrides})

    def build() -> torch.nn.Module:
        return _seeded_model(model_cls, config, tok, seed)

    return cls(build(), processor, ref_model=build() if with_ref else None, **gen)


@_family("janus")
def tiny_janus(
    cls=None,
    *,
    seed: int = 0,
    grid: tuple[int, int] = (8, 8),
    codebook_size: int | None = None,
    codec: str | ImageCodec = "palette",
    palette: Sequence[Sequence[int]] | None = None,
    cell_px: int = 4,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    init_std: float = 0.02,
    ref_model: bool = False,
    vocabulary: Sequence[str] | None = None,
    image_positions_2d: bool = False,
    **generation_defaults: Any,
) -> "janus.JanusAdapter":
    """A tiny randomly initialised `JanusForConditionalGeneration` (seeded) with the offline char tokenizer.

    Args:
        grid: (h, w) image tokens; the VQ codec needs h == w.
        codebook_size: image codebook size (default: len(palette), or 8 for the default palette / VQ codec).
        codec: "palette" (`PaletteCodec`, exact), "vq" (the tiny model's own random VQ decoder), or an
            `ImageCodec` instance (e.g. a `PatchCodec`; its grid and codebook size win).
        palette: RGB colours for the palette codec (default: `DEFAULT_PALETTE[:codebook_size]`).
        cell_px: pixels per grid cell (palette codec).
        hidden_size, num_layers, num_heads: the Llama language model's size.
        init_std: `initializer_range` of the random init.
        ref_model: also build an identical frozen reference copy.
        vocabulary: texts whose words make a word-level tokenizer (`word_tokenizer`; prompts become ~10
            tokens); default the char-level tokenizer.
        image_positions_2d: give the image tokens learned row / column embeddings (`models/image_positions.py`).
    """
    cls = cls or janus.JanusAdapter
    from transformers import JanusConfig, JanusForConditionalGeneration

    from mmrl.models.tokenizers import char_tokenizer, word_tokenizer, words_of

    codec_obj = codec if not isinstance(codec, str) else None
    if codec_obj is not None:
        if not isinstance(codec_obj, ImageCodec):
            raise TypeError(f"codec must be 'palette', 'vq' or an ImageCodec, got {type(codec).__name__}")
        grid, codebook_size, codec = codec_obj.grid, codec_obj.codebook_size, "given"
    h, w = (int(g) for g in grid)
    if codec not in ("palette", "vq", "given"):
        raise ValueError(f"codec must be 'palette', 'vq' or an ImageCodec, got {codec!r}")
    if codec == "vq" and h != w:
        raise ValueError(f"the VQ codec decodes square grids only (vq_config.num_patches squared), got {grid}")
    if palette is not None and codebook_size is not None and len(palette) != codebook_size:
        raise ValueError(f"palette has {len(palette)} colours but codebook_size={codebook_size}")
    k = codebook_size or (len(palette) if palette is not None else 8)
    if vocabulary is not None:
        texts = [janus.JANUS_T2I_TEMPLATE.format(prompt=t) for t in vocabulary]
        for special in janus.JANUS_SPECIAL_TOKENS:  # special tokens are matched whole, not split into words
            texts = [t.replace(special, " ") for t in texts]
        tokenizer = word_tokenizer(words_of(texts), janus.JANUS_SPECIAL_TOKENS)
    else:
        tokenizer = char_tokenizer(janus.JANUS_SPECIAL_TOKENS, chat_template=False)
    boi = tokenizer.convert_tokens_to_ids("<begin_of_image>")
    text = dict(
        model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=1024, initializer_range=init_std, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    # the understanding tower is unused by text-to-image; keep it minimal but consistent with the grid
    vision = dict(image_size=2 * h, patch_size=2, num_image_tokens=h * w, hidden_size=hidden_size,
                  projection_dim=hidden_size, num_hidden_layers=1, num_attention_heads=num_heads, mlp_ratio=2,
                  initializer_range=init_std)
    vq = dict(embed_dim=8, num_embeddings=k, latent_channels=32, base_channels=32,  # GroupNorm(32) needs >= 32
              channel_multiplier=[1, 1] if codec == "vq" else [1], num_res_blocks=1, projection_dim=hidden_size,
              image_token_embed_dim=hidden_size, initializer_range=init_std)
    config = JanusConfig(text_config=text, vision_config=vision, vq_config=vq,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image_placeholder>"))

    def build() -> torch.nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = JanusForConditionalGeneration(config)
        gen = model.generation_config
        gen.pad_token_id, gen.bos_token_id = text["pad_token_id"], text["bos_token_id"]
        gen.eos_token_id = text["eos_token_id"]
        gen.boi_token_id = boi
        gen.generation_kwargs = {"boi_token_id": boi}
        gen.guidance_scale, gen.temperature = 5.0, 1.0
        gen._from_model_config = False  # else extra fields (boi_token_id) are dropped on reload
        if image_positions_2d:
            janus.image_positions.attach(model, (h, w), hidden_size)
        return model.eval()

    model = build()
    if codec_obj is not None:
        image_codec: ImageCodec = codec_obj
    elif codec == "vq":
        image_codec = janus.VQCodec(model)
    elif palette is not None:
        image_codec = janus.PaletteCodec(palette, grid=(h, w), cell_px=cell_px)
    else:
        image_codec = janus.PaletteCodec.default(k, grid=(h, w), cell_px=cell_px)
    return cls(model, tokenizer, ref_model=build() if ref_model else None, codec=image_codec, **generation_defaults)


@_family("masked_diffusion")
def tiny_masked_diffusion(cls=None, *, seed: int = 0, arch: str = "llama", ref_model: bool = False, **overrides) -> "masked_diffusion.MaskedDiffusionAdapter":
    """A tiny random bidirectional Llama (or `arch="qwen2"`) with the offline char tokenizer (`<mask>` = 4).

    `overrides`: sampling options (`GENERATION_KEYS`), adapter keys (`shift_logits`, `mask_token_id`, ...) or
    config fields (`hidden_size`, `num_hidden_layers`, `initializer_range`, `attn_implementation`, ...).
    Default size: hidden 32, 2 layers, 4 heads (2 KV heads), ~25k parameters.
    """
    cls = cls or masked_diffusion.MaskedDiffusionAdapter
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from mmrl.models.tokenizers import char_tokenizer

    archs = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in archs:
        raise ValueError(f"unknown tiny arch {arch!r}; valid: {sorted(archs)}")
    tok = char_tokenizer()
    gen = {k: overrides.pop(k) for k in list(overrides) if k in masked_diffusion.GENERATION_KEYS}
    adapter_kw = {k: overrides.pop(k) for k in list(overrides) if k in masked_diffusion._ADAPTER_KEYS}
    shift = adapter_kw.pop("shift_logits", False)
    cfg = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    cfg.update(overrides)
    config_cls, model_cls = archs[arch]
    config = config_cls(**cfg)
    config.is_causal = False
    config.mask_token_id = tok.mask_token_id
    config.shift_logits = bool(shift)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    ref = copy.deepcopy(model) if ref_model else None
    return cls(model, tok, ref_model=ref, **adapter_kw, **gen)


@_family("masked_image")
def tiny_masked_image(cls=None, *, seed: int = 0, ref_model: bool = False, words: Sequence[str] = ("a", "photo", "of", "red", "square", "say"),
         codec: ImageCodec | None = None, grid: int = 4, codebook_size: int = 8, **overrides) -> "masked_image.MaskedImageAdapter":
    """A tiny random aMUSEd (`tiny_amused_components`) as a policy; `overrides`: generation options or component
    sizes (`hidden_size`, `num_hidden_layers`, `text_hidden_size`, `text_layers`, `model_max_length`)."""
    cls = cls or masked_image.MaskedImageAdapter
    gen = {k: overrides.pop(k) for k in list(overrides) if k in masked_image.GENERATION_KEYS}
    if codec is not None:
        grid, codebook_size = codec.grid[0], codec.codebook_size
    parts = masked_image.tiny_amused_components(seed=seed, words=words, grid=grid, codebook_size=codebook_size, **overrides)
    ref = copy.deepcopy(parts["transformer"]) if ref_model else None
    return cls(parts["transformer"], parts["vqvae"], parts["text_encoder"], parts["tokenizer"],
               mask_token_id=parts["scheduler"].config.mask_token_id, ref_model=ref, codec=codec,
               **{"cfg_scale": 2.0, "num_steps": 4, **gen})
