"""Adapter for the Qwen2-VL / Qwen2.5-VL / Qwen3-VL vision-language models (native transformers classes
`Qwen2VLForConditionalGeneration`, `Qwen2_5_VLForConditionalGeneration`, `Qwen3VLForConditionalGeneration`) with
images in the prompt. The three share the processor interface (`pixel_values` [patches, D], `image_grid_thw`) and
`get_rope_index`; Qwen3-VL adds learned absolute position embeddings in its vision tower, interleaved 3-D RoPE
sections in its text model and DeepStack visual features (all inside the model class, nothing here depends on them).

Everything but the inputs is the causal-LM adapter (`models.causal_lm`): the same sampler, scoring, options and
checkpoints. What differs:
- A prompt is `{"prompt": str | messages, "images": [PIL.Image, ...]}` (TRL's `image` / `images` keys both
  work; a bare string or message list is a text-only prompt). A string becomes one user message. When no message
  holds image blocks yet, one `{"type": "image"}` block per image is put at the start of the first user message
  (TRL's `prepare_multimodal_messages` convention); the processor's chat template then places the vision tokens
  and the processor expands each image's placeholder to its number of patches.
- Pixel inputs are kept per response in `rollout.extras` (`pixel_values`: a list of N tensors [patches, D], or
  None for a text-only prompt; `image_grid_thw`: a list of N tensors [images, 3]); the G responses of a prompt
  share the same tensors, and `Rollout.select` slices the lists like any per-response field.
- Positions are Qwen's 3-D multimodal RoPE ids, computed with the model's own `get_rope_index` over the real
  (unpadded) tokens of prompt + response, so left padding does not shift them; generated tokens continue from
  the largest prompt position + 1, the positions `get_rope_index` gives text after the prompt.
- The vision special tokens (image / video placeholders, vision start / end) are never sampled: a placeholder in a
  response would be taken for an image slot when the response is scored.
- The negative condition (GCPO) keeps the images: the instruction is appended to the last user message.
- With a rollout engine (use_vllm, `models/vllm_engine.py`), each request carries the prompt's expanded token ids and
  its images, and the rollout's log-probs are recomputed here with the pixel inputs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from mmrl.models.causal_lm import (
    CausalLMAdapter,
    is_chat,
    load_tokenizer,
    negative_prompt,
    transformers_model,
)

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
"""Qwen2-VL's vision special tokens, added to the char tokenizer of the tiny model."""

TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""The char tokenizer's `<|role|>content` chat format, with Qwen's `<|vision_start|><|image_pad|><|vision_end|>`
for each image block."""

CHAT_WORDS = ("<|", "|>", "system", "user", "assistant")
"""The words `TINY_CHAT_TEMPLATE`'s role markers split into under a word-level tokenizer (`<|user|>` -> `<|`, `user`,
`|>`), added to the vocabulary of a word-level tiny processor."""

SUPPORTED_MODEL_TYPES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}
"""config.model_type -> transformers class."""


def is_qwen_vl_config(config) -> bool:
    """A Qwen2-VL / Qwen2.5-VL / Qwen3-VL config, or a (remote-code) subclass of one."""
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    return config.model_type in SUPPORTED_MODEL_TYPES or isinstance(config, (Qwen2VLConfig, Qwen2_5_VLConfig, Qwen3VLConfig))


def split_vlm_prompt(prompt: Any) -> tuple[Any, list]:
    """(text or messages, images) of a VLM prompt: a dict with "prompt" and "images" / "image", or a bare prompt."""
    if isinstance(prompt, dict):
        if "prompt" not in prompt:
            raise ValueError(f"a VLM prompt dict needs a 'prompt' key (and 'images' or 'image'), got keys {sorted(prompt)}")
        if prompt.get("images") is not None and prompt.get("image") is not None:
            raise ValueError("a VLM prompt dict has both 'images' and 'image': give one of them")
        images = prompt.get("images", prompt.get("image"))
        if images is None:
            images = []
        elif not isinstance(images, (list, tuple)):
            images = [images]
        if any(im is None for im in images):
            raise ValueError("a VLM prompt's images contain None")
        return prompt["prompt"], list(images)
    return prompt, []


def _count_image_blocks(messages: Sequence[dict]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), (list, tuple))
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "image"
    )


def multimodal_messages(prompt: Any, num_images: int) -> list[dict]:
    """Chat messages with one image block per image (TRL's `prepare_multimodal_messages` convention: when no
    message has image blocks yet, they go at the start of the first user message). A string is one user turn."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif is_chat(prompt):
        messages = [dict(m) for m in prompt]
    else:
        raise TypeError(
            f"a vlm prompt must be a string, a list of chat messages, or a dict {{'prompt': ..., 'images': [...]}}, "
            f"got {type(prompt).__name__}: {prompt!r:.80}"
        )
    have = _count_image_blocks(messages)
    if have == 0 and num_images > 0:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise ValueError(f"a VLM prompt with images needs a user message (roles: {[m.get('role') for m in messages]})")
        first = messages[users[0]]
        content = first.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        first["content"] = [{"type": "image"} for _ in range(num_images)] + blocks
        have = num_images
    if have != num_images:
        raise ValueError(f"the prompt's messages have {have} image block(s) but {num_images} image(s) were given")
    return messages


