"""A sequence-classification reward model as a reward (TRL: `reward_funcs="OpenAssistant/reward-model-..."` or a
`PreTrainedModel` in `reward_funcs`), given as a local directory or a model object.

As TRL's `GRPOTrainer` scores it (`_calculate_rewards`): a conversational sample is the chat-formatted conversation
`prompt + completion` (the tokenizer's chat template, no generation prompt); a plain one is the string
`prompt + completion`; the texts are tokenized together, padded on the right, without added special tokens, and the
reward is the first logit (`logits[:, 0]`). A directory is loaded as `AutoModelForSequenceClassification` with
`num_labels=1`, from local files only; a tokenizer without a pad token pads with its EOS token, and the model's
`pad_token_id` is set to the tokenizer's (the model reads the last non-pad token). The reward's name is the last
part of the model's `name_or_path` (TRL's name). Deviation: texts are scored in chunks of `batch_size`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import torch

DEFAULT_BATCH_SIZE = 32
"""Texts per forward of the reward model."""


def is_reward_model_dir(spec: Any) -> bool:
    """A local directory holding a transformers sequence-classification model (its config names a
    `*ForSequenceClassification` architecture)."""
    if not isinstance(spec, (str, Path)):
        return False
    p = Path(spec).expanduser()
    conf = p / "config.json"
    if not conf.is_file():
        return False
    try:
        archs = json.loads(conf.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in archs)


def is_reward_model(obj: Any) -> bool:
    """A transformers model object with a classification head (`...ForSequenceClassification`)."""
    return isinstance(obj, torch.nn.Module) and type(obj).__name__.endswith("ForSequenceClassification")


def model_reward_name(model) -> str:
    """TRL's name of a reward model: the last part of its `name_or_path`."""
    src = getattr(model.config, "_name_or_path", None) or getattr(model, "name_or_path", None) or type(model).__name__
    return str(src).rstrip("/").split("/")[-1] or type(model).__name__


class SequenceClassifierReward:
    """A reward model as a reward function: `fn(prompts, completions, **kwargs) -> list[float]`.

    Args:
        model: a `*ForSequenceClassification` model, or a local directory holding one.
        tokenizer: its tokenizer (TRL's `reward_processing_classes`); default: the one saved with the model.
        batch_size: texts per forward.
        chat_template_kwargs: passed to `apply_chat_template` for conversational samples.
        trust_remote_code: for a directory whose model ships its own code.
    """

    def __init__(self, model, tokenizer=None, *, batch_size: int = DEFAULT_BATCH_SIZE, chat_template_kwargs: dict | None = None,
                 trust_remote_code: bool = False, device: str | torch.device | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if isinstance(model, (str, Path)):
            path = Path(model).expanduser()
            if not path.is_dir():
                raise FileNotFoundError(f"reward model {str(model)!r}: no such directory (models are never downloaded at run time)")
            kw = {"local_files_only": True, **({"trust_remote_code": True} if trust_remote_code else {})}
            model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, **kw)
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(str(path), **kw)
        elif tokenizer is None:
            src = getattr(model.config, "_name_or_path", None)
            if not src or not Path(str(src)).is_dir():
                raise ValueError(f"reward model {type(model).__name__}: pass its tokenizer (it was not loaded from a local "
                                 f"directory holding one: {src!r})")
            tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
        if device is not None:
            model.to(device)
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.__name__ = model_reward_name(model)

    def texts(self, prompts: Sequence, completions: Sequence) -> list[str]:
        """TRL's reward-model inputs: the chat-formatted conversation, or the concatenated strings."""
        if prompts and isinstance(prompts[0], list):
            return [self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False, **self.chat_template_kwargs)
                    for p, c in zip(prompts, completions)]
        return [str(p) + str(c) for p, c in zip(prompts, completions)]

    @torch.inference_mode()
    def __call__(self, prompts: Sequence, completions: Sequence, **kwargs: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        out: list[float] = []
        for s in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(text=texts[s : s + self.batch_size], return_tensors="pt", padding=True, padding_side="right",
                                 add_special_tokens=False)
            enc = {k: v.to(device) for k, v in enc.items()}
            out += self.model(**enc).logits[:, 0].float().cpu().tolist()  # [b]
        return out
