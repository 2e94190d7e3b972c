"""From a `TrainConfig` to a ready policy adapter: load or build the model, the reference, LoRA, and the options
the trainer passes to `sample` and `logprob`."""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from mmrl.config.train_config import TrainConfig


def needs_reference(cfg: TrainConfig) -> bool:
    """Whether the method needs a frozen reference model (KL term, DGPO's deviation, DMPO's target, the entropy
    reward's reference entropies)."""
    from mmrl.methods import method_class

    return method_class(cfg.method).needs_reference(cfg)


def wants_reference(cfg: TrainConfig, policy) -> bool:
    """Whether `policy` should get a frozen copy of itself as its reference: it has none and the method needs one,
    or the diagnostics' KL to the base asks for one (`mmrl.core.diagnostics.wants_diagnostic_reference`). Never with
    LoRA: the reference is the adapter-disabled base."""
    from mmrl.core.diagnostics import wants_diagnostic_reference

    return not cfg.use_peft and not policy.has_reference and (needs_reference(cfg) or wants_diagnostic_reference(cfg, policy))


def mix_into_reference(ref_model: torch.nn.Module, model: torch.nn.Module, alpha: float) -> None:
    """TRL's `sync_ref_model` update of the reference, `ref <- alpha * policy + (1 - alpha) * ref`
    (`mmrl.algorithms.reference_sync`)."""
    from mmrl.algorithms.reference_sync import mix_into_reference as mix

    mix(ref_model, model, alpha)


def family_class(cfg: TrainConfig):
    """The adapter class of the configured family: what the loop must know of a family, as class attributes."""
    from mmrl.models import adapter_class

    return adapter_class(cfg.family)


def generation_options(cfg: TrainConfig) -> dict[str, Any]:
    """The `sample()` options of the configured family (the adapter's `generation_options`), then the config's
    `generation_kwargs`."""
    from mmrl.models import adapter_class

    opts = adapter_class(cfg.family).generation_options(cfg)
    if cfg.chat_template_kwargs:
        opts["chat_template_kwargs"] = dict(cfg.chat_template_kwargs)
    opts.update(cfg.generation_kwargs)
    return opts


def estimator_options(cfg: TrainConfig, mask_seed: int, *, kind: str | None = None) -> dict[str, Any]:
    """`logprob()` options of the configured family (the adapter's `estimator_options`)."""
    from mmrl.models import adapter_class

    return adapter_class(cfg.family).estimator_options(cfg, mask_seed, kind=kind)


def model_source(src: str):
    """The registered loader of a `PREFIX:NAME` model (`mmrl.core.registry.MODEL_SOURCES`), or None for a directory.

    A `PREFIX:NAME` that is neither a registered source nor an existing path raises, naming the sources."""
    import re

    from mmrl.core.registry import MODEL_SOURCES

    prefix, sep, _ = src.partition(":")
    if not sep:
        return None
    if prefix in MODEL_SOURCES:
        return MODEL_SOURCES[prefix]
    if re.fullmatch(r"[a-z][a-z0-9_-]+", prefix) and not os.path.exists(src):
        MODEL_SOURCES[prefix]  # raises: unknown model source, with the registered ones and where more come from
    return None


class ModelSourceError(FileNotFoundError):
    """A model directory that does not exist (or is no model directory); the message names the path."""


def check_model_source(cfg: TrainConfig) -> None:
    """The model (and reference) directories exist and hold a config, checked before anything loads: models are
    never downloaded at run time, so anything but `tiny`, `tiny-world:NAME` or a local directory is an error."""
    for key in ("model_name_or_path", "ref_model_name_or_path"):
        src = getattr(cfg, key)
        if src is None or src == "tiny" or str(src).startswith("tiny-world:"):
            continue
        path = Path(src).expanduser()
        if not path.is_dir():
            raise ModelSourceError(f"{key}={src!r}: no such model directory (models are never downloaded at run time; "
                                   "download it once, e.g. `huggingface-cli download`, and pass its local path)")
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json", "mmrl_adapter.json", "model_index.json")):
            raise ModelSourceError(f"{key}={src!r}: the directory holds no config.json (nor a diffusers model_index.json), so it "
                                   "is not a saved model")


def build_policy(cfg: TrainConfig, device: torch.device | str | None = None):
    """The configured adapter, with a reference model when the method needs one and LoRA when asked."""
    from mmrl.models import adapter_class

    cls = adapter_class(cfg.family)
    want_ref = needs_reference(cfg) and not cfg.use_peft
    gen = generation_options(cfg)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.torch_dtype]
    src = cfg.model_name_or_path
    source = model_source(src)
    if src == "tiny":
        policy = cls.tiny(seed=cfg.seed)
    elif source is not None:
        policy = source(src.split(":", 1)[1], family=cfg.family)
    else:
        quant = {"quantization_config": quantization_config(cfg)} if cfg.load_in_4bit or cfg.load_in_8bit else {}
        policy = cls.from_pretrained(src, trust_remote_code=cfg.trust_remote_code, dtype=dtype, device=device,
                                     ref_model=(cfg.ref_model_name_or_path or True) if want_ref else False, **quant)
    set_generation_defaults(policy, gen)
    if (want_ref and policy.ref_model is None) or wants_reference(cfg, policy):
        if cfg.ref_model_name_or_path:
            ref = cls.from_pretrained(cfg.ref_model_name_or_path, trust_remote_code=cfg.trust_remote_code, dtype=dtype).model
        else:
            ref = copy.deepcopy(policy.unwrapped)
        ref.requires_grad_(False)
        ref.eval()
        policy.ref_model = ref
    if cfg.attn_implementation is not None:
        set_attention(policy, cfg.attn_implementation)
    if src == "tiny" or source is not None:
        policy.model.to(dtype)
        if policy.ref_model is not None:
            policy.ref_model.to(dtype)
    if device is not None:
        if not is_quantized(policy.model):  # placed by device_map as it loaded; bitsandbytes models cannot move
            policy.model.to(device)
        if policy.ref_model is not None:
            policy.ref_model.to(device)
    policy.model.eval()  # dropout off: the importance ratio must be exactly 1 at the first inner step
    return policy


