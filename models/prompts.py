"""Chat prompts to text, and prompt truncation, shared by the text families (causal LM, masked diffusion).

Prompts follow TRL's conversational format: a list of `{"role", "content"}` messages. The tokenizer's chat template
renders them with the generation prompt (TRL's `maybe_apply_chat_template`, which d1 and DMPO use); a list ending in
an assistant message is a pre-filled answer that the model continues (`continue_final_message`, as d1's evaluation
pre-fills `<reasoning>` after the template; authors' code: dllm-reasoning/d1 eval/gsm8k.py). A tokenizer without a
chat template gets the messages' text joined by blank lines, with one warning per tokenizer: an instruction-tuned
model fed an untemplated prompt answers worse, and the user should know.
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

_WARNED: set[int] = set()
"""ids of the tokenizers already warned about a missing chat template (one warning each)."""


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def plain_chat_text(messages: Sequence[dict]) -> str:
    """The messages' contents joined by blank lines (a pre-filled assistant turn is appended directly)."""
    parts: list[str] = []
    for i, m in enumerate(messages):
        content = m.get("content", "")
        if not isinstance(content, str):
            raise TypeError(f"a text chat message needs string content, got {type(content).__name__}")
        if i == len(messages) - 1 and m.get("role") == "assistant" and parts:
            parts[-1] = parts[-1] + "\n" + content
        else:
            parts.append(content)
    return "\n\n".join(parts)


def render_chat(tokenizer, messages: Sequence[dict], **template_kwargs: Any) -> str:
    """Chat messages as the prompt text the model sees: the tokenizer's chat template with the generation prompt
    (or continuing a final assistant message), else `plain_chat_text` with a one-time warning."""
    messages = list(messages)
    prefill = messages[-1].get("role") == "assistant"
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=not prefill,
                                             continue_final_message=prefill, **template_kwargs)
    if id(tokenizer) not in _WARNED:
        _WARNED.add(id(tokenizer))
        warnings.warn(f"the tokenizer ({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '') or 'unnamed'}) has "
                      "no chat template: chat prompts are given as their plain text. An instruction-tuned model (e.g. "
                      "LLaDA-8B-Instruct, Dream-v0-Instruct) expects its template; set tokenizer.chat_template or use a "
                      "checkpoint that ships one", UserWarning, stacklevel=3)
    return plain_chat_text(messages)


def truncate_left(ids: list[int], max_length: int | None) -> list[int]:
    """The last `max_length` ids (TRL's / d1's left truncation of prompts); all of them when None."""
    if max_length is None or len(ids) <= max_length:
        return list(ids)
    return list(ids[-max_length:])


def check_max_prompt_length(value: Any) -> int | None:
    """`value` if it is None or a positive int, else a ValueError naming it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_prompt_length must be a positive int or None, got {value!r}")
    return value
