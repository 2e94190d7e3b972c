"""Adapter for any transformers `AutoModelForCausalLM` (Qwen2.5, Llama, ...): KV-cache sampling with per-token
log-probs, teacher-forced scoring, GCPO's negative condition.

Choices (each also stated where it is implemented):
- Log-probs, at rollout time and teacher-forced, are of the temperature-scaled distribution softmax(logits / T)
  *before* top-k / top-p filtering, as TRL's GRPOTrainer scores them (`_get_per_token_logps_and_entropies` divides
  by the temperature and applies no top-p). Filtering only decides which tokens can be drawn.
- Randomness is per response row (`models.sampling`): row n draws its uniforms from its own seed, so a row's
  tokens do not depend on the other rows of the batch or on their padding. The row seeds are drawn from the
  caller's `torch.Generator`, or given explicitly with `seeds=`.
- Each prompt is prefilled once and its KV cache repeated G times for the group (the G responses of a prompt
  share the prompt's forward), then one decode step per token for all N rows; decoding stops as soon as every
  row has produced an end-of-sequence id.
- String prompts are tokenized as they are (the tokenizer adds its special tokens, e.g. Llama's BOS); chat
  prompts (lists of `{"role", "content"}` messages) go through the tokenizer's chat template with
  `add_generation_prompt=True`, like TRL.
- GCPO's negative condition (docs/algorithms.md section 3; docs/sources.md "Negative conditions", authors' "wrong_answer"
  template): the prompt with `negative_instruction` appended on a new line; for chat prompts it is appended to
  the last user message.
"""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any, Literal, Sequence

import torch

from mmrl.algorithms.distributions import STATS, token_distribution_stats
from mmrl.models.base import (BaseAdapter, is_peft_model, left_pad, mask_through_first_eos, score_logits,
                              selective_log_softmax, unwrap)
from mmrl.models.head_logprob import plain_linear_head
from mmrl.models.cpu_linear import packed_linears
from mmrl.models.kv_cache import reserve_cache
from mmrl.models.prompts import check_max_prompt_length, render_chat, truncate_left
from mmrl.models.sampling import row_seeds, row_uniforms, sample_next_tokens
from mmrl.core.protocol import DEFAULT_NEGATIVE_INSTRUCTION, NoisedBatch, Rollout, TokenScores

ADAPTER_FILE = "mmrl_adapter.json"
"""Written by `save_pretrained` next to the weights: family and generation defaults."""

GENERATION_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 256,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "eos_token_id": None,
    "pad_token_id": None,
    "negative_instruction": DEFAULT_NEGATIVE_INSTRUCTION,
    "chat_template_kwargs": {},
    "max_prompt_length": None,
}
"""Sampling options and their defaults. `eos_token_id` (int or list) defaults to the union of the model's
generation config and the tokenizer's EOS ids; `pad_token_id` to the tokenizer's, then the generation config's,
then the first EOS id. `top_k = 0` and `top_p = 1` disable those filters. `chat_template_kwargs` are passed to
`apply_chat_template` (e.g. `{"enable_thinking": False}`). `max_prompt_length` keeps the last that many prompt tokens
(TRL's left truncation; None keeps them all)."""

IGNORED_ESTIMATOR_OPTIONS = ("estimator", "mask_seed", "num_copies")
"""Masked-diffusion estimator options that `logprob` accepts and ignores: an autoregressive log-prob is exact."""

LOGITS_ARE_HEAD_OF_HIDDEN = ("qwen2", "qwen3", "llama", "mistral")
"""Model types whose transformers forward computes `logits = lm_head(last_hidden_state[:, -logits_to_keep:])` and
nothing more, so a no-grad scoring may swap the head out and run it in chunks itself
(`CausalLMAdapter._response_logprob_no_grad`); other models take the full-logits path."""

NO_GRAD_HEAD_BYTES = 32 << 20
"""float32 logits per chunk of the chunked no-grad scoring (32 MiB: 262 rows at V = 32000)."""

NEGATIVE_SEPARATOR = "\n"
"""Joins a prompt and the negative instruction."""


def _id_list(value: Any) -> list[int]:
    """None / int / sequence of ints -> list of ints."""
    if value is None:
        return []
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return [int(value)]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    return [int(v) for v in value]


def is_chat(prompt: Any) -> bool:
    """A chat prompt: a non-empty list of message dicts with a "role"."""
    return isinstance(prompt, (list, tuple)) and len(prompt) > 0 and all(isinstance(m, dict) and "role" in m for m in prompt)


def append_to_last_user_message(messages: Sequence[dict], text: str, separator: str = NEGATIVE_SEPARATOR) -> list[dict]:
    """A copy of `messages` with `text` appended to the last user message (string content: joined by `separator`;
    structured content: added to its last text block, or as a new text block after the images)."""
    messages = [dict(m) for m in messages]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise ValueError(f"cannot build the negative condition: the chat prompt has no user message (roles: {[m.get('role') for m in messages]})")
    last = messages[users[-1]]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = content + separator + text
    elif isinstance(content, (list, tuple)):
        blocks = [dict(b) if isinstance(b, dict) else b for b in content]
        if blocks and isinstance(blocks[-1], dict) and blocks[-1].get("type") == "text":
            blocks[-1]["text"] = blocks[-1].get("text", "") + separator + text
        else:
            blocks.append({"type": "text", "text": text})
        last["content"] = blocks
    else:
        raise ValueError(f"cannot build the negative condition: the last user message has content of type {type(content).__name__}; expected str or a list of content blocks")
    return messages