class AttentionError(ValueError):
    """The model cannot switch to the configured `attn_implementation` (kernel not installed, or unsupported)."""


def set_attention(policy, name: str) -> None:
    """transformers' `set_attn_implementation(name)` on the policy and the reference (TRL passes
    `attn_implementation` to `from_pretrained`; switching after loading is the same setting)."""
    for role, model in (("model", policy.model), ("reference", policy.ref_model)):
        if model is None:
            continue
        if not hasattr(model, "set_attn_implementation"):
            raise AttentionError(f"attn_implementation={name!r}: the {role} ({type(model).__name__}) is no transformers model "
                                 "with an attention switch; leave attn_implementation null")
        try:
            model.set_attn_implementation(name)
        except (ImportError, ValueError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AttentionError(f"attn_implementation={name!r} cannot be used with {type(model).__name__}: {first}") from None


def quantization_config(cfg: TrainConfig):
    """transformers' `BitsAndBytesConfig` of `load_in_4bit` / `load_in_8bit`, as TRL's `get_quantization_config`
    builds it: the 4-bit compute dtype is torch_dtype (TRL: `dtype`), the storage dtype `bnb_4bit_quant_storage`."""
    from transformers import BitsAndBytesConfig

    if cfg.load_in_4bit:
        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "uint8": torch.uint8}
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtypes[cfg.torch_dtype],
                                  bnb_4bit_quant_type=cfg.bnb_4bit_quant_type, bnb_4bit_use_double_quant=cfg.use_bnb_nested_quant,
                                  bnb_4bit_quant_storage=dtypes[cfg.bnb_4bit_quant_storage or "uint8"])
    return BitsAndBytesConfig(load_in_8bit=True)


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether `model` (or the base under its peft wrapper) was loaded in 4 or 8 bits by bitsandbytes."""
    base = getattr(model, "base_model", model)
    base = getattr(base, "model", base)
    return any(bool(getattr(m, flag, False)) for m in (model, base) for flag in ("is_loaded_in_4bit", "is_loaded_in_8bit"))


def attach_rollout_engine(policy, cfg: TrainConfig) -> None:
    """use_vllm: a colocated vLLM engine over the policy's model directory generates its rollouts
    (`models/vllm_engine.py`; multimodal for the vlm family); the policy's own sampler otherwise."""
    if not cfg.use_vllm:
        return
    if cfg.vllm_mode != "colocate":  # validation refuses the others; a config built without validation lands here
        raise ValueError(f"vllm_mode={cfg.vllm_mode!r}: only colocate is implemented")
    from mmrl.models.vllm_engine import VLLMEngine

    policy.rollout_engine = VLLMEngine(cfg.model_name_or_path, dtype=cfg.torch_dtype,
                                       gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                       max_model_len=cfg.vllm_max_model_length, seed=cfg.seed,
                                       multimodal=getattr(policy, "family", None) == "vlm")


def set_generation_defaults(policy, gen: dict[str, Any]) -> None:
    """Merge the config's sampling options into the adapter's defaults, keeping only options it knows."""
    known = getattr(policy, "generation_defaults", {})
    policy.generation_defaults = {**known, **{k: v for k, v in gen.items() if k in known}}


def ensure_lora(model: torch.nn.Module, cfg: TrainConfig, peft_config=None) -> torch.nn.Module:
    """`model` with LoRA adapters when `cfg.use_peft` asks for them and it has none yet (`apply_lora`)."""
    from mmrl.models.base import is_peft_model

    return apply_lora(model, cfg, peft_config) if cfg.use_peft and not is_peft_model(model) else model


def apply_lora(model: torch.nn.Module, cfg: TrainConfig, peft_config=None) -> torch.nn.Module:
    """Wrap `model` with LoRA adapters (peft); the reference is then the adapter-disabled base (what d1 and DMPO do).

    Only the adapters train; with `lora_dropout = 0` (the default) the importance ratio stays exactly 1 at the first
    inner step."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:  # pragma: no cover - peft is in the lora / test extras
        raise ImportError("use_peft=true needs peft: pip install 'mmrl[lora]'") from e
    if is_quantized(model):  # QLoRA, as TRL prepares a k-bit base: frozen, norms in float32, input grads on
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=bool(cfg.gradient_checkpointing))
        for m in model.modules():
            # bitsandbytes' CPU backend repacks a 4-bit weight into an inference-only layout on the first no-grad
            # forward in eval mode, after which a forward with gradients fails; RL runs both in eval mode (rollouts,
            # then updates), so the weights keep their training layout
            if hasattr(m, "support_avx512bf16_for_cpu"):
                m.support_avx512bf16_for_cpu = False
    lcfg = peft_config if peft_config is not None else LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=cfg.lora_target_modules,
        use_dora=cfg.use_dora, use_rslora=cfg.use_rslora)
    return get_peft_model(model, lcfg)
