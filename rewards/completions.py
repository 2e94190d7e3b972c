"""Reading the text out of TRL-style prompts and completions (plain strings or chat messages)."""
from __future__ import annotations

from typing import Any, Sequence


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content parts: [{"type": "text", "text": ...}, {"type": "image"}]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    raise TypeError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is; chat messages (TRL's conversational format, a list of
    `{"role", "content"}` dicts) -> the content of the last one; a single message dict -> its content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict) and "content" in completion:
        return _content_text(completion["content"])
    if isinstance(completion, (list, tuple)) and completion and all(isinstance(m, dict) and "content" in m for m in completion):
        return _content_text(completion[-1]["content"])
    raise TypeError(f"a text reward needs a string or chat messages as completion, got {type(completion).__name__}")


def prompt_text(prompt: Any) -> str:
    """A prompt as text: a string as is; chat messages -> the last user message's text; a dict with "prompt"."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        if "prompt" in prompt:
            return prompt_text(prompt["prompt"])
        if "content" in prompt:
            return _content_text(prompt["content"])
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        users = [m for m in prompt if m.get("role") == "user"] or list(prompt)
        return _content_text(users[-1].get("content", ""))
    raise TypeError(f"cannot read a text prompt from {type(prompt).__name__}")


def last_tag_content(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>") -> str | None:
    """The content of the last `<open_tag>...<close_tag>` pair, None without one: the last match of the regex
    `<answer>(.*?)</answer>` under `re.findall` (non-overlapping, left to right), found in linear time. (The regex
    itself retries every unclosed `<answer>` to the end of the text: quadratic, a minute on 240 KB of open tags.)"""
    last, pos = None, 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:  # no closing tag after this one, hence none after any later opening tag
            break
        last, pos = text[start + len(open_tag) : end], end + len(close_tag)
    return last


def is_conversational(prompt: Any) -> bool:
    """Whether a prompt is in TRL's conversational format: a list of `{"role", "content"}` messages, or mmrl's
    `{"prompt": <messages>, "images": [...]}` form of one (TRL `data_utils.is_conversational`)."""
    if isinstance(prompt, dict) and "prompt" in prompt:
        prompt = prompt["prompt"]
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0 and isinstance(prompt[0], dict)
            and "role" in prompt[0] and "content" in prompt[0])


def in_prompt_format(prompts: Sequence[Any], completions: Sequence[Any]) -> list:
    """The completions as TRL passes them to reward functions: for conversational prompts each text completion
    becomes `[{"role": "assistant", "content": text}]` (so TRL's `completion[0]["content"]` works); plain-text
    prompts keep plain strings; images (and anything else that is not a string) are passed unchanged.

    TRL decides once per batch from the first prompt (`is_conversational({"prompt": prompts[0]})`); so does this."""
    if not prompts or not is_conversational(prompts[0]):
        return list(completions)
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