def negative_prompt(prompt: Any, instruction: str) -> Any:
    """GCPO's negative condition for text (authors' "wrong_answer" template, docs/sources.md "Negative conditions"): the
    prompt with `instruction` appended (string prompts on a new line; chat prompts in the last user message)."""
    if isinstance(prompt, str):
        return prompt + NEGATIVE_SEPARATOR + instruction
    if is_chat(prompt):
        return append_to_last_user_message(prompt, instruction)
    raise TypeError(f"a prompt must be a string or a list of chat messages, got {type(prompt).__name__}")


def transformers_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under DDP / accelerate / peft wrappers (the module whose forward signature counts)."""
    model = unwrap(model)
    if is_peft_model(model):
        model = model.get_base_model()
    return model


def forward_signature(model: torch.nn.Module) -> tuple[str, bool]:
    """(name of the KV-cache argument, whether `logits_to_keep` is accepted) of a transformers model's forward.

    transformers 5.24 renamed `past_key_values` to `cache` (the old name is deprecated); older releases and remote
    code only know `past_key_values`.
    """
    params = inspect.signature(transformers_model(model).forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"
    return cache_arg, "logits_to_keep" in params


def resolve_dtype(dtype: Any) -> Any:
    """torch.dtype, "auto" or a dtype name ("bfloat16", "float32", "fp16", ...) -> what `from_pretrained` takes."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if isinstance(dtype, str) and dtype.lower() in names:
        return names[dtype.lower()]
    raise ValueError(f"unknown dtype {dtype!r}; use a torch.dtype, 'auto' or one of {sorted(names)}")


def local_dir(path: str | Path, what: str = "model") -> Path:
    """`path` as a Path, or a FileNotFoundError naming it (mmrl loads local checkpoints only, never the Hub)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(
            f"{what} path {str(path)!r} is not a directory: mmrl loads checkpoints from local directories only "
            f"(download them first, e.g. with `huggingface-cli download <repo> --local-dir <dir>`)"
        )
    return p


def read_adapter_file(path: Path, family: str) -> dict:
    """The generation defaults saved in `mmrl_adapter.json` ({} if absent); a file of another family raises."""
    f = path / ADAPTER_FILE
    if not f.is_file():
        return {}
    data = json.loads(f.read_text())
    if data.get("family") not in (None, family):
        raise ValueError(f"{str(path)!r} holds a {data.get('family')!r} adapter, not {family!r}: load it with family={data.get('family')!r}")
    return dict(data.get("generation_defaults", {}))


def load_tokenizer(path: Path, **kwargs: Any):
    """The tokenizer saved in `path`, of the class its `tokenizer_config.json` declares.

    transformers 5 `AutoTokenizer` prefers the model type's tokenizer class when a `config.json` sits beside the
    tokenizer (e.g. `Qwen2Tokenizer` for a qwen2 model), which rebuilds the pre-tokenizer and so changes what a
    generic `tokenizers` tokenizer (such as the offline char tokenizer) produces. A declared generic class
    (`TokenizersBackend` / `PreTrainedTokenizerFast`) is therefore loaded as such, from its `tokenizer.json`.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg = Path(path) / "tokenizer_config.json"
    declared = json.loads(cfg.read_text()).get("tokenizer_class") if cfg.is_file() else None
    if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(path, **kwargs)
    return AutoTokenizer.from_pretrained(path, **kwargs)