class VLMAdapter(CausalLMAdapter):
    """Policy adapter for Qwen2-VL / Qwen2.5-VL / Qwen3-VL (see the module docstring).

    Args:
        model: a `Qwen2VLForConditionalGeneration` / `Qwen2_5_VLForConditionalGeneration` /
            `Qwen3VLForConditionalGeneration` (possibly peft-wrapped).
        processor: its processor (tokenizer + image processor + chat template).
        ref_model, generation_defaults: as for `CausalLMAdapter`.
    """

    family = "vlm"
    has_unused_parameters = True  # the vision tower gets no gradient in steps whose prompts carry no image
    batches_negative_condition = False  # per-row pixel inputs: the negative condition is scored separately

    def __init__(self, model: torch.nn.Module, processor, *, ref_model: torch.nn.Module | None = None, **generation_defaults: Any):
        if not hasattr(processor, "tokenizer") or not hasattr(processor, "image_processor"):
            raise TypeError(f"VLMAdapter needs a processor with .tokenizer and .image_processor (e.g. AutoProcessor), got {type(processor).__name__}")
        config = transformers_model(model).config
        if not is_qwen_vl_config(config):
            raise ValueError(f"VLMAdapter supports model types {sorted(SUPPORTED_MODEL_TYPES)} (and remote-code subclasses of their configs), got {config.model_type!r}")
        self.processor = processor
        super().__init__(model, processor.tokenizer, ref_model=ref_model, **generation_defaults)
        image_id = getattr(config, "image_token_id", None)
        if not isinstance(image_id, int) or not 0 <= image_id < self.vocab_size:
            raise ValueError(
                f"the model config's image_token_id is {image_id!r}, not an id of its vocabulary [0, {self.vocab_size}): "
                f"it is needed to place the image features (a config without the field gets Qwen's default 151655)"
            )
        proc_id = getattr(processor, "image_token_id", None)
        if proc_id is not None and proc_id != image_id:
            raise ValueError(f"the processor's image token id {proc_id} differs from the model config's image_token_id {image_id}")
        self.image_token_id = image_id
        video_id = getattr(config, "video_token_id", None)
        self.video_token_id = video_id if isinstance(video_id, int) and 0 <= video_id < self.vocab_size else None
        vision_ids = [getattr(config, f, None) for f in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")]
        self._vision_ids = [i for i in vision_ids if isinstance(i, int) and 0 <= i < self.vocab_size]

    # ------------------------------------------------------------------ prompts and inputs

    def encode_prompts(self, prompts: Sequence[Any], *, negative: bool = False, **generation: Any) -> tuple[list[list[int]], dict[str, list]]:
        """Token ids of each prompt (image placeholders expanded) and its pixel inputs: extras `pixel_values`
        ([patches, D] per prompt, None without images) and `image_grid_thw` ([images, 3] or None)."""
        opts = self._check_options({**self.generation_defaults, **generation})
        texts, images, counts = [], [], []
        for p in prompts:
            body, imgs = split_vlm_prompt(p)
            messages = multimodal_messages(body, len(imgs))
            if negative:
                messages = negative_prompt(messages, opts["negative_instruction"])
            prefill = messages[-1].get("role") == "assistant"  # a pre-filled answer is continued (d1's <reasoning>)
            texts.append(self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=not prefill,
                                                            continue_final_message=prefill, **opts["chat_template_kwargs"]))
            images.extend(imgs)
            counts.append(len(imgs))
        batch = self.processor(text=texts, images=images or None, return_tensors="pt", padding=True, padding_side="left")
        ids = [row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])]
        limit = opts["max_prompt_length"]
        too_long = [(b, len(x)) for b, x in enumerate(ids) if limit is not None and len(x) > limit]
        if too_long:  # cutting from the left would cut image placeholders away from their pixels
            raise ValueError(f"prompts (index, tokens) {too_long[:5]} are longer than max_prompt_length={limit} with their "
                             "image tokens; a multimodal prompt cannot be truncated, raise max_prompt_length or drop them")
        pixel_values: list = [None] * len(prompts)
        grids: list = [None] * len(prompts)
        if images:
            grid = batch["image_grid_thw"]  # [images, 3]
            per_image = grid.prod(-1).tolist()  # patches of each image
            pixels = torch.split(batch["pixel_values"], per_image)  # [patches_i, D] each
            start = 0
            for b, c in enumerate(counts):
                if c:
                    pixel_values[b] = torch.cat(pixels[start : start + c]).to(self.device)  # [patches_b, D]
                    grids[b] = grid[start : start + c].to(self.device)  # [c, 3]
                start += c
        return ids, {"pixel_values": pixel_values, "image_grid_thw": grids}

    def _rope_index(self):
        """The model's multimodal RoPE function (`Qwen2*VLModel.get_rope_index` / `Qwen3VLModel.get_rope_index`)."""
        base = transformers_model(self.model)
        inner = getattr(base, "model", base)
        return inner.get_rope_index

    def _forward_inputs(self, ids: torch.Tensor, mask: torch.Tensor, extras: dict) -> dict:
        """Pixel inputs of the rows in `extras` and 3-D RoPE position ids [3, N, L] over the real tokens."""
        pixels = [x for x in extras.get("pixel_values", []) if x is not None]
        grids = [x for x in extras.get("image_grid_thw", []) if x is not None]
        if not grids:  # text only: plain positions over the real tokens
            return super()._forward_inputs(ids, mask, extras)
        grid = torch.cat(grids).to(ids.device)  # [images, 3]
        mm_types = (ids == self.image_token_id).int()  # [N, L] 1 on image placeholders
        if self.video_token_id is not None:
            mm_types = mm_types + 2 * (ids == self.video_token_id).int()
        position_ids, _ = self._rope_index()(input_ids=ids, mm_token_type_ids=mm_types, image_grid_thw=grid, attention_mask=mask)
        return {
            "position_ids": position_ids,  # [3, N, L]
            "pixel_values": torch.cat(pixels).to(ids.device),  # [patches, D]
            "image_grid_thw": grid,
        }

    def _next_positions(self, forward_inputs: dict, mask: torch.Tensor) -> torch.Tensor:
        """[N] largest prompt position + 1 (what `get_rope_index` gives the text after the prompt)."""
        pos = forward_inputs["position_ids"]
        if pos.dim() == 3:
            pos = pos.amax(0)  # [N, L]
        return pos.masked_fill(~mask.bool(), 0).amax(-1) + 1  # [N]

    def _suppressed_ids(self) -> list[int]:
        return list(self._vision_ids)

    def _engine_images(self, prompts: list) -> list:
        """Per prompt, its PIL images (None for a text-only prompt): the rollout engine's `multi_modal_data`, beside the
        token ids `encode_prompts` gives (placeholders expanded as the processor expands them for these images)."""
        return [split_vlm_prompt(p)[1] or None for p in prompts]

    # ------------------------------------------------------------------ checkpoints

    def _save_processor(self, path: Path) -> None:
        self.processor.save_pretrained(path)

    @classmethod
    def _load_model(cls, path: Path, **kwargs: Any) -> torch.nn.Module:
        """The native class for a qwen2_vl / qwen2_5_vl / qwen3_vl checkpoint; with `trust_remote_code`, the checkpoint's own
        class (through `AutoModelForImageTextToText`) when its config subclasses a Qwen-VL config."""
        import transformers
        from transformers import AutoConfig, AutoModelForImageTextToText

        cfg_kwargs = {k: v for k, v in kwargs.items() if k in ("local_files_only", "trust_remote_code")}
        config = AutoConfig.from_pretrained(path, **cfg_kwargs)
        if config.model_type in SUPPORTED_MODEL_TYPES:
            return getattr(transformers, SUPPORTED_MODEL_TYPES[config.model_type]).from_pretrained(path, **kwargs)
        if is_qwen_vl_config(config):
            return AutoModelForImageTextToText.from_pretrained(path, **kwargs)
        raise ValueError(f"{str(path)!r} holds a {config.model_type!r} model; the vlm family supports {sorted(SUPPORTED_MODEL_TYPES)}")

    @classmethod
    def _load_processor(cls, path: Path, **kwargs: Any):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(path, tokenizer=load_tokenizer(path, **kwargs), **kwargs)

    @staticmethod
    def tiny_processor(*, min_pixels: int = 8 * 8, max_pixels: int = 32 * 32, model_type: str = "qwen2_5_vl",
                       words: Sequence[str] | None = None):
        """An offline Qwen2.5-VL (or, with `model_type="qwen3_vl"`, Qwen3-VL) processor: the char tokenizer plus
        Qwen's vision tokens, a `Qwen2VLImageProcessor` with 4-pixel patches (an image of h x w pixels, rounded to
        multiples of 8 within [min_pixels, max_pixels], gives h*w/64 image tokens) and a chat template that places
        the image tokens. `words`: a word-level tokenizer over these words (and the chat template's `CHAT_WORDS`)
        instead of the char one, one token per word, so that a question's words need no composing from letters."""
        from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        from mmrl.models.tokenizers import char_tokenizer, word_tokenizer

        processors = {"qwen2_5_vl": (Qwen2_5_VLProcessor, Qwen2VLVideoProcessor), "qwen3_vl": (Qwen3VLProcessor, Qwen3VLVideoProcessor)}
        if model_type not in processors:
            raise ValueError(f"tiny_processor: model_type must be one of {sorted(processors)}, got {model_type!r}")
        processor_cls, video_cls = processors[model_type]
        tok = char_tokenizer(VISION_TOKENS) if words is None else word_tokenizer(list(words) + list(CHAT_WORDS), VISION_TOKENS)
        tok.chat_template = TINY_CHAT_TEMPLATE
        sizes = dict(patch_size=4, temporal_patch_size=2, merge_size=2, size={"shortest_edge": min_pixels, "longest_edge": max_pixels})
        return processor_cls(
            image_processor=Qwen2VLImageProcessor(**sizes),
            tokenizer=tok,
            video_processor=video_cls(**sizes),
            chat_template=TINY_CHAT_TEMPLATE,
        )

__all__ = ["VLMAdapter", "multimodal_messages", "split_vlm_prompt"]
