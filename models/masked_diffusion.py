"""Masked-diffusion language models (LLaDA, Dream, transformers-native bidirectional backbones) as mmrl policies.

Sampling (`sample`, option `sampler`):

| sampler | algorithm (source) | exact `old_logp` |
|---|---|---|
| `low_confidence` | LLaDA semi-AR blocks, top-k by softmax confidence (LLaDA `generate`) | no |
| `random` | the same with random confidences (LLaDA `remasking="random"`) | no |
| `entropy`, `maskgit_plus`, `topk_margin` | Dream's orders and schedule (Dream `generation_utils.py`) | no |
| `threshold` | Fast-dLLM parallel decoding: top-1 + every masked token with confidence >= `threshold` | no |
| `threshold_cache` | the same with Fast-dLLM's prefix KV cache (native backbones; others decode uncached) | no |
| `easy_first` | MGDM's easy-first top-k over the whole span, re-masking less confident earlier choices (MGDM, RDM) | no |
| `random_order` | DMPO's ROAR: random order inside each block, exact per-token log-probs | yes |

`cache="prefix"` adds Fast-dLLM's prefix cache to the LLaDA and Dream samplers too (DMPO's default training sampler
is low-confidence with two tokens per step over the prefix cache); `cache="dual"` is Fast-dLLM's DualCache (only the
block is fed; the suffix keys/values come from the block's first forward too). `threshold_cache` = `threshold` with
`cache="prefix"` unless `cache="dual"` is asked. Caches need a transformers-native backbone; others decode uncached.

Options: `gen_length`, `block_length` (None or >= `gen_length` = one block over the whole span; LLaDA recipes use 32),
`steps` (None = `gen_length`), `temperature` (0 = greedy), `threshold` (0.9), `top_p` (Dream orders only), `cache`,
`negative_instruction` (GCPO). The default temperature is 1 (an RL policy samples; TRL's default, d1 uses 0.9, DMPO
0.2); evaluation recipes use 0 (greedy). The mask token is never sampled, and log-probs are over the other tokens
(`dllm_samplers.suppress_tokens`). Randomness is per response row (`seeds=`), as in the causal-LM adapter.

The rollout's `response_ids` [N, T] are the whole generated span (T = gen_length); `response_mask` runs up to and
including the first EOS (TRL's completion mask).

Log-probs (`logprob(..., estimator=...)`, docs/algorithms.md sections 5 and 7):

- `"mean_field"` (d1 / diffu-GRPO): all response tokens masked, each real prompt token masked with
  `p_mask_prompt` (0.15), one forward. Post-EOS positions are 0 (`padding="drop"`).
- `"elbo"` (DMPO): `num_copies` antithetic masked copies of the whole generated span; per-token
  `log p * |o| / m` averaged over copies. With `padding="fold"` (default) the contributions of post-EOS positions
  are added onto the EOS token, so the sum over valid tokens is DMPO's whole-span sequence ELBO.
- `"exact"`: re-scores the `random_order` sampler's recorded order (`rollout.extras["order"]`), one forward per
  (row, step); reproduces the rollout's `old_logp` (same folding).

Masks are seeded by `mask_seed` and each row's own tokens (`models.dllm_estimators`), so old / current /
reference / negative-condition scores share them and a row scores the same in any micro-batch.
`mean_field` and `elbo` score the model's distribution (temperature 1, as d1 and DMPO); `exact` scores the
sampling distribution (`softmax(logits / temperature)`, temperature 1 for greedy rollouts).

WDCE noise (`forward_noise`): R antithetic copies over the whole generated span, post-EOS padding included
(DMPO's `loss_mask_non_eos=False`); the prompt is never masked.

Infilling: a prompt `{"prompt": ..., "response_template": text}` starts the generated span from `text` (the mask
token string marks the positions to generate). Given positions are never resampled, never masked by the
estimators or `forward_noise`, and are not part of `response_mask` (no loss, no credit); `completions` decode the
whole span. `rollout.extras["fixed"]` [N, T] marks them.
"""
from __future__ import annotations

import contextlib
import copy
import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from einops import rearrange

from mmrl.algorithms.distributions import STATS
from mmrl.algorithms.dmpo import DEFAULT_MIN_MASK_RATE
from mmrl.models.base import (
    BaseAdapter,
    left_pad,
    mask_through_first_eos,
    score_logits,
    selective_log_softmax,
)
from mmrl.models.dllm_backbone import BackboneLogits, backbone_kind, base_model
from mmrl.models.dllm_native import family_of, load_native
from mmrl.models.dllm_estimators import (
    elbo_masks,
    elbo_token_contributions,
    exact_step_batches,
    exact_step_input,
    fold_padding,
    masked_copies_input,
    mean_field_input,
    mean_field_prompt_mask,
    row_seeds,
)
from mmrl.models.dllm_samplers import (
    CACHE_MODES,
    DREAM_ORDERS,
    RowStreams,
    block_schedule,
    GUMBEL_DTYPES,
    generate_dream,
    generate_easy_first,
    generate_low_confidence,
    generate_random_order,
    generate_threshold,
)
from mmrl.models.prompts import check_max_prompt_length, render_chat, truncate_left
from mmrl.core.protocol import DEFAULT_NEGATIVE_INSTRUCTION, NoisedBatch, Rollout, TokenScores

SAMPLERS = ("low_confidence", "random", *DREAM_ORDERS, "threshold", "threshold_cache", "easy_first", "random_order")
STOCHASTIC_AT_ZERO_TEMPERATURE = ("random", "random_order")
"""Samplers whose unmasking order is random, so that greedy tokens still give different responses."""
ESTIMATORS = ("mean_field", "elbo", "exact")
PADDING_MODES = ("fold", "drop")
GENERATION_KEYS = (
    "sampler", "gen_length", "block_length", "steps", "temperature", "threshold", "top_p", "cache", "negative_instruction",
    "max_prompt_length", "gumbel_dtype",
)
DEFAULT_GENERATION = {
    "sampler": "low_confidence",
    "gen_length": 32,
    "block_length": None,
    "steps": None,
    "temperature": 1.0,
    "threshold": 0.9,
    "top_p": None,
    "cache": None,
    "negative_instruction": DEFAULT_NEGATIVE_INSTRUCTION,
    "max_prompt_length": None,
    "gumbel_dtype": "float64",
}
ADAPTER_FILE = "mmrl_adapter.json"
_ADAPTER_KEYS = ("mask_token_id", "eos_token_ids", "pad_token_id", "shift_logits")


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module):
    """Dropout off while sampling; every submodule's own mode is restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _default_rope_parameters(config=None, device=None, seq_len=None, **kwargs):
    """The original RoPE inverse frequencies `base^(-2i / d)` and attention factor 1 (Su et al. 2021, RoFormer eq. 15;
    transformers 4's `_compute_default_rope_parameters`), from `config` (`rope_theta`, head dim, partial rotary
    factor) or from `base` / `dim` keywords."""
    if config is not None:
        params = getattr(config, "rope_parameters", None) or {}  # transformers 5 keeps rope_theta there
        base = float(getattr(config, "rope_theta", None) or params.get("rope_theta") or 10000.0)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    else:
        base, dim = float(kwargs["base"]), int(kwargs["dim"])
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base ** exponents), 1.0


def ensure_default_rope() -> None:
    """Register `"default"` in transformers' `ROPE_INIT_FUNCTIONS` when absent: transformers 5 dropped the key, and
    Dream's modelling code (NVlabs/Fast-dLLM `dream/model/modeling_dream.py`, as Dream's checkpoints) looks it up
    for plain RoPE ("KeyError: 'default'", found by scripts/check_real_architectures.py). Only an absent key is
    added; what transformers registers is never replaced."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ROPE_INIT_FUNCTIONS.setdefault("default", _default_rope_parameters)