class CausalLMAdapter(BaseAdapter):
    """Policy adapter for a transformers causal LM (see the module docstring for the sampling choices).

    Args:
        model: an `AutoModelForCausalLM` model (possibly peft-wrapped).
        tokenizer: its tokenizer (with a chat template if chat prompts are used).
        ref_model: optional frozen reference copy (for LoRA the adapter-disabled base is used instead).
        generation_defaults: options of `GENERATION_DEFAULTS`; each can be overridden per `sample` call.
    """

    family = "causal_lm"
    generation_option_names = tuple(GENERATION_DEFAULTS)

    @classmethod
    def greedy_generation(cls, gen_length: int, block_length: int, steps: int) -> dict[str, Any]:
        """Greedy decoding: top-k 1 at temperature 1 for `gen_length` tokens (VLMs too)."""
        return {"max_new_tokens": gen_length, "temperature": 1.0, "top_k": 1}

    @classmethod
    def generation_options(cls, cfg) -> dict[str, Any]:
        return {"max_new_tokens": cfg.max_completion_length, "temperature": cfg.temperature, "top_p": cfg.top_p,
                "top_k": cfg.top_k, "negative_instruction": cfg.negative_instruction, "max_prompt_length": cfg.max_prompt_length}

    def __init__(self, model: torch.nn.Module, tokenizer, *, ref_model: torch.nn.Module | None = None, **generation_defaults: Any):
        super().__init__(model, ref_model=ref_model)
        self.tokenizer = tokenizer
        base = transformers_model(model)
        head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
        self.vocab_size = int(head.weight.shape[0]) if head is not None else int(base.config.get_text_config().vocab_size)
        self.generation_defaults = self._resolve_defaults(base, generation_defaults)

    # ------------------------------------------------------------------ options

    def _resolve_defaults(self, base: torch.nn.Module, given: dict) -> dict:
        """GENERATION_DEFAULTS updated by `given`, with EOS / pad ids resolved and everything validated."""
        opts = self._check_options({**GENERATION_DEFAULTS, **given})
        gen_cfg = getattr(base, "generation_config", None)
        if opts["eos_token_id"] is None:
            eos = _id_list(getattr(gen_cfg, "eos_token_id", None)) + _id_list(getattr(self.tokenizer, "eos_token_id", None))
            if not eos:
                raise ValueError(
                    "no end-of-sequence id: neither the model's generation_config.eos_token_id nor the tokenizer's "
                    "eos_token_id is set; pass eos_token_id=<id or list of ids>"
                )
            opts["eos_token_id"] = list(dict.fromkeys(eos))
        if opts["pad_token_id"] is None:
            for cand in (getattr(self.tokenizer, "pad_token_id", None), getattr(gen_cfg, "pad_token_id", None), opts["eos_token_id"][0]):
                if isinstance(cand, int):
                    opts["pad_token_id"] = cand
                    break
        return self._check_options(opts)

    def _check_options(self, opts: dict) -> dict:
        """Validate sampling options; an unknown name or a bad value raises with what is allowed."""
        unknown = sorted(set(opts) - set(GENERATION_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown generation option(s) {unknown} for {type(self).__name__}; valid: {sorted(GENERATION_DEFAULTS)}")
        out = dict(opts)
        if not isinstance(out["max_new_tokens"], int) or isinstance(out["max_new_tokens"], bool) or out["max_new_tokens"] < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {out['max_new_tokens']!r}")
        t = out["temperature"]
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not t > 0:
            raise ValueError(f"temperature must be a number > 0, got {t!r} (for greedy decoding use top_k=1)")
        out["temperature"] = float(t)
        p = out["top_p"]
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 < p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        out["top_p"] = float(p)
        k = out["top_k"]
        if k is None:
            k = 0
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {out['top_k']!r}")
        out["top_k"] = k
        if out["eos_token_id"] is not None:
            eos = _id_list(out["eos_token_id"])
            bad = [e for e in eos if not 0 <= e < self.vocab_size]
            if not eos or bad:
                raise ValueError(f"eos_token_id must be one id or a non-empty list of ids in [0, {self.vocab_size}), got {out['eos_token_id']!r}")
            out["eos_token_id"] = eos
        pad = out["pad_token_id"]
        if pad is not None and (not isinstance(pad, int) or not 0 <= pad < self.vocab_size):
            raise ValueError(f"pad_token_id must be an id in [0, {self.vocab_size}), got {pad!r}")
        if not isinstance(out["negative_instruction"], str) or not out["negative_instruction"].strip():
            raise ValueError(f"negative_instruction must be a non-empty string, got {out['negative_instruction']!r}")
        if not isinstance(out["chat_template_kwargs"], dict):
            raise ValueError(f"chat_template_kwargs must be a dict, got {type(out['chat_template_kwargs']).__name__}")
        check_max_prompt_length(out["max_prompt_length"])
        return out

    # ------------------------------------------------------------------ prompts

    def _prompt_ids(self, prompt: Any, opts: dict) -> list[int]:
        """Token ids of one prompt: strings as they are, chat messages through the chat template."""
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        if is_chat(prompt):
            text = render_chat(self.tokenizer, prompt, **opts["chat_template_kwargs"])
            return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        raise TypeError(
            f"a {self.family} prompt must be a string or a list of chat messages "
            f"([{{'role': 'user', 'content': ...}}, ...]), got {type(prompt).__name__}: {prompt!r:.80}"
        )

    def encode_prompts(self, prompts: Sequence[Any], *, negative: bool = False, **generation: Any) -> tuple[list[list[int]], dict[str, list]]:
        """Token ids of each prompt (or of its negative condition) and per-prompt model inputs (none for text).

        Returns (ids, extras): `ids[b]` the unpadded token ids of prompt b; `extras` maps names to lists of length
        B (the VLM puts pixel inputs there).
        """
        opts = self._check_options({**self.generation_defaults, **generation})
        if negative:
            prompts = [negative_prompt(p, opts["negative_instruction"]) for p in prompts]
        ids = [truncate_left(self._prompt_ids(p, opts), opts["max_prompt_length"]) for p in prompts]
        empty = [i for i, x in enumerate(ids) if not x]
        if empty:
            raise ValueError(f"prompts {empty} encode to no tokens; every prompt needs at least one token")
        return ids, {}

    # ------------------------------------------------------------------ model inputs (overridden by the VLM)

    def _forward_inputs(self, ids: torch.Tensor, mask: torch.Tensor, extras: dict) -> dict:
        """Keyword inputs of a full forward over left-padded `ids` [N, L] besides ids and mask: position ids
        counted over real tokens, so left padding does not shift positions ([N, L])."""
        return {"position_ids": (mask.long().cumsum(-1) - 1).clamp_(min=0)}  # [N, L]

    def _next_positions(self, forward_inputs: dict, mask: torch.Tensor) -> torch.Tensor:
        """[N] position id of the first generated token after the prompts of a prefill."""
        return mask.long().sum(-1)  # [N]

    def _suppressed_ids(self) -> list[int]:
        """Ids never sampled (none for text; the VLM suppresses its vision placeholders)."""
        return []

    # ------------------------------------------------------------------ sampling

    @torch.no_grad()
    def sample(
        self,
        prompts: list,
        group_size: int,
        *,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | torch.Tensor | None = None,
        **generation: Any,
    ) -> Rollout:
        """`group_size` responses per prompt with rollout-time log-probs (rows g*G .. g*G+G-1 answer prompt g).

        Args:
            prompts: strings or chat-message lists.
            group_size: G.
            generator: draws the N row seeds (torch's default generator if None).
            seeds: explicit per-response seeds ([N] ints) instead of drawing them: a row's tokens depend only on
                its seed and its prompt, whatever else is in the batch.
            generation: overrides of `generation_defaults` for this call.
        """
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise ValueError(f"prompts must be a non-empty list, got {type(prompts).__name__} of length {len(prompts) if hasattr(prompts, '__len__') else '?'}")
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
        opts = self._check_options({**self.generation_defaults, **generation})
        prompts = list(prompts)
        b, g = len(prompts), group_size
        n = b * g
        device = self.device
        pos_ids, pos_extras = self.encode_prompts(prompts, **generation)
        neg_ids, _ = self.encode_prompts(prompts, negative=True, **generation)
        pad = opts["pad_token_id"]
        prompt_ids, prompt_mask = left_pad(pos_ids, pad, device)  # [B, P]
        neg_prompt_ids, neg_prompt_mask = left_pad(neg_ids, pad, device)  # [B, P']

        if seeds is None:
            seeds_t = row_seeds(n, generator)  # [N]
        else:
            seeds_t = torch.as_tensor(seeds, dtype=torch.long).reshape(-1).cpu()  # [N]
            if seeds_t.numel() != n:
                raise ValueError(f"seeds must give one seed per response ({len(prompts)} prompts x group_size {g} = {n}), got {seeds_t.numel()}")
        if self.rollout_engine is not None:  # vLLM (use_vllm): its tokens, the policy's log-probs
            response_ids, terminated = self._engine_decode(pos_ids, g, seeds_t, opts, images=self._engine_images(prompts))
            old_logp = torch.zeros(response_ids.shape, dtype=torch.float32, device=device)  # filled below
        else:
            u = row_uniforms(seeds_t, opts["max_new_tokens"], device)  # [N, T_max]
            response_ids, old_logp, terminated = self._decode(prompt_ids, prompt_mask, pos_extras, g, u, opts)
        response_mask = mask_through_first_eos(response_ids, opts["eos_token_id"])  # [N, T]
        old_logp = old_logp.masked_fill(~response_mask, 0.0)  # [N, T]

        extras = {k: [v for v in vals for _ in range(g)] for k, vals in pos_extras.items()}
        extras.update(temperature=opts["temperature"], terminated=terminated, seeds=seeds_t.to(device))
        rollout = Rollout(
            prompt_ids=prompt_ids.repeat_interleave(g, 0),  # [N, P]
            prompt_mask=prompt_mask.repeat_interleave(g, 0),  # [N, P]
            response_ids=response_ids,
            response_mask=response_mask,
            group_size=g,
            prompts=[p for p in prompts for _ in range(g)],
            completions=self._decode_text(response_ids, response_mask),
            old_logp=old_logp,
            neg_prompt_ids=neg_prompt_ids.repeat_interleave(g, 0),  # [N, P']
            neg_prompt_mask=neg_prompt_mask.repeat_interleave(g, 0),  # [N, P']
            extras=extras,
        )
        if self.rollout_engine is not None:
            with torch.no_grad():  # TRL's trainer-side log-probs of the engine's tokens, at the sampling temperature
                rollout.old_logp = self.logprob(rollout).logp.float().masked_fill(~response_mask, 0.0)  # [N, T]
        return rollout

    rollout_engine = None
    """A `models.vllm_engine.VLLMEngine` that generates the responses instead of `_decode` (use_vllm; None: the
    built-in sampler). It is given the policy's weights before each generation."""

    def _engine_images(self, prompts: list) -> list | None:
        """Per prompt, the images its engine requests carry (None: a text model's prompts carry none)."""
        return None

    def _engine_decode(self, prompt_rows: list, group_size: int, seeds: torch.Tensor, opts: dict, *,
                       images: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The rollout engine's responses as (tokens [N, T] long, right padded with pad; terminated [N] bool).
        `prompt_rows`: the B prompts' token ids (a VLM's image placeholders expanded); `images`: per prompt, its
        images or None."""
        self.rollout_engine.load_weights(self.unwrapped)
        suppressed = self._suppressed_ids()
        rows = self.rollout_engine.generate(prompt_rows, group_size, seeds=seeds.tolist(), max_new_tokens=opts["max_new_tokens"],
                                            temperature=opts["temperature"], top_p=opts["top_p"], top_k=opts["top_k"],
                                            eos_token_ids=opts["eos_token_id"], images=images, suppress_token_ids=suppressed)
        drawn = sorted({t for r in rows for t in r if t in set(suppressed)})
        if drawn:  # biased away, never sampled in practice; scoring would take a vision placeholder for an image slot
            raise RuntimeError(f"the rollout engine sampled suppressed token ids {drawn} (vision special tokens) despite their "
                               "logit bias; their responses cannot be scored")
        t = max(1, max(len(r) for r in rows))
        tokens = torch.full((len(rows), t), opts["pad_token_id"], dtype=torch.long)  # [N, T]
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        eos = set(opts["eos_token_id"])
        terminated = torch.as_tensor([bool(r) and r[-1] in eos for r in rows], device=self.device)  # [N]
        return tokens.to(self.device), terminated

    def _decode(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, prompt_extras: dict, group_size: int, u: torch.Tensor, opts: dict
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """KV-cache decoding: prefill each of the B prompts once, repeat the cache G times, then one forward per
        step for all N rows until every row has emitted an EOS id or `max_new_tokens` is reached.

        Returns (tokens [N, T] long, right padded with pad after EOS; log-probs [N, T] float32 of the
        temperature-scaled unfiltered distribution; terminated [N] bool, True where an EOS was emitted).
        """
        model = self.unwrapped
        from transformers import DynamicCache

        cache_arg, keeps_logits = forward_signature(model)
        keep1 = {"logits_to_keep": 1} if keeps_logits else {}
        b, p = prompt_ids.shape
        g = group_size
        n, t_max = u.shape
        device = prompt_ids.device
        temperature, top_k, top_p = opts["temperature"], opts["top_k"], opts["top_p"]
        pad = opts["pad_token_id"]
        eos = torch.as_tensor(opts["eos_token_id"], device=device)  # [E]
        suppress = torch.as_tensor(self._suppressed_ids(), dtype=torch.long, device=device)  # [S]

        was_training = model.training
        model.eval()  # sampling never runs dropout
        with packed_linears(model, n):  # oneDNN products on the CPU (models/cpu_linear.py)
            try:
                cache = DynamicCache(config=transformers_model(model).config)
                inputs = self._forward_inputs(prompt_ids, prompt_mask, prompt_extras)
                out = model(input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, **{cache_arg: cache}, **inputs, **keep1)
                logits = out.logits[:, -1].float()  # [B, V]
                next_pos = self._next_positions(inputs, prompt_mask)  # [B]
                if g > 1:
                    logits = logits.repeat_interleave(g, 0)  # [N, V]
                    next_pos = next_pos.repeat_interleave(g, 0)  # [N]
                    cache.batch_repeat_interleave(g)
                reserve_cache(cache, t_max)  # decode steps write in place instead of concatenating (models/kv_cache.py)
                attn = torch.ones(n, p + t_max, dtype=prompt_mask.dtype, device=device)  # [N, P+T_max]
                attn[:, :p] = prompt_mask.repeat_interleave(g, 0)
                tokens = torch.full((n, t_max), pad, dtype=torch.long, device=device)  # [N, T_max]
                logps = torch.zeros(n, t_max, dtype=torch.float32, device=device)  # [N, T_max]
                done = torch.zeros(n, dtype=torch.bool, device=device)  # [N]
                steps = 0
                for t in range(t_max):
                    scaled = logits / temperature if temperature != 1.0 else logits  # [N, V]
                    # lp: log-prob of the unfiltered temperature-scaled distribution (TRL's convention)
                    tok, lp = sample_next_tokens(scaled, u[:, t], top_k=top_k, top_p=top_p, suppress_ids=suppress)  # [N], [N]
                    tok = tok.masked_fill_(done, pad)
                    tokens[:, t] = tok
                    logps[:, t] = lp.masked_fill_(done, 0.0)
                    done |= torch.isin(tok, eos)
                    steps = t + 1
                    if steps == t_max or bool(done.all()):
                        break
                    out = model(
                        input_ids=tok[:, None],
                        attention_mask=attn[:, : p + steps],
                        position_ids=(next_pos + t)[:, None],
                        use_cache=True,
                        **{cache_arg: cache},
                    )
                    logits = out.logits[:, -1].float()  # [N, V]
            finally:
                model.train(was_training)
        tokens, logps = tokens[:, :steps], logps[:, :steps]
        terminated = torch.isin(tokens, eos).any(-1)  # [N]
        return tokens, logps, terminated

    def _decode_text(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Each row's valid tokens decoded without special tokens (the EOS is not part of the text)."""
        rows = [r[m].tolist() for r, m in zip(ids.cpu(), mask.cpu())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    # ------------------------------------------------------------------ scoring

    def _response_logits(
        self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
        response_mask: torch.Tensor, extras: dict,
    ) -> torch.Tensor:
        """[N, T, V] logits predicting each response token, teacher-forced through `model` (called as a module, so
        DDP / peft wrappers take part). The last response token is not fed (nothing is predicted from it), and
        only the T predicting positions go through the LM head (`logits_to_keep`)."""
        n, t = response_ids.shape
        if t == 0:
            return torch.zeros(n, 0, self.vocab_size, device=response_ids.device)
        ids = torch.cat([prompt_ids, response_ids[:, :-1]], dim=1)  # [N, P+T-1]
        mask = torch.cat([prompt_mask.bool(), response_mask[:, :-1].bool()], dim=1)  # [N, P+T-1]
        _, keeps_logits = forward_signature(model)
        keep = {"logits_to_keep": t} if keeps_logits else {}
        with packed_linears(model, ids.numel(), grad=True, pack=False):  # oneDNN products on the CPU (models/cpu_linear.py)
            out = model(input_ids=ids, attention_mask=mask, use_cache=False, **self._forward_inputs(ids, mask, extras), **keep)
        # no slice when the model kept only the T positions: a slice's backward allocates a zeroed copy of the logits
        return out.logits if out.logits.shape[1] == t else out.logits[:, -t:]  # [N, T, V]

    def _head_free_base(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The transformers model under `model` when its logits are exactly `lm_head(last hidden state)` with a plain
        linear head (`LOGITS_ARE_HEAD_OF_HIDDEN`, no softcapping), so a no-grad scoring may run the head itself in
        chunks (`_response_logprob_no_grad`); None otherwise (the full-logits path)."""
        base = transformers_model(model)
        config = getattr(base, "config", None)
        if getattr(config, "model_type", None) not in LOGITS_ARE_HEAD_OF_HIDDEN or getattr(config, "final_logit_softcapping", None):
            return None
        if plain_linear_head(getattr(base, "lm_head", None)) is None or not forward_signature(model)[1]:
            return None
        return base

    def _final_hidden_no_grad(
        self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
        response_mask: torch.Tensor, extras: dict,
    ) -> tuple[torch.Tensor, torch.nn.Linear] | None:
        """(final hidden states [N, T, H] at the positions predicting the response tokens, the LM head) of a no-grad
        teacher-forced forward with the head swapped for the identity (so no [N, T, V] logits are made), or None
        when the model does not allow it (`_head_free_base`), a gradient is on or T = 0. The head's forward stays
        patched to oneDNN on the CPU only inside `_chunked_head`."""
        t = response_ids.shape[1]
        base = self._head_free_base(model) if (t > 0 and not torch.is_grad_enabled()) else None
        if base is None:
            return None
        ids = torch.cat([prompt_ids, response_ids[:, :-1]], dim=1)  # [N, P+T-1]
        mask = torch.cat([prompt_mask.bool(), response_mask[:, :-1].bool()], dim=1)  # [N, P+T-1]
        with packed_linears(model, ids.numel(), grad=True, pack=False):
            head = base.lm_head
            base.lm_head = torch.nn.Identity()
            try:
                hidden = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=t,
                               **self._forward_inputs(ids, mask, extras)).logits  # [N, T, H]
            finally:
                base.lm_head = head
        return hidden, head

    @staticmethod
    def _chunked_head(hidden: torch.Tensor, head: torch.nn.Linear, reduce) -> None:
        """Put hidden rows [M, H] through `head` in chunks of `NO_GRAD_HEAD_BYTES` of float32 logits and call
        `reduce(rows: slice, logits [c, V])` on each (no [M, V] logits are ever alive)."""
        rows = max(1, NO_GRAD_HEAD_BYTES // (4 * head.weight.shape[0]))
        with packed_linears(head, hidden.shape[0], grad=True, pack=False):
            for s in range(0, hidden.shape[0], rows):
                sl = slice(s, min(s + rows, hidden.shape[0]))
                reduce(sl, head(hidden[sl]))

    def _response_logprob_no_grad(
        self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor,
        response_mask: torch.Tensor, extras: dict, temperature: float,
    ) -> torch.Tensor | None:
        """[N, T] float32 log softmax(logits / temperature)[response] at the valid response positions (0 elsewhere),
        under `no_grad`, without the [N, T, V] logits: the final hidden states of the valid positions only
        (`_final_hidden_no_grad`) go through the head in chunks (`_chunked_head`), each reduced at once by
        `selective_log_softmax`. The same numbers as `selective_log_softmax(_response_logits(...))` masked, up to
        float rounding (the head's products run on fewer rows). None when the model does not allow it."""
        got = self._final_hidden_no_grad(model, prompt_ids, prompt_mask, response_ids, response_mask, extras)
        if got is None:
            return None
        hidden, head = got
        valid = response_mask.bool()  # [N, T]
        targets = response_ids[valid]  # [M]
        picked = torch.empty(targets.shape[0], dtype=torch.float32, device=hidden.device)  # [M]

        def reduce(sl: slice, logits: torch.Tensor) -> None:
            picked[sl] = selective_log_softmax(logits, targets[sl], temperature=temperature)

        self._chunked_head(hidden[valid], head, reduce)  # [M, H] valid positions only
        out = torch.zeros(response_ids.shape, dtype=torch.float32, device=hidden.device)  # [N, T]
        out[valid] = picked
        return out

    def _other_stats_no_grad(
        self, logits: torch.Tensor, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
        response_ids: torch.Tensor, response_mask: torch.Tensor, extras: dict, temperature: float, stats: tuple[str, ...],
    ) -> dict[str, torch.Tensor] | None:
        """`token_distribution_stats(logits, other_logits, stats=stats, other_targets=response_ids)` ([N, T] each,
        `"other_logp"` included) where `other_logits` are `model`'s (the reference's, or the negative condition's)
        and never exist whole: its final hidden states go through the head in chunks of rows, each chunk's statistics
        taken against the same rows of `logits` [N, T, V] (detached) at once. Per-row statistics, so the same numbers
        as on the full logits up to float rounding. None when the model does not allow it."""
        got = self._final_hidden_no_grad(model, prompt_ids, prompt_mask, response_ids, response_mask, extras)
        if got is None:
            return None
        hidden, head = got
        n, t = response_ids.shape
        p_rows = logits.detach().reshape(n * t, -1)  # [N*T, V]
        targets = response_ids.reshape(-1)  # [N*T]
        names = (*stats, "other_logp")
        out = {k: torch.empty(n * t, dtype=torch.float32, device=hidden.device) for k in names}

        def reduce(sl: slice, q_logits: torch.Tensor) -> None:
            st = token_distribution_stats(p_rows[sl], q_logits, stats=stats, temperature=temperature, other_targets=targets[sl])
            for k in names:
                out[k][sl] = st[k]

        self._chunked_head(hidden.reshape(n * t, -1), head, reduce)
        return {k: v.reshape(n, t) for k, v in out.items()}

    def _condition_prompt(self, rollout: Rollout, condition: str) -> tuple[torch.Tensor, torch.Tensor]:
        if condition == "positive":
            return rollout.prompt_ids, rollout.prompt_mask
        if condition == "negative":
            if rollout.neg_prompt_ids is None or rollout.neg_prompt_mask is None:
                raise ValueError("condition='negative' needs rollout.neg_prompt_ids / neg_prompt_mask, which this rollout lacks")
            return rollout.neg_prompt_ids, rollout.neg_prompt_mask
        raise ValueError(f"condition must be 'positive' or 'negative', got {condition!r}")

    def _temperature(self, extras: dict, estimator: dict) -> float:
        """The temperature to score with: an explicit `temperature=`, else the rollout's, else the default."""
        unknown = sorted(set(estimator) - {"temperature", *IGNORED_ESTIMATOR_OPTIONS})
        if unknown:
            raise ValueError(f"unknown logprob option(s) {unknown} for {type(self).__name__}; valid: ['temperature'] (and the ignored masked-diffusion options {list(IGNORED_ESTIMATOR_OPTIONS)})")
        t = estimator.get("temperature", extras.get("temperature", self.generation_defaults["temperature"]))
        return self._check_options({**self.generation_defaults, "temperature": t})["temperature"]

    def logprob(
        self,
        rollout: Rollout,
        *,
        condition: Literal["positive", "negative"] = "positive",
        use_reference: bool = False,
        stats: tuple[str, ...] = (),
        stats_against: Literal["reference", "negative"] = "reference",
        **estimator: Any,
    ) -> TokenScores:
        """Teacher-forced log-probs [N, T] of the response tokens under softmax(logits / temperature) (the rollout's
        temperature unless `temperature=` is given), with the gradient when called outside `no_grad`.

        `stats` (names of `mmrl.algorithms.STATS`) are taken against the reference model under the same condition
        (`stats_against="reference"`) or against this model under the negative condition (`"negative"`, for
        GCPO's full-vocabulary KL); the other side runs under `no_grad` and its log-probs are returned as
        `other_logp`. `"entropy"` alone needs no other side (then `other_logp` is None).
        """
        temperature = self._temperature(rollout.extras, estimator)
        stats = tuple(stats)
        bad = [s for s in stats if s not in STATS]
        if bad:
            raise ValueError(f"unknown statistics {bad}; valid: {list(STATS)}")
        if stats_against not in ("reference", "negative"):
            raise ValueError(f"stats_against must be 'reference' or 'negative', got {stats_against!r}")
        if stats_against == "negative" and condition == "negative" and any(s != "entropy" for s in stats):
            raise ValueError("stats_against='negative' compares with the negative condition: score condition='positive'")
        prompt_ids, prompt_mask = self._condition_prompt(rollout, condition)
        resp, resp_mask = rollout.response_ids, rollout.response_mask
        if not stats:  # a no-grad scoring (the reference's, GCPO's negative): no [N, T, V] logits when the model allows
            with self.scoring_model(use_reference) as m:
                logp = self._response_logprob_no_grad(m, prompt_ids, prompt_mask, resp, resp_mask, rollout.extras, temperature)
            if logp is not None:
                return TokenScores(logp=logp, stats={})
        with self.scoring_model(use_reference) as m:
            logits = self._response_logits(m, prompt_ids, prompt_mask, resp, resp_mask, rollout.extras)  # [N, T, V]
        other = None
        if any(s != "entropy" for s in stats):
            # the other side: the reference under the same prompt, or this model under the negative prompt
            if stats_against == "reference":
                (o_ids, o_mask), o_reference = (prompt_ids, prompt_mask), True
            else:
                (o_ids, o_mask), o_reference = self._condition_prompt(rollout, "negative"), use_reference
            with torch.no_grad(), self.scoring_model(o_reference) as om:
                st = self._other_stats_no_grad(logits, om, o_ids, o_mask, resp, resp_mask, rollout.extras, temperature, stats)
                if st is None:  # the model does not allow the chunked head: the other side's full logits
                    other = self._response_logits(om, o_ids, o_mask, resp, resp_mask, rollout.extras)  # [N, T, V]
            if st is not None:  # the other side's logits were never materialised whole (DGPO's reference, GCPO's full KL)
                logp = score_logits(logits, resp, resp_mask, temperature=temperature).logp  # [N, T]
                valid = resp_mask.bool()
                other_logp = st.pop("other_logp")
                return TokenScores(logp=logp, stats=st, other_logp=torch.where(valid, other_logp, torch.zeros_like(other_logp)))
        return score_logits(logits, resp, resp_mask, temperature=temperature, other_logits=other, stats=stats)

    batches_negative_condition = True
    """Whether `logprob_with_negative` can stack the negative condition into the positive forward's batch (text
    prompts: the two conditions differ only in the prompt tokens)."""

    def logprob_with_negative(self, rollout: Rollout, *, stats: tuple[str, ...] = (), **estimator: Any
                              ) -> tuple[TokenScores, torch.Tensor]:
        """GCPO's two scorings in one forward: the positive and the negative prompts stacked into one batch of 2N rows
        (re-padded on the left to a common width; position ids count real tokens, so the padding changes nothing).

        Returns (the positive `TokenScores` with the gradient, as `logprob(rollout, stats=stats)`; the negative
        condition's log-probs [N, T], detached, as `logprob(rollout, condition="negative")` under `no_grad`). One
        forward of 2N rows instead of two of N: fewer, larger calls (latency-bound models), but the backward runs over
        all 2N rows and the graph holds both halves' activations, so on a compute-bound model it costs more than the
        separate no-grad negative forward (`gcpo_negative_forward`, benchmarks/method_costs.py)."""
        temperature = self._temperature(rollout.extras, estimator)
        stats = tuple(stats)
        if any(s != "entropy" for s in stats):
            raise ValueError(f"logprob_with_negative takes the entropy only, got stats={stats}")
        pos_ids, pos_mask = self._condition_prompt(rollout, "positive")
        neg_ids, neg_mask = self._condition_prompt(rollout, "negative")
        width = max(pos_ids.shape[1], neg_ids.shape[1])

        def pad(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            extra = width - ids.shape[1]
            ids = torch.nn.functional.pad(ids, (extra, 0), value=0)  # masked out: never read
            return ids, torch.nn.functional.pad(mask.bool(), (extra, 0), value=False)

        (pi, pm), (ni, nm) = pad(pos_ids, pos_mask), pad(neg_ids, neg_mask)
        n = pi.shape[0]
        resp, resp_mask = rollout.response_ids, rollout.response_mask
        with self.scoring_model(False) as m:
            logits = self._response_logits(m, torch.cat([pi, ni]), torch.cat([pm, nm]), torch.cat([resp, resp]),
                                           torch.cat([resp_mask, resp_mask]), rollout.extras)  # [2N, T, V]
        pos = score_logits(logits[:n], resp, resp_mask, temperature=temperature, stats=stats)
        with torch.no_grad():
            neg = score_logits(logits[n:].detach(), resp, resp_mask, temperature=temperature).logp  # [N, T]
        return pos, neg

    def forward_noise(self, rollout: Rollout, num_copies: int = 1, generator: torch.Generator | None = None, *,
                      min_rate: float | None = None) -> NoisedBatch:
        """The clean sequence, R = 1 whatever `num_copies` asks (an autoregressive model has no masking noise), so
        WDCE becomes the weighted sequence NLL: noise_mask = response_mask, n_masked = rates = 1."""
        if not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"num_copies must be an integer >= 1, got {num_copies!r}")
        n, p = rollout.prompt_ids.shape
        dev = rollout.response_ids.device
        extras = dict(rollout.extras)
        extras["temperature"] = self._temperature(rollout.extras, {})
        return NoisedBatch(
            input_ids=torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1),  # [N, P+T]
            attention_mask=torch.cat([rollout.prompt_mask.bool(), rollout.response_mask.bool()], dim=1),  # [N, P+T]
            noise_mask=rollout.response_mask.bool()[None].clone(),  # [1, N, T]
            n_masked=torch.ones(1, n, device=dev),  # [1, N]
            rates=torch.ones(1, n, device=dev),  # [1, N]
            num_copies=1,
            prompt_len=p,
            extras=extras,
        )

    def denoise_logprob(self, noised: NoisedBatch, *, use_reference: bool = False) -> torch.Tensor:
        """[R, N, T] teacher-forced log-probs of the clean response tokens at `noise_mask` positions, 0 elsewhere
        (equal to `logprob(rollout).logp` for the batch of `forward_noise`)."""
        r, p = noised.num_copies, noised.prompt_len
        n = noised.input_ids.shape[0] // r
        temperature = self._temperature(noised.extras, {})
        out = []
        with self.scoring_model(use_reference) as m:
            for c in range(r):
                rows = slice(c * n, (c + 1) * n)
                ids, mask = noised.input_ids[rows], noised.attention_mask[rows].bool()  # [N, P+T]
                resp, resp_mask = ids[:, p:], mask[:, p:]  # [N, T]
                logits = self._response_logits(m, ids[:, :p], mask[:, :p], resp, resp_mask, noised.extras)  # [N, T, V]
                out.append(score_logits(logits, resp, noised.noise_mask[c], temperature=temperature).logp)  # [N, T]
        return torch.stack(out)  # [R, N, T]

    def token_strings(self, rollout: Rollout) -> list[list[str]]:
        """The decoded string of every valid response token, row by row (for token-credit heatmaps)."""
        ids, mask = rollout.response_ids.cpu(), rollout.response_mask.cpu().bool()
        flat = ids[mask].tolist()
        pieces = self.tokenizer.batch_decode([[t] for t in flat], skip_special_tokens=False)
        out, start = [], 0
        for count in mask.sum(-1).tolist():
            out.append(pieces[start : start + count])
            start += count
        return out

    # ------------------------------------------------------------------ checkpoints

    def _save_processor(self, path: Path) -> None:
        self.tokenizer.save_pretrained(path)

    def save_pretrained(self, path: str | Path) -> None:
        """Weights as safetensors, the tokenizer (processor for the VLM) and `mmrl_adapter.json` (family and
        generation defaults), so `from_pretrained(path)` rebuilds this adapter. A peft (LoRA) model is saved
        merged into its base weights (a plain checkpoint; the trainer checkpoints adapters separately)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model = self.unwrapped
        if is_peft_model(model):
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(path)
        self._save_processor(path)
        meta = {"family": self.family, "generation_defaults": self.generation_defaults}
        (path / ADAPTER_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")

    @classmethod
    def _load_model(cls, path: Path, **kwargs: Any) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, **kwargs)

    @classmethod
    def _load_processor(cls, path: Path, **kwargs: Any):
        return load_tokenizer(path, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trust_remote_code: bool = False,
        dtype: Any = None,
        device: torch.device | str | None = None,
        ref_model: bool | str = False,
        quantization_config: Any = None,
        **generation_defaults: Any,
    ) -> "CausalLMAdapter":
        """Load from a local directory (never the Hub; a missing path raises FileNotFoundError naming it).

        `trust_remote_code` is passed to transformers only when True. `ref_model=True` loads a second frozen copy
        as the reference; a string loads the reference from that directory. Generation defaults saved in
        `mmrl_adapter.json` apply, overridden by `generation_defaults`. `quantization_config` (transformers'
        `BitsAndBytesConfig`, QLoRA) quantizes the model as it loads, placed on `device` by `device_map` (a
        quantized model cannot be moved afterwards); the reference is then the adapter-disabled base, never a copy.
        """
        path = local_dir(path)
        saved = read_adapter_file(path, cls.family)
        load_kwargs: dict[str, Any] = {"local_files_only": True}
        if trust_remote_code:
            from mmrl.core.remote_code import warn_remote_code

            warn_remote_code(path)
            load_kwargs["trust_remote_code"] = True
        model_kwargs = dict(load_kwargs)
        if dtype is not None:
            model_kwargs["dtype"] = resolve_dtype(dtype)
        if quantization_config is not None:
            if ref_model:
                raise ValueError("a quantized base (QLoRA) is its own reference with the adapters disabled: ref_model must be False")
            model_kwargs["quantization_config"] = quantization_config
            model_kwargs["device_map"] = {"": str(device) if device is not None else "cpu"}
        model = cls._load_model(path, **model_kwargs)
        processor = cls._load_processor(path, **load_kwargs)
        ref = None
        if ref_model:
            ref_path = path if ref_model is True else local_dir(ref_model, "reference model")
            ref = cls._load_model(ref_path, **model_kwargs)
        if device is not None:
            if quantization_config is None:
                model.to(device)
            if ref is not None:
                ref.to(device)
        return cls(model, processor, ref_model=ref, **{**saved, **generation_defaults})
