"""TRL's `GRPOTrainer` call form for `mmrl.Trainer`:

    Trainer(model="path/to/model" | PreTrainedModel, reward_funcs=..., args=TrainConfig(...), train_dataset=...,
            eval_dataset=..., processing_class=tokenizer, peft_config=LoraConfig(...))

The family is picked from the model: its class (a `PreTrainedModel` object) or its directory (`mmrl_adapter.json`,
else `config.json`'s `model_type` / `architectures`). `peft_config` is peft's own `LoraConfig` (DoRA, rsLoRA and
every other LoRA option as peft takes them), applied to the policy, whose reference is then the adapter-disabled
base, as in TRL.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

MASKED_DIFFUSION_TYPES = ("llada", "dream", "llada_moe")
"""`model_type`s of the masked-diffusion LMs (remote-code checkpoints)."""


class ModelFamilyError(ValueError):
    """The family of a model given to `Trainer(model=...)` cannot be told; the message names the class or path."""


def family_from_config(model_type: str | None, architectures: list[str] | None, class_name: str = "") -> str | None:
    """The mmrl family of a transformers model, from its `model_type` and architecture class names; None if none
    fits."""
    mt = (model_type or "").lower()
    names = [*(architectures or []), class_name]
    if mt in ("qwen2_vl", "qwen2_5_vl") or any(n.startswith(("Qwen2VL", "Qwen2_5_VL")) for n in names):
        return "vlm"
    if "janus" in mt or any(n.startswith(("Janus", "MultiModalityCausalLM")) for n in names):
        return "janus"
    if mt in MASKED_DIFFUSION_TYPES or any(n.startswith(("LLaDA", "Dream")) for n in names):
        return "masked_diffusion"
    if any(n.endswith("ForCausalLM") or n.endswith("LMHeadModel") for n in names):
        return "causal_lm"
    return None


def family_of_model(model) -> str:
    """The family of a model object: its class (diffusers' UVit2DModel: masked_image)."""
    name = type(model).__name__
    if name == "UVit2DModel":
        return "masked_image"
    cfg = getattr(model, "config", None)
    fam = family_from_config(getattr(cfg, "model_type", None), getattr(cfg, "architectures", None), name)
    if fam is None:
        raise ModelFamilyError(f"Trainer(model=...): cannot tell the family of a {name} (model_type "
                               f"{getattr(cfg, 'model_type', None)!r}); pass args=TrainConfig(family=...) with one of "
                               "causal_lm, vlm, janus, masked_diffusion, masked_image")
    return fam


def family_of_path(path: str | Path) -> str:
    """The family of a model directory: `mmrl_adapter.json`, else `config.json` (a diffusers snapshot with a
    `transformer/` UVit2D: masked_image)."""
    p = Path(path).expanduser()
    meta = p / "mmrl_adapter.json"
    if meta.is_file():
        fam = json.loads(meta.read_text()).get("family")
        if fam:
            return fam
    if (p / "model_index.json").is_file() or (p / "transformer" / "config.json").is_file():
        return "masked_image"
    conf = p / "config.json"
    if conf.is_file():
        c = json.loads(conf.read_text())
        fam = family_from_config(c.get("model_type"), c.get("architectures"))
        if fam is not None:
            return fam
        raise ModelFamilyError(f"Trainer(model={str(path)!r}): cannot tell the family from its config.json (model_type "
                               f"{c.get('model_type')!r}, architectures {c.get('architectures')}); pass "
                               "args=TrainConfig(family=...)")
    if (p / "adapter_config.json").is_file():
        raise ModelFamilyError(f"Trainer(model={str(path)!r}) is a LoRA adapter folder; pass its base model and "
                               "peft_config, or the merged model")
    raise ModelFamilyError(f"Trainer(model={str(path)!r}): not a model directory (no config.json); models are never "
                           "downloaded at run time: download it once and pass its local path")


def policy_from_model(model, family: str, processing_class=None):
    """The family's adapter around a model object, with `processing_class` (TRL's name for the tokenizer or
    processor), else the one saved beside the model (`model.name_or_path`)."""
    from mmrl.models import adapter_class

    cls = adapter_class(family)
    if family not in ("causal_lm", "vlm"):
        raise ModelFamilyError(f"Trainer(model=<{type(model).__name__}>): a {family} model is given by its directory "
                               "(model='path/to/model'), which holds the parts its adapter needs")
    proc = processing_class
    if proc is None:
        src = getattr(model, "name_or_path", None) or getattr(getattr(model, "config", None), "_name_or_path", None)
        if not src or not Path(str(src)).is_dir():
            raise ModelFamilyError(f"Trainer(model=<{type(model).__name__}>): pass processing_class=<tokenizer> (the model "
                                   f"was not loaded from a local directory holding one: {src!r})")
        proc = cls._load_processor(Path(str(src)), local_files_only=True)
    model.eval()  # dropout off: the first ratio must be exactly 1
    return cls(model, proc)


def resolve_call(cfg, args, model, peft_config, processing_class, train_dataset, eval_dataset):
    """(cfg, policy or None, train rows or None, eval rows or None) of a TRL-style call."""
    from mmrl.config.train_config import TrainConfig, build_config

    if cfg is not None and args is not None:
        raise TypeError("Trainer: give the configuration once (cfg or args=)")
    cfg = args if args is not None else cfg
    if cfg is None:
        cfg = TrainConfig()
    elif isinstance(cfg, dict):
        cfg = build_config(cfg, validate=False)
    elif not isinstance(cfg, TrainConfig):
        raise TypeError(f"Trainer: args must be a mmrl TrainConfig (or a dict of its fields), got {type(cfg).__name__}; "
                        "a TRL GRPOConfig's fields go into TrainConfig under the same names (README.md, \"TRL GRPOConfig fields\")")
    changes: dict[str, Any] = {}
    policy = None
    if isinstance(model, (str, Path)):
        changes["model_name_or_path"] = str(model)
        if "family" not in cfg._explicit:
            changes["family"] = family_of_path(model)
    elif model is not None:
        family = family_of_model(model) if "family" not in cfg._explicit else cfg.family
        changes["family"] = family
        src = getattr(model, "name_or_path", None)
        if src and Path(str(src)).is_dir():
            changes["model_name_or_path"] = str(src)  # the LoRA base and the model card name it
        policy = policy_from_model(model, family, processing_class)
    if peft_config is not None:
        changes["use_peft"] = True
    if changes:
        cfg = dataclasses.replace(cfg, **changes)
    vlm = cfg.family == "vlm"
    return cfg, policy, _rows(train_dataset, vlm), _rows(eval_dataset, vlm)


def _rows(ds, vlm: bool = False):
    """A `datasets.Dataset` (or any sequence of dicts) as a list of row dicts, features decoded (an `Image` column
    gives PIL images); None stays None. For a VLM, TRL's `image` / `images` column goes into the prompt
    (`{"prompt": ..., "images": [...]}`, the VLM adapter's form) and stays a column for the rewards."""
    if ds is None:
        return None
    if hasattr(ds, "to_list") and "Image(" not in repr(getattr(ds, "features", "")):
        rows = ds.to_list()  # arrow's fast path: nothing to decode
    else:
        rows = [dict(r) for r in ds]  # row access decodes image features to PIL (to_list gives {"bytes", "path"})
    if vlm:
        for r in rows:
            imgs = r.get("images") if r.get("images") is not None else r.get("image")
            if imgs is not None and not isinstance(r.get("prompt"), dict):
                r["prompt"] = {"prompt": r["prompt"], "images": list(imgs) if isinstance(imgs, (list, tuple)) else [imgs]}
    return rows