def fill_rope_buffers(model: torch.nn.Module) -> int:
    """Recompute every RoPE module's non-persistent `inv_freq` buffer from its own `rope_init_fn` (in place, the
    buffer's dtype and device); returns how many modules were filled.

    transformers 5 builds a model on the meta device and gives each non-persistent buffer `torch.empty_like` memory,
    trusting `_init_weights` to fill it (its own `PreTrainedModel._init_weights` recomputes RoPE frequencies).
    Remote code written for transformers 4 overrides `_init_weights` for Linear / Embedding only (Dream's
    `DreamPreTrainedModel`, NVlabs/Fast-dLLM `dream/model/modeling_dream.py`), so its rotary frequencies stay
    uninitialised memory: different on every load (the reference and the policy differ), occasionally inf / NaN,
    which made DMPO's ELBOs and loss NaN at random (found by scripts/check_real_architectures.py, docs/sources.md
    "Real architectures"). The frequencies are a function of the config only (RoFormer eq. 15 for the default
    type), so recomputing them is what transformers does for its own classes."""
    filled = 0
    for module in model.modules():
        init_fn = getattr(module, "rope_init_fn", None)
        if not callable(init_fn) or "inv_freq" not in getattr(module, "_non_persistent_buffers_set", ()):
            continue
        buf = module.inv_freq
        inv_freq, scaling = init_fn(getattr(module, "config", None), buf.device, **(getattr(module, "rope_kwargs", None) or {}))
        with torch.no_grad():
            buf.copy_(inv_freq.to(buf.dtype))
        if hasattr(module, "original_inv_freq"):  # Dream's dynamic-RoPE reset target (an alias of the buffer)
            module.original_inv_freq = buf
        if hasattr(module, "attention_scaling"):
            module.attention_scaling = scaling
        filled += 1
    return filled


def transformers5_compatible(model_cls):
    """`model_cls` (remote modelling code written for transformers 4.x) made loadable by transformers 5.

    Incompatibilities found by scripts/check_real_architectures.py (docs/sources.md "Real architectures") in the
    public modelling code (NVlabs/Fast-dLLM `llada/model`, `dream/model`): LLaDA's `__init__` never calls
    `post_init()`, whose attributes (`all_tied_weights_keys`, ...) transformers 5 reads while loading ("no attribute
    'all_tied_weights_keys'"); LLaDA's `tie_weights(self)` takes no keyword arguments while transformers 5 passes
    `recompute_mapping`; Dream's `_tied_weights_keys` is transformers 4's list, on which transformers 5's
    `save_pretrained` fails; Dream's `DreamGenerationConfig.validate(self, is_init=False)` is called with
    `user_set_attributes`; Dream's `_init_weights` leaves its RoPE frequencies, a non-persistent buffer that
    transformers 5 allocates empty when loading, unfilled (`fill_rope_buffers`). `post_init` only sets static
    properties (no weights change); undeclared keywords are dropped; the list becomes the {tied: input embedding}
    mapping it means; `from_pretrained` fills the RoPE buffers after loading."""
    import sys

    if getattr(model_cls, "_mmrl_compat", False):
        return model_cls
    original_init = model_cls.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        tied = getattr(self, "_tied_weights_keys", None)
        if isinstance(tied, (list, tuple)):
            # transformers 4's list of tied names ("lm_head.weight", Dream's); transformers 5 wants {target: source}
            # and `save_pretrained` fails on a list ("'list' object has no attribute 'keys'")
            emb = self.get_input_embeddings().weight
            source = next(n for n, p in self.named_parameters(remove_duplicate=False) if p is emb)
            self._tied_weights_keys = {name: source for name in tied}
            self.post_init()
        elif not hasattr(self, "all_tied_weights_keys") and hasattr(self, "post_init"):
            self.post_init()

    model_cls.__init__ = __init__
    loader = model_cls.from_pretrained.__func__  # the remote class' own classmethod (Dream's) or transformers'

    def from_pretrained(cls, *args, **kwargs):
        out = loader(cls, *args, **kwargs)
        fill_rope_buffers(out[0] if isinstance(out, tuple) else out)  # `output_loading_info=True` returns a tuple
        return out

    model_cls.from_pretrained = classmethod(from_pretrained)
    _drop_new_keywords(model_cls, "tie_weights")
    from transformers import GenerationConfig

    module = sys.modules.get(model_cls.__module__)
    for obj in list(vars(module).values()) if module is not None else []:
        if isinstance(obj, type) and issubclass(obj, GenerationConfig) and obj is not GenerationConfig:
            _drop_new_keywords(obj, "validate")  # Dream's `validate(self, is_init=False)`; transformers 5 passes more
    model_cls._mmrl_compat = True
    return model_cls


def _drop_new_keywords(cls, name: str) -> None:
    """Let `cls.name`, defined without `**kwargs`, accept (and ignore) keyword arguments it does not declare."""
    import inspect

    fn = cls.__dict__.get(name)
    if fn is None:
        return
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return

    def wrapper(self, *args, **kwargs):
        return fn(self, *args, **{k: v for k, v in kwargs.items() if k in params})

    setattr(cls, name, wrapper)


