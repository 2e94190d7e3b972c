"""The final model of a run, in `output_dir` itself (TRL's `trainer.save_model(output_dir)`): what
`AutoModelForCausalLM.from_pretrained(output_dir)` (or the family's `from_pretrained`) loads, a short model card
(`README.md`: method, base, rewards, the settings that differ from the defaults), and the upload to the Hub when
`push_to_hub` is set.

- A full fine-tune: the adapter's `save_pretrained` (safetensors weights, config, tokenizer / processor,
  `mmrl_adapter.json`).
- LoRA on a base that is a local directory: the adapter in peft's format (`adapter_model.safetensors`,
  `adapter_config.json`), its `base_model_name_or_path` the base as configured (a relative path stays relative, as
  TRL writes the name it was given), which transformers' peft integration loads with the base.
- LoRA on a base with no directory (`tiny`, a model object given in Python): the adapters merged into the weights,
  so that the folder loads on its own.
- DoRA (`use_dora`): the adapters merged into the weights, and the adapter in peft's format in `adapter/`
  (`peft.PeftModel.from_pretrained(base, output_dir / "adapter")`): transformers' peft integration (5.x, with peft
  0.21) loads a DoRA adapter folder without its magnitude vectors (it reports them missing and re-initialises them),
  which would give another model than the one trained.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from mmrl.models.base import is_peft_model

logger = logging.getLogger(__name__)

CARD = "README.md"
"""The model card's file name (the Hub shows it)."""

DORA_ADAPTER_DIR = "adapter"
"""Where a DoRA run's final adapter goes, beside the merged model (see the module docstring)."""

MAX_CARD_SETTINGS = 40
"""Settings the card lists (those that differ from TrainConfig's defaults, most relevant first)."""


def _base_dir(base: str | None) -> str | None:
    """The base model as a loadable local directory string, or None (tiny, tiny-world, an in-memory model)."""
    if base is None or base == "tiny" or ":" in str(base) and not Path(str(base)).is_dir():
        return None
    return str(base) if Path(str(base)).expanduser().is_dir() else None


def write_final_model(policy, out_dir: Path, *, base_model: str | None, config: dict[str, Any], reward_names: Sequence[str],
                      full_state: dict | None = None) -> list[str]:
    """Write the final model and its card into `out_dir`; returns the names of the files written there."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = _base_dir(base_model)
    dora = is_peft_model(policy.model) and uses_dora(policy.unwrapped)
    if is_peft_model(policy.model) and base is not None and not dora:
        policy.unwrapped.save_pretrained(out_dir)
        _set_adapter_base(out_dir, base)
        (out_dir / "mmrl_adapter.json").write_text(json.dumps(
            {"family": policy.family, "peft_adapter": True, "base_model": base,
             "generation_defaults": getattr(policy, "generation_defaults", {})}, indent=2, default=str) + "\n")
        kind = f"LoRA adapter on `{base}`"
    else:
        policy.save_pretrained(out_dir)  # a peft model is merged into its base weights here
        if full_state is not None and not is_peft_model(policy.model):
            from mmrl.checkpointing.sharded_save import write_full_weights

            write_full_weights(out_dir, full_state)
        kind = "full model" + (" (LoRA merged into the base weights)" if is_peft_model(policy.model) else "")
        if dora and base is not None:
            policy.unwrapped.save_pretrained(out_dir / DORA_ADAPTER_DIR)
            _set_adapter_base(out_dir / DORA_ADAPTER_DIR, base)
            kind = (f"full model (DoRA merged into the base weights); the DoRA adapter on `{base}` is in "
                    f"`{DORA_ADAPTER_DIR}/`")
    (out_dir / CARD).write_text(model_card(config, reward_names, base_model=base_model, kind=kind))
    return sorted(_model_files(out_dir))


def uses_dora(model) -> bool:
    """Whether a peft model's adapters are DoRA (`use_dora` in any of its LoRA configs)."""
    return any(bool(getattr(c, "use_dora", False)) for c in getattr(model, "peft_config", {}).values())


def _model_files(out_dir: Path) -> set[str]:
    names = ("config.json", "generation_config.json", "adapter_config.json", "mmrl_adapter.json", CARD, "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "preprocessor_config.json",
             "processor_config.json", "vocab.json", "merges.txt")
    found = {n for n in names if (out_dir / n).is_file()}
    found |= {p.name for p in out_dir.glob("*.safetensors")} | {p.name for p in out_dir.glob("*.safetensors.index.json")}
    return found


def _set_adapter_base(out_dir: Path, base: str) -> None:
    """peft writes the base's `name_or_path`; write the base as configured instead."""
    f = out_dir / "adapter_config.json"
    if f.is_file():
        cfg = json.loads(f.read_text())
        cfg["base_model_name_or_path"] = base
        f.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _changed_settings(config: dict[str, Any]) -> dict[str, Any]:
    from mmrl.config.train_config import TrainConfig

    defaults = TrainConfig(method=config.get("method", "grpo")).to_dict()
    skip = {"output_dir", "report_to", "progress_bar", "resume_from", "push_to_hub", "hub_model_id", "hub_private_repo"}
    return {k: v for k, v in config.items() if k not in skip and k in defaults and defaults[k] != v}


def model_card(config: dict[str, Any], reward_names: Sequence[str], *, base_model: str | None, kind: str) -> str:
    """A short model card: YAML metadata the Hub reads, then the method, base, rewards and changed settings."""
    import yaml

    method = config.get("method", "grpo")
    meta: dict[str, Any] = {"library_name": "transformers", "tags": ["mmrl", "reinforcement-learning", method]}
    if _base_dir(base_model) is None and base_model and base_model != "tiny":
        meta["base_model"] = str(base_model)
    elif base_model and base_model != "tiny":
        meta["base_model"] = Path(str(base_model)).name
    settings = dict(list(_changed_settings(config).items())[:MAX_CARD_SETTINGS])
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"# {config.get('run_name') or Path(str(config.get('output_dir', 'model'))).name}", "",
             f"Trained with mmrl by **{method}** on the `{config.get('family')}` family "
             f"({kind}); base model: `{base_model}`.", "",
             f"- Rewards: {', '.join(f'`{r}`' for r in reward_names) or 'none'}"
             + (f" (weights {config.get('reward_weights')})" if config.get("reward_weights") else ""),
             f"- Task / data: `{config.get('task')}`" + (f", `{config.get('dataset_path')}`" if config.get("dataset_path") else ""),
             f"- Steps: {config.get('max_steps')}, group size {config.get('num_generations')}, learning rate "
             f"{config.get('learning_rate')}", "",
             "Settings that differ from mmrl's defaults (the whole configuration is in the run's "
             "`trainer_state.json` of each checkpoint):", "", "```yaml",
             yaml.safe_dump(settings, sort_keys=True, default_flow_style=None).strip() if settings else "{}", "```", ""]
    return "\n".join(lines)


def push_final_model(out_dir: Path, files: Sequence[str], *, hub_model_id: str | None, private: bool | None) -> str:
    """Upload `files` of `out_dir` to the Hub repository `hub_model_id` (default: the folder's name), creating it;
    returns the repository id. Needs a token (checked at start-up by `TrainConfig.validate`)."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = hub_model_id or Path(out_dir).resolve().name
    repo_id = api.create_repo(repo, private=private, exist_ok=True).repo_id
    api.upload_folder(repo_id=repo_id, folder_path=str(out_dir), allow_patterns=list(files),
                      commit_message="mmrl: final model")
    logger.info("pushed the final model to https://huggingface.co/%s", repo_id)
    return repo_id