class MaskedDiffusionAdapter(BaseAdapter):
    """LLaDA / Dream / a bidirectional transformers decoder as an mmrl `Policy` (see the module docstring).

    Args:
        model: the backbone (`config.is_causal` is set to False for transformers-native classes).
        tokenizer: its tokenizer (prompts are strings or chat messages).
        ref_model: an optional frozen reference copy (else the adapter-disabled base of a peft model).
        mask_token_id, eos_token_ids, pad_token_id: override the ids read from the config / tokenizer.
        shift_logits: Dream-style right shift (default: `config.shift_logits`, else True for Dream).
        **generation_defaults: sampling options (`GENERATION_KEYS`), including `negative_instruction` (GCPO's
            negative condition, appended to the prompt).
    """

    family = "masked_diffusion"
    generation_option_names = GENERATION_KEYS

    @classmethod
    def config_errors(cls, cfg) -> list[str]:
        """Temperature 0 is greedy here (allowed only with a sampler that stays random), and the blocks must tile
        the completion (`block_length` divides `max_completion_length`, `diffusion_steps` a multiple of the blocks)."""
        e = [m for m in super().config_errors(cfg) if not m.startswith(f"temperature={cfg.temperature} must be > 0")]
        if cfg.temperature < 0:
            e.append(f"temperature={cfg.temperature} must be >= 0 (0 = greedy) for masked diffusion")
        if cfg.temperature == 0:
            sampler = cfg.sampler or cfg.generation_kwargs.get("sampler") or "low_confidence"
            if sampler not in STOCHASTIC_AT_ZERO_TEMPERATURE:
                e.append(f"temperature=0 with the {sampler!r} sampler is greedy and deterministic: the num_generations "
                         f"responses of a prompt would be identical (all advantages 0); use temperature > 0, or a sampler "
                         f"that stays random at temperature 0: {list(STOCHASTIC_AT_ZERO_TEMPERATURE)}")
        if cfg.max_completion_length >= 1 and cfg.block_length >= 1:
            if cfg.max_completion_length % cfg.block_length:
                e.append(f"block_length={cfg.block_length} does not divide max_completion_length={cfg.max_completion_length}; "
                         f"choose a divisor of {cfg.max_completion_length}")
            elif cfg.diffusion_steps is not None:
                blocks = cfg.max_completion_length // cfg.block_length
                if cfg.diffusion_steps < 1 or cfg.diffusion_steps % blocks:
                    e.append(f"diffusion_steps={cfg.diffusion_steps} must be a positive multiple of the number of blocks "
                             f"({blocks} = max_completion_length / block_length)")
        return e

    @classmethod
    def greedy_generation(cls, gen_length: int, block_length: int, steps: int) -> dict[str, Any]:
        """Greedy decoding: temperature 0 with low-confidence remasking, `steps` over blocks of `block_length`."""
        return {"gen_length": gen_length, "block_length": block_length, "steps": steps, "temperature": 0.0,
                "sampler": "low_confidence"}

    @classmethod
    def generation_options(cls, cfg) -> dict[str, Any]:
        steps = cfg.diffusion_steps or max(1, cfg.max_completion_length // 2)
        opts = {"gen_length": cfg.max_completion_length, "block_length": cfg.block_length, "steps": steps,
                "temperature": cfg.temperature, "threshold": cfg.threshold, "negative_instruction": cfg.negative_instruction,
                "max_prompt_length": cfg.max_prompt_length}
        if cfg.sampler is not None:
            opts["sampler"] = cfg.sampler
        if cfg.diffusion_cache is not None:
            opts["cache"] = cfg.diffusion_cache
        if cfg.gumbel_dtype != "float64":
            opts["gumbel_dtype"] = cfg.gumbel_dtype
        return opts

    @classmethod
    def estimator_options(cls, cfg, mask_seed: int, *, kind: str | None = None) -> dict[str, Any]:
        """Masked-diffusion log-probs are estimates: the estimator kind, its mask seed and its options."""
        kind = kind or cfg.logprob_estimator
        opts: dict[str, Any] = {"estimator": kind, "mask_seed": int(mask_seed)}
        if kind == "mean_field":
            opts["p_mask_prompt"] = cfg.p_mask_prompt
        elif kind == "elbo":
            opts["num_copies"] = cfg.dmpo_elbo_copies
            opts["min_mask_rate"] = cfg.dmpo_min_mask_rate
        return opts

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        ref_model: torch.nn.Module | None = None,
        mask_token_id: int | None = None,
        eos_token_ids: Sequence[int] | int | None = None,
        pad_token_id: int | None = None,
        shift_logits: bool | None = None,
        **generation_defaults: Any,
    ):
        super().__init__(model, ref_model=ref_model)
        self.tokenizer = tokenizer
        self.backbone = backbone_kind(model)
        config = base_model(model).config
        if self.backbone == "native":
            for m in (model, ref_model):
                if m is not None:
                    base_model(m).config.is_causal = False  # masked diffusion needs bidirectional attention
        self.vocab_size = int(getattr(config, "vocab_size", 0) or len(tokenizer))
        self.mask_token_id = self._resolve_id("mask_token_id", mask_token_id, config, getattr(tokenizer, "mask_token_id", None))
        self.pad_token_id = self._resolve_id("pad_token_id", pad_token_id, config, getattr(tokenizer, "pad_token_id", None))
        eos = _as_id_list(eos_token_ids) if eos_token_ids is not None else sorted(
            set(_as_id_list(getattr(config, "eos_token_id", None))) | set(_as_id_list(getattr(tokenizer, "eos_token_id", None)))
        )
        if not eos:
            raise ValueError(
                "no EOS token id: config.eos_token_id and the tokenizer's eos_token are both missing; pass eos_token_ids="
            )
        for i in eos:
            self._check_in_vocab("eos_token_ids", i)
        self.eos_token_ids = eos
        if shift_logits is None:
            shift_logits = getattr(config, "shift_logits", None)
        if shift_logits is None:
            shift_logits = self.backbone == "dream"
        self.shift_logits = bool(shift_logits)
        self.generation_defaults = self._resolve_generation({**DEFAULT_GENERATION, **generation_defaults})

    # ------------------------------------------------------------------------------------------ ids and options
    def _check_in_vocab(self, name: str, value: int) -> None:
        if not 0 <= value < self.vocab_size:
            raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.vocab_size})")

    def _resolve_id(self, name: str, explicit, config, from_tokenizer) -> int:
        """`explicit`, else `config.<name>`, else the tokenizer's; missing everywhere raises naming the field."""
        for value in (explicit, getattr(config, name, None), from_tokenizer):
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            if value is not None:
                self._check_in_vocab(name, int(value))
                return int(value)
        token = name.replace("_token_id", "_token")
        raise ValueError(
            f"no {name}: neither config.{name} nor the tokenizer's {token} is set (a masked-diffusion model needs "
            f"it); pass {name}= explicitly"
        )

    def _resolve_generation(self, options: dict) -> dict:
        """Validated sampling options (unknown keys and bad values raise naming them)."""
        unknown = sorted(set(options) - set(GENERATION_KEYS))
        if unknown:
            raise ValueError(f"unknown generation options {unknown}; valid: {list(GENERATION_KEYS)}")
        opts = dict(options)
        if opts["sampler"] not in SAMPLERS:
            raise ValueError(f"unknown sampler {opts['sampler']!r}; valid: {list(SAMPLERS)}")
        gl = opts["gen_length"]
        if isinstance(gl, bool) or not isinstance(gl, int) or gl < 1:
            raise ValueError(f"gen_length must be a positive int, got {gl!r}")
        if not (isinstance(opts["temperature"], (int, float)) and opts["temperature"] >= 0):
            raise ValueError(f"temperature must be a number >= 0, got {opts['temperature']!r}")
        if not (isinstance(opts["threshold"], (int, float)) and 0 <= opts["threshold"] <= 1):
            raise ValueError(f"threshold must be in [0, 1], got {opts['threshold']!r}")
        bl = self._block_length(opts)
        steps = gl if opts["steps"] is None else opts["steps"]
        block_schedule(gl, bl, None if opts["sampler"].startswith("threshold") else steps)
        ni = opts["negative_instruction"]
        if not isinstance(ni, str) or not ni.strip():
            raise ValueError(f"negative_instruction must be a non-empty string, got {ni!r}")
        if opts["cache"] not in CACHE_MODES:
            raise ValueError(f"unknown cache {opts['cache']!r}; valid: {list(CACHE_MODES)}")
        check_max_prompt_length(opts["max_prompt_length"])
        if opts["gumbel_dtype"] not in GUMBEL_DTYPES:
            raise ValueError(f"unknown gumbel_dtype {opts['gumbel_dtype']!r}; valid: {list(GUMBEL_DTYPES)}")
        if opts["gumbel_dtype"] != "float64" and opts["sampler"] not in ("low_confidence", "random"):
            raise ValueError(f"gumbel_dtype={opts['gumbel_dtype']!r} reproduces d1's low-confidence rollouts; sampler "
                             f"{opts['sampler']!r} draws in float64 (use sampler=low_confidence)")
        if opts["sampler"] == "random_order" and opts["cache"]:
            raise ValueError("sampler='random_order' records exact log-probs and cannot use the approximate prefix cache")
        return opts

    @staticmethod
    def _block_length(opts: dict) -> int:
        """The block width: None or anything >= gen_length means one block over the whole span."""
        gl, bl = opts["gen_length"], opts["block_length"]
        if bl is None:
            return gl
        if isinstance(bl, bool) or not isinstance(bl, int) or bl < 1:
            raise ValueError(f"block_length must be a positive int or None, got {bl!r}")
        return min(bl, gl)

    @property
    def negative_instruction(self) -> str:
        return self.generation_defaults["negative_instruction"]

    # ------------------------------------------------------------------------------------------ prompts
    def _prompt_text(self, prompt) -> str:
        if isinstance(prompt, dict):
            if "prompt" not in prompt:
                raise ValueError(f"a dict prompt needs a 'prompt' key (and optionally 'response_template'), got keys {sorted(prompt)}")
            return self._prompt_text(prompt["prompt"])
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            return render_chat(self.tokenizer, prompt)
        raise TypeError(
            f"a masked-diffusion prompt must be a string or a list of chat messages (dicts), got {type(prompt).__name__}"
        )

    def negative_prompt(self, prompt, instruction: str | None = None):
        """GCPO's negative condition for text: the prompt with the wrong-answer instruction appended (after a
        newline; inside the last user message for chat prompts)."""
        instruction = instruction or self.negative_instruction
        if isinstance(prompt, dict):
            return {**prompt, "prompt": self.negative_prompt(prompt.get("prompt"), instruction)}
        if isinstance(prompt, str):
            return f"{prompt}\n{instruction}"
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            msgs = [dict(m) for m in prompt]
            users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
            i = users[-1] if users else len(msgs) - 1
            if not isinstance(msgs[i].get("content"), str):
                raise TypeError("the negative condition needs a text message content")
            msgs[i]["content"] = f"{msgs[i]['content']}\n{instruction}"
            return msgs
        return self._prompt_text(prompt)  # raises the type error

    def encode_prompts(self, prompts: Sequence, max_prompt_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded (ids [N, P], mask [N, P]) of prompts (strings tokenized without added special tokens; chat
        messages through the tokenizer's chat template with the generation prompt, `models.prompts.render_chat`),
        each cut to its last `max_prompt_length` tokens (default: the generation default; None keeps all)."""
        limit = check_max_prompt_length(max_prompt_length if max_prompt_length is not None else self.generation_defaults["max_prompt_length"])
        ids = [truncate_left(self.tokenizer(self._prompt_text(p), add_special_tokens=False)["input_ids"], limit) for p in prompts]
        for p, row in zip(prompts, ids):
            if self.mask_token_id in row:
                raise ValueError(f"prompt {p!r} contains the mask token")
        return left_pad(ids, self.pad_token_id, self.device)

    def response_templates(self, prompts: Sequence, gen_length: int) -> torch.Tensor | None:
        """[N, gen_length] initial canvases for infilling, or None when no prompt has a `response_template`.

        A prompt `{"prompt": ..., "response_template": text}` gives the generated span's starting tokens: `text`
        is tokenized (the mask token string marks the positions to generate) and padded with masks to
        `gen_length`; every other position is given and never resampled (masked-diffusion infilling, e.g. a Sudoku
        grid whose known cells are filled in)."""
        if not any(isinstance(p, dict) and p.get("response_template") is not None for p in prompts):
            return None
        rows = []
        for p in prompts:
            text = p.get("response_template") if isinstance(p, dict) else None
            ids = [] if text is None else self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > gen_length:
                raise ValueError(f"response_template {text!r} has {len(ids)} tokens, more than gen_length={gen_length}")
            rows.append(list(ids) + [self.mask_token_id] * (gen_length - len(ids)))
        return torch.tensor(rows, dtype=torch.long, device=self.device)  # [N, T]

    def _condition_prompt(self, rollout: Rollout, condition: str) -> tuple[torch.Tensor, torch.Tensor]:
        if condition == "positive":
            return rollout.prompt_ids, rollout.prompt_mask.bool()
        if condition == "negative":
            if rollout.neg_prompt_ids is None:
                return self.encode_prompts([self.negative_prompt(p) for p in rollout.prompts])
            return rollout.neg_prompt_ids, rollout.neg_prompt_mask.bool()
        raise ValueError(f"condition must be 'positive' or 'negative', got {condition!r}")

    # ------------------------------------------------------------------------------------------ forwards
    def _logits(self, model: torch.nn.Module, prompt_ids, prompt_mask, response_part) -> torch.Tensor:
        """[B, T, V] aligned logits of the response positions of `prompt ⊕ response_part` (one forward)."""
        ids = torch.cat([prompt_ids, response_part], dim=1)  # [B, P + T]
        attn = torch.cat([prompt_mask.bool(), torch.ones_like(response_part, dtype=torch.bool)], dim=1)  # [B, P + T]
        fn = BackboneLogits(model, attn, kind=self.backbone, shift=self.shift_logits, suppress_ids=(self.mask_token_id,),
                            fast_linears=True)
        return fn.window(ids, prompt_ids.shape[1])

    def backbone_logits(self, prompt_mask: torch.Tensor, gen_length: int, model: torch.nn.Module | None = None,
                        attend: torch.Tensor | None = None) -> BackboneLogits:
        """The sampler's `logits_fn` for prompts with padding mask `prompt_mask` [B, P] plus `gen_length` positions;
        `attend` [B, P + T, P + T] an optional custom attention pattern (`BackboneLogits`, native backbones)."""
        attn = torch.cat(
            [prompt_mask.bool(), torch.ones(prompt_mask.shape[0], gen_length, dtype=torch.bool, device=prompt_mask.device)],
            dim=1,
        )  # [B, P + T]
        return BackboneLogits(
            model or self.unwrapped, attn, kind=self.backbone, shift=self.shift_logits, suppress_ids=(self.mask_token_id,),
            attend=attend,
        )

    # ------------------------------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | torch.Tensor | None = None,
        init: torch.Tensor | None = None,
        **generation,
    ) -> dict:
        """Run the configured sampler on left-padded prompts -> {"ids" [B, P+T], "logp" [B, T] | None,
        "order" [B, T] | None, "nfe": forward passes, "tokens_fed": positions fed through the backbone}.

        Randomness is per row (`RowStreams`): `seeds` [B], or B seeds drawn from `generator` (torch's default
        generator if None)."""
        o = self._resolve_generation({**self.generation_defaults, **generation})
        gl = o["gen_length"]
        bl = self._block_length(o)
        steps = gl if o["steps"] is None else o["steps"]
        sampler, temp = o["sampler"], float(o["temperature"])
        fn = self.backbone_logits(prompt_mask, gl)
        logp = order = None
        b = prompt_ids.shape[0]
        if seeds is not None:
            streams = RowStreams(seeds, self.device)
            if len(streams) != b:
                raise ValueError(f"seeds has {len(streams)} entries for {b} responses")
        else:
            streams = RowStreams.from_generator(b, generator, self.device)
        common = dict(gen_length=gl, mask_id=self.mask_token_id, temperature=temp, generator=streams, init=init)
        with _eval_mode(self.unwrapped):
            if sampler in ("low_confidence", "random"):
                ids = generate_low_confidence(
                    fn, prompt_ids, block_length=bl, steps=steps, remasking=sampler, cache=o["cache"],
                    gumbel_dtype=o["gumbel_dtype"], **common
                )
            elif sampler in DREAM_ORDERS:
                ids = generate_dream(
                    fn, prompt_ids, block_length=bl, steps=steps, alg=sampler, top_p=o["top_p"],
                    cache=o["cache"], **common,
                )
            elif sampler in ("threshold", "threshold_cache"):
                ids = generate_threshold(
                    fn, prompt_ids, block_length=bl, threshold=float(o["threshold"]),
                    cache=o["cache"] or ("prefix" if sampler == "threshold_cache" else None), **common,
                )
            elif sampler == "easy_first":
                if bl < gl:
                    raise ValueError(f"sampler 'easy_first' decodes the whole span as one block; got block_length={bl} "
                                     f"< gen_length={gl} (use block_length=None or >= gen_length)")
                ids = generate_easy_first(fn, prompt_ids, steps=steps, **common)
            else:
                ids, logp, order = generate_random_order(fn, prompt_ids, block_length=bl, steps=steps, **common)
        return {"ids": ids, "logp": logp, "order": order, "nfe": fn.nfe, "tokens_fed": fn.tokens_fed}

    def sample(
        self,
        prompts: list,
        group_size: int,
        *,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | torch.Tensor | None = None,
        **generation,
    ) -> Rollout:
        """G responses per prompt (rows g*G .. g*G+G-1); `old_logp` only for `sampler="random_order"`.

        Randomness is per response row: `seeds` ([N] ints) or N seeds drawn from `generator`; a row's tokens then
        depend only on its prompt and its seed, whatever else is in the batch."""
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
            raise ValueError(f"prompts must be a non-empty list, got {prompts!r}")
        rep = [p for p in prompts for _ in range(group_size)]
        opts = {**self.generation_defaults, **generation}
        prompt_ids, prompt_mask = self.encode_prompts(rep, opts["max_prompt_length"])
        init = self.response_templates(rep, opts["gen_length"])  # [N, T] or None
        out = self.generate(prompt_ids, prompt_mask, generator=generator, seeds=seeds, init=init, **generation)
        p = prompt_ids.shape[1]
        response_ids = out["ids"][:, p:]  # [N, T]
        span_mask = mask_through_first_eos(response_ids, self.eos_token_ids)  # [N, T]
        # the response tokens the policy chose: through the first EOS, without the given (infilled) ones
        fixed = init != self.mask_token_id if init is not None else None  # [N, T]
        response_mask = span_mask & ~fixed if fixed is not None else span_mask
        neg_ids, neg_mask = self.encode_prompts([self.negative_prompt(x, opts["negative_instruction"]) for x in rep], opts["max_prompt_length"])
        extras = {"sampler": opts["sampler"], "temperature": float(opts["temperature"]), "nfe": out["nfe"],
                  # finished iff an EOS was generated inside the span (else the answer ran into the span's end)
                  "terminated": torch.isin(response_ids, torch.as_tensor(self.eos_token_ids, device=response_ids.device)).any(-1)}
        if fixed is not None:
            extras["fixed"] = fixed
        old_logp = None
        if out["order"] is not None:
            extras["order"] = out["order"]
            extras["span_logp"] = out["logp"]  # [N, T] every generated position, post-EOS included
            old_logp = fold_padding(out["logp"], response_mask)
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            group_size=group_size,
            prompts=rep,
            completions=self._decode(response_ids, span_mask),
            old_logp=old_logp,
            neg_prompt_ids=neg_ids,
            neg_prompt_mask=neg_mask,
            extras=extras,
        )

    def _decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return [
            self.tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
            for row, m in zip(response_ids.cpu(), response_mask.cpu())
        ]

    def token_strings(self, rollout: Rollout) -> list[list[str]]:
        """The decoded string of every valid response token."""
        return [
            [self.tokenizer.decode([t]) for t in row[m].tolist()]
            for row, m in zip(rollout.response_ids.cpu(), rollout.response_mask.cpu())
        ]

    # ------------------------------------------------------------------------------------------ log-probs
    def logprob(
        self,
        rollout: Rollout,
        *,
        condition: str = "positive",
        use_reference: bool = False,
        stats: tuple[str, ...] = (),
        stats_against: str = "reference",
        estimator: str = "mean_field",
        mask_seed: int = 0,
        num_copies: int = 4,
        min_mask_rate: float = DEFAULT_MIN_MASK_RATE,
        p_mask_prompt: float = 0.15,
        padding: str | None = None,
        temperature: float | None = None,
        rows_per_chunk: int = 256,
    ) -> TokenScores:
        """Per-token log-prob estimates [N, T] of `rollout.response_ids` (see the module docstring).

        Args:
            estimator: "mean_field" (d1), "elbo" (DMPO, `num_copies` antithetic copies) or "exact" (random-order
                rollouts).
            mask_seed: seeds the masks together with each row's tokens; the same seed gives the same masks.
            min_mask_rate: elbo: the lowest mask rate of a copy (`dmpo_min_mask_rate`).
            p_mask_prompt: mean-field prompt masking probability (d1: 0.15).
            padding: "fold" (post-EOS contributions added onto the EOS token; default for elbo / exact) or "drop"
                (zeroed; default for mean_field).
            temperature: the scored distribution is `softmax(logits / temperature)`; default 1 for mean_field /
                elbo, the rollout's sampling temperature (1 if greedy) for exact.
            stats, stats_against: per-token statistics (`mmrl.algorithms.STATS`) against the reference model under
                the same condition, or against this model under the negative condition, from the same masked
                inputs; `other_logp` then holds the other side's estimate (None when only "entropy" is asked,
                which needs no other side).
            rows_per_chunk: sequences per forward of the exact estimator.
        """
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {estimator!r}; valid: {list(ESTIMATORS)}")
        if stats_against not in ("reference", "negative"):
            raise ValueError(f"stats_against must be 'reference' or 'negative', got {stats_against!r}")
        bad = [s for s in stats if s not in STATS]
        if bad:
            raise ValueError(f"unknown statistics {bad}; valid: {list(STATS)}")
        padding = padding or ("drop" if estimator == "mean_field" else "fold")
        if padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {list(PADDING_MODES)}, got {padding!r}")
        if temperature is None:
            temperature = 1.0
            if estimator == "exact":
                t = float(rollout.extras.get("temperature", self.generation_defaults["temperature"]))
                temperature = t if t > 0 else 1.0
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")

        prompt_ids, prompt_mask = self._condition_prompt(rollout, condition)
        other_cond = condition if stats_against == "reference" else "negative"
        other_ref = True if stats_against == "reference" else use_reference
        need_other = any(s != "entropy" for s in stats)  # entropy alone needs only this side's distribution
        sides = [(condition, use_reference)] + ([(other_cond, other_ref)] if need_other else [])
        args = dict(rollout=rollout, mask_seed=mask_seed, temperature=temperature)
        if estimator == "mean_field":
            out = self._mean_field(sides, p_mask_prompt=p_mask_prompt, stats=stats, **args)
        elif estimator == "elbo":
            out = self._elbo(sides, num_copies=num_copies, min_rate=min_mask_rate, stats=stats, **args)
        else:
            out = self._exact(sides, rows_per_chunk=rows_per_chunk, stats=stats, **args)
        valid = rollout.response_mask.bool()
        def finish(v: torch.Tensor) -> torch.Tensor:
            return fold_padding(v, valid) if padding == "fold" else torch.where(valid, v, torch.zeros_like(v))

        logp = finish(out.logp)
        other = finish(out.other_logp) if out.other_logp is not None else None
        st = {k: torch.where(valid, v, torch.zeros_like(v)) for k, v in out.stats.items()}
        return TokenScores(logp=logp, stats=st, other_logp=other)

    @staticmethod
    def _fixed(rollout: Rollout) -> torch.Tensor | None:
        """[N, T] bool: response positions given by a response template (infilling), or None."""
        fixed = rollout.extras.get("fixed")
        return None if fixed is None else fixed.to(rollout.response_ids.device).bool()

    def _sides_logits(self, sides, rollout, build) -> list[torch.Tensor]:
        """Logits [B, T, V] for each side (condition, use_reference); `build(prompt_ids, prompt_mask)` returns
        (prompt_ids, prompt_mask, response_part) of the noised input. Only the first side carries a gradient."""
        out = []
        for j, (condition, use_ref) in enumerate(sides):
            pid, pmask, resp_part = build(*self._condition_prompt(rollout, condition))
            with self.scoring_model(use_ref) as m, (torch.no_grad() if j else contextlib.nullcontext()):
                out.append(self._logits(m, pid, pmask, resp_part))
        return out

    def _selected_logprob(self, side, rollout, build, select: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """[B, T] log-probs of `targets` at `select` (0 elsewhere) for one side, with the LM head run on the selected
        positions only (`BackboneLogits.selected_logprob`), or None where the backbone has no plain linear head."""
        condition, use_ref = side
        pid, pmask, part = build(*self._condition_prompt(rollout, condition))
        with self.scoring_model(use_ref) as m:
            ids = torch.cat([pid, part], dim=1)  # [B, P + T]
            attn = torch.cat([pmask.bool(), torch.ones_like(part, dtype=torch.bool)], dim=1)  # [B, P + T]
            fn = BackboneLogits(m, attn, kind=self.backbone, shift=self.shift_logits, suppress_ids=(self.mask_token_id,),
                                fast_linears=True)
            if fn.output_head() is None:
                return None
            picked = fn.selected_logprob(ids, pid.shape[1], select, targets)  # [M]
        return torch.zeros(select.shape, dtype=picked.dtype, device=picked.device).masked_scatter(select, picked)

    def _mean_field(self, sides, *, rollout, mask_seed, temperature, p_mask_prompt, stats) -> TokenScores:
        seeds = row_seeds(mask_seed, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, "prompt")
        resp = rollout.response_ids

        fixed = self._fixed(rollout)

        def build(pid, pmask):
            ids = mean_field_input(pid, mean_field_prompt_mask(pmask, p_mask_prompt, seeds), resp, self.mask_token_id)
            part = ids[:, pid.shape[1] :]
            if fixed is not None:  # infilled (given) positions stay visible
                part = torch.where(fixed, resp, part)
            return ids[:, : pid.shape[1]], pmask, part

        logits = self._sides_logits(sides, rollout, build)
        other = logits[1] if len(logits) > 1 else None
        return score_logits(logits[0], resp, torch.ones_like(resp, dtype=torch.bool), temperature=temperature,
                            other_logits=other, stats=tuple(stats))

    def _elbo(self, sides, *, rollout, mask_seed, temperature, num_copies, min_rate, stats) -> TokenScores:
        if isinstance(num_copies, bool) or not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"num_copies must be a positive int, got {num_copies!r}")
        seeds = row_seeds(mask_seed, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, "response")
        resp = rollout.response_ids
        r = num_copies
        masked, _ = elbo_masks(seeds, r, resp.shape[1], resp.device, min_rate=min_rate)  # [R, N, T]
        fixed = self._fixed(rollout)
        if fixed is not None:  # given positions are never masked (antithetic pairs stay complements on the rest)
            masked = masked & ~fixed[None]

        def build(pid, pmask):
            ids = masked_copies_input(pid, resp, masked, self.mask_token_id)  # [R*N, P+T]
            return ids[:, : pid.shape[1]], pmask.repeat(r, 1), ids[:, pid.shape[1] :]

        flat_masked = rearrange(masked, "r n t -> (r n) t")  # [R*N, T]
        per_copy = lambda v: rearrange(v, "(r n) t -> r n t", r=r)  # noqa: E731  [R*N, T] -> [R, N, T]
        if not stats and temperature == 1.0:  # DMPO's likelihoods: the LM head on the masked positions only
            picked = self._selected_logprob(sides[0], rollout, build, flat_masked, resp.repeat(r, 1))
            if picked is not None:
                return TokenScores(logp=elbo_token_contributions(per_copy(picked), masked), stats={})
        logits = self._sides_logits(sides, rollout, build)  # [R*N, T, V] each
        other = logits[1] if len(logits) > 1 else None
        sc = score_logits(logits[0], resp.repeat(r, 1), flat_masked, temperature=temperature, other_logits=other,
                          stats=tuple(stats))
        contrib = elbo_token_contributions(per_copy(sc.logp), masked)  # [N, T]
        other_contrib = None
        if sc.other_logp is not None:
            other_contrib = elbo_token_contributions(per_copy(sc.other_logp), masked)  # [N, T]
        count = masked.sum(0).clamp(min=1).float()  # [N, T] copies in which each position was masked
        st = {k: torch.where(masked, per_copy(v), torch.zeros_like(per_copy(v))).sum(0) / count for k, v in sc.stats.items()}
        return TokenScores(logp=contrib, stats=st, other_logp=other_contrib)

    def _exact(self, sides, *, rollout, mask_seed, temperature, rows_per_chunk, stats) -> TokenScores:
        order = rollout.extras.get("order")
        if order is None:
            raise ValueError(
                "estimator='exact' needs rollout.extras['order'], recorded by sampler='random_order'; this rollout was "
                f"sampled with {rollout.extras.get('sampler', 'an unknown sampler')!r}"
            )
        resp = rollout.response_ids
        n, t = resp.shape
        order = order.to(resp.device)
        prompts = [self._condition_prompt(rollout, cond) for cond, _ in sides]
        per_side = [[] for _ in sides]
        targets, flat_idx = [], []
        for rows, steps in exact_step_batches(order, rows_per_chunk):
            sel = order[rows] == steps[:, None]  # [c, T] positions revealed at that step
            r_sel, c_sel = sel.nonzero(as_tuple=True)  # [m], [m]
            targets.append(resp[rows][sel])  # [m]
            flat_idx.append(rows[r_sel] * t + c_sel)  # [m]
            empty = resp.new_zeros(rows.shape[0], 0)
            resp_part = exact_step_input(empty, resp[rows], order[rows], steps, self.mask_token_id)  # [c, T]
            for j, (_, use_ref) in enumerate(sides):
                pid, pmask = prompts[j]
                with self.scoring_model(use_ref) as m, (torch.no_grad() if j else contextlib.nullcontext()):
                    per_side[j].append(self._logits(m, pid[rows], pmask[rows], resp_part)[sel])  # [m, V]
        idx = torch.cat(flat_idx)  # [M]
        tgt = torch.cat(targets)[None]  # [1, M]
        main = torch.cat(per_side[0])[None]  # [1, M, V]
        other = torch.cat(per_side[1])[None] if len(sides) > 1 else None
        sc = score_logits(main, tgt, torch.ones_like(tgt, dtype=torch.bool), temperature=temperature,
                          other_logits=other, stats=tuple(stats))

        def scatter(v: torch.Tensor) -> torch.Tensor:
            return torch.zeros(n * t, dtype=v.dtype, device=v.device).scatter(0, idx, v[0]).reshape(n, t)  # [N, T]

        return TokenScores(
            logp=scatter(sc.logp),
            stats={k: scatter(v) for k, v in sc.stats.items()},
            other_logp=scatter(sc.other_logp) if sc.other_logp is not None else None,
        )

    # ------------------------------------------------------------------------------------------ WDCE
    def forward_noise(self, rollout: Rollout, num_copies: int, generator: torch.Generator | None = None, *,
                      min_rate: float = DEFAULT_MIN_MASK_RATE) -> NoisedBatch:
        """R masked copies of each response for WDCE (`mmrl.algorithms.antithetic_masks`, antithetic when R is even),
        mask rates `min_rate + (1 - min_rate) U` (the config's `dmpo_min_mask_rate`).

        The whole generated span is maskable (DMPO masks post-EOS padding too, `loss_mask_non_eos=False`) except
        positions given by a response template (infilling); the prompt is never masked. Copy r of response i is row `r*N + i`; `extras["targets"]` holds the clean
        response tokens [N, T] that `denoise_logprob` scores.
        """
        from mmrl.algorithms.dmpo import antithetic_masks

        if isinstance(num_copies, bool) or not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"num_copies must be a positive int, got {num_copies!r}")
        resp = rollout.response_ids
        fixed = self._fixed(rollout)
        maskable = torch.ones_like(resp, dtype=torch.bool) if fixed is None else ~fixed  # [N, T] given positions never
        if generator is not None and generator.device != resp.device:
            masked, rates = antithetic_masks(maskable.to(generator.device), num_copies, generator, min_rate=min_rate,
                                             antithetic=num_copies % 2 == 0)
            masked, rates = masked.to(resp.device), rates.to(resp.device)
        else:
            masked, rates = antithetic_masks(maskable, num_copies, generator, min_rate=min_rate, antithetic=num_copies % 2 == 0)
        resp_copies = torch.where(masked, torch.full_like(masked, self.mask_token_id, dtype=resp.dtype), resp[None])  # [R, N, T]
        prompt = rollout.prompt_ids[None].expand(num_copies, -1, -1)  # [R, N, P]
        ids = rearrange(torch.cat([prompt, resp_copies], dim=-1), "r n l -> (r n) l")  # [R*N, P+T]
        attn = torch.cat([rollout.prompt_mask.bool(), torch.ones_like(resp, dtype=torch.bool)], dim=1)  # [N, P+T]
        return NoisedBatch(
            input_ids=ids,
            attention_mask=attn.repeat(num_copies, 1),
            noise_mask=masked,
            n_masked=masked.sum(-1).clamp(min=1).float(),
            rates=rates.float(),
            num_copies=num_copies,
            prompt_len=rollout.prompt_ids.shape[1],
            extras={"targets": resp},
        )

    def denoise_logprob(self, noised: NoisedBatch, *, use_reference: bool = False) -> torch.Tensor:
        """[R, N, T] log p(clean token | masked copy) at the masked positions, 0 elsewhere (model distribution)."""
        targets = noised.extras.get("targets")
        if targets is None:
            raise ValueError("denoise_logprob needs the clean tokens in noised.extras['targets'] (as forward_noise builds it)")
        r, p = noised.num_copies, noised.prompt_len
        select = rearrange(noised.noise_mask, "r n t -> (r n) t")  # [R*N, T]
        tgt = targets.repeat(r, 1)  # [R*N, T]
        with self.scoring_model(use_reference) as m:
            fn = BackboneLogits(
                m, noised.attention_mask.bool(), kind=self.backbone, shift=self.shift_logits,
                suppress_ids=(self.mask_token_id,), fast_linears=True,
            )
            if fn.output_head() is not None:
                # the LM head on the masked positions only, logits recomputed in the backward (models.head_logprob)
                picked = fn.selected_logprob(noised.input_ids, p, select, tgt)  # [M]
                logp = torch.zeros(select.shape, dtype=picked.dtype, device=picked.device).masked_scatter(select, picked)
                return rearrange(logp, "(r n) t -> r n t", r=r)  # [R, N, T]
            logits = fn.window(noised.input_ids, p)  # [R*N, T, V]
        logp = selective_log_softmax(logits, tgt)  # [R*N, T]
        logp = rearrange(logp, "(r n) t -> r n t", r=r)  # [R, N, T]
        return torch.where(noised.noise_mask, logp, torch.zeros_like(logp))

    # ------------------------------------------------------------------------------------------ construction
    def _adapter_config(self) -> dict:
        return {
            "family": self.family,
            "generation_defaults": self.generation_defaults,
            "mask_token_id": self.mask_token_id,
            "eos_token_ids": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
            "shift_logits": self.shift_logits,
            "backbone": self.backbone,
        }

    def save_pretrained(self, path) -> None:
        """Weights (safetensors), tokenizer and `mmrl_adapter.json` (family, ids, shift, generation defaults)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.unwrapped.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        (path / ADAPTER_FILE).write_text(json.dumps(self._adapter_config(), indent=2))

    @staticmethod
    def _load_backbone(path: Path, *, trust_remote_code: bool, dtype, device):
        """(model, tokenizer) from a local directory. LLaDA and Dream load into transformers-native classes
        (`models.dllm_native`); remote code only where that does not apply, and only with `trust_remote_code`."""
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        if not path.is_dir():
            raise FileNotFoundError(f"masked-diffusion checkpoint directory not found: {path}")
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{cfg_file} not found: {path} is not a transformers checkpoint directory")
        raw = json.loads(cfg_file.read_text())
        model_type = str(raw.get("model_type", ""))
        remote = family_of(raw) is not None
        kwargs = {} if dtype is None else {"dtype": dtype}
        if remote:
            # LLaDA / Dream weights in a transformers-native bidirectional class (KV cache, logits_to_keep); their own
            # modelling code only where the conversion does not apply
            model, why = load_native(path, raw, dtype=dtype)
            if model is not None:
                tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
                return (model.to(device) if device is not None else model), tokenizer
            if not trust_remote_code:
                raise ValueError(
                    f"{path} is a {model_type!r} checkpoint that cannot be loaded into a transformers-native class ({why}) "
                    f"and ships its own modelling code (auto_map {raw.get('auto_map', {})}); loading it runs that code: "
                    "pass trust_remote_code=True if you trust it"
                )
            warnings.warn(f"{path}: {model_type} checkpoint loaded with its own modelling code ({why}): no KV cache, "
                          "every sampler step runs a full forward", stacklevel=3)
        if model_type not in CONFIG_MAPPING and "auto_map" in raw:
            if not trust_remote_code:
                raise ValueError(
                    f"{path} is a {model_type!r} checkpoint that ships its own modelling code (auto_map "
                    f"{raw.get('auto_map', {})}); loading it runs that code: pass trust_remote_code=True if you trust it"
                )
        elif model_type not in CONFIG_MAPPING and not remote:
            raise ValueError(
                f"unknown masked-diffusion family model_type={model_type!r} in {cfg_file}; supported: LLaDA ('llada'), "
                "Dream ('Dream'), or a transformers-native decoder (e.g. 'llama', 'qwen2')"
            )
        if remote or model_type not in CONFIG_MAPPING:
            auto = (raw.get("auto_map") or {}).get("AutoModel")
            ensure_default_rope()
            if auto:
                model = transformers5_compatible(get_class_from_dynamic_module(auto, str(path))).from_pretrained(path, **kwargs)
                if not hasattr(model.config, "use_cache"):
                    # transformers 5 no longer keeps `use_cache` on a config that does not declare it; LLaDA's forward
                    # reads it (and its checkpoints set it to false)
                    model.config.use_cache = False
            else:
                model = AutoModel.from_pretrained(path, trust_remote_code=True, **kwargs)
        else:
            config = AutoConfig.from_pretrained(path)
            config.is_causal = False
            model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if device is not None:
            model.to(device)
        return model, tokenizer

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        trust_remote_code: bool = False,
        dtype=None,
        device=None,
        ref_model: bool | str = False,
        **generation_defaults,
    ) -> "MaskedDiffusionAdapter":
        """Load from a LOCAL directory (see docs/design.md, "The protocol"); `mmrl_adapter.json`, when present, restores the ids,
        shift and generation defaults. Adapter keys (`mask_token_id`, `eos_token_ids`, `pad_token_id`,
        `shift_logits`) may also be passed here."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"masked-diffusion checkpoint not found: {path}")
        if trust_remote_code:
            from mmrl.core.remote_code import warn_remote_code

            warn_remote_code(path)
        saved: dict = {}
        if (path / ADAPTER_FILE).is_file():
            saved = json.loads((path / ADAPTER_FILE).read_text())
            if saved.get("family", cls.family) != cls.family:
                raise ValueError(
                    f"{path / ADAPTER_FILE} is for family {saved.get('family')!r}, not {cls.family!r}; load it with that "
                    "family's adapter"
                )
        model, tokenizer = cls._load_backbone(path, trust_remote_code=trust_remote_code, dtype=dtype, device=device)
        ref = None
        if ref_model:
            ref_path = path if ref_model is True else Path(ref_model)
            ref, _ = cls._load_backbone(ref_path, trust_remote_code=trust_remote_code, dtype=dtype, device=device)
        adapter_kw = {k: saved[k] for k in _ADAPTER_KEYS if saved.get(k) is not None}
        gen = dict(saved.get("generation_defaults", {}))
        for k in list(generation_defaults):
            if k in _ADAPTER_KEYS:
                adapter_kw[k] = generation_defaults.pop(k)
        gen.update(generation_defaults)
        return cls(model, tokenizer, ref_model=ref, **adapter_kw, **gen)
