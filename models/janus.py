"""Janus-Pro adapter: transformers' native `JanusForConditionalGeneration` as an mmrl `Policy`.

Sampling is the classifier-free-guidance loop of Janus-Pro (docs/sources.md "T2I branch" and
transformers' `JanusForConditionalGeneration.generate(generation_mode="image")`, section 2.3), written here with
the KV cache because `generate` runs under `no_grad` and returns no per-step scores:

- the batch is doubled into a conditional half and an unconditional half (transformers' layout; Janus's own code
  interleaves rows, which is the same computation); the unconditional prompt is the CFG null condition: every
  prompt token except BOS and `<begin_of_image>` replaced by the pad token;
- each step: `h = language_model(...)[:, -1]`, `l = generation_head(h)`, guided logits
  `l_u + s * (l_c - l_u)` (default s = 5), sample from `softmax(l / temperature)` (default temperature 1); the
  sampled image token is embedded for both halves with `prepare_embeddings_for_image_generation`
  (`generation_aligner(generation_embeddings(id))`);
- the per-token log-probs recorded are those of the *scored* distribution: the conditional logits by default
  (what T2I-R1 and GCPO train, docs/sources.md "T2I branch"), or the guided logits with
  `score="guided"`; both temperature-scaled.

`logprob` recomputes the same quantities teacher-forced in one forward (prompt embeddings followed by the image
embeddings of the sampled tokens), so the importance ratio is exactly 1 up to float rounding. The negative
condition of GCPO is the same CFG null prompt (docs/algorithms.md section 3).

Image-token count, codebook size and the pad / BOS / begin-of-image ids come from the model config (and its
generation config), never from constants; a missing one is a clear error. Images are decoded through a pluggable
`ImageCodec` (`models/image_codecs.py`): the Janus VQ model for real checkpoints, a palette for tiny models.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import StaticCache

from mmrl.models import image_positions
from mmrl.models.base import BaseAdapter, is_peft_model, left_pad, score_logits, selective_log_softmax, unwrap
from mmrl.models.image_codecs import ImageCodec, PaletteCodec, VQCodec, codec_from_config
from mmrl.models.sampling import row_seeds, row_uniforms
from mmrl.core.protocol import NoisedBatch, Rollout, TokenScores

JANUS_T2I_TEMPLATE = "<|User|>: {prompt}\n\n<|Assistant|>:"
"""Janus-Pro's text-to-image prompt: the `deepseek` SFT format with an empty system prompt (`generation_inference.py`),
equal to the converted processor's chat template for one user turn with `add_generation_prompt`. BOS comes first
and `<begin_of_image>` is appended after it (as `JanusProcessor(generation_mode="image")` does)."""

JANUS_SPECIAL_TOKENS = ("<|User|>", "<|Assistant|>", "<image_placeholder>", "<begin_of_image>", "<end_of_image>")
"""Special tokens of the tiny offline tokenizer (names as in the converted Janus-Pro tokenizer)."""

SCORES = ("conditional", "guided")
"""Which distribution `old_logp` / `logprob` score: the conditional logits (T2I-R1, GCPO) or the CFG-guided ones
("cond" is accepted for "conditional")."""


def _score_name(score: str) -> str:
    name = {"cond": "conditional"}.get(score, score)
    if name not in SCORES:
        raise ValueError(f"score must be one of {list(SCORES)}, got {score!r}")
    return name

MMRL_ADAPTER_FILE = "mmrl_adapter.json"

_GENERATION_KEYS = ("cfg_scale", "temperature", "score", "prompt_template", "do_sample")


@dataclass(frozen=True)
class JanusIds:
    """The ids and sizes the sampler needs, read from a Janus config."""

    pad: int
    """Token that replaces the prompt in the CFG null condition (`generation_config.pad_token_id`)."""
    bos: int
    """Beginning of sequence; kept in the null condition."""
    boi: int
    """`<begin_of_image>`: last prompt token, kept in the null condition; the image starts after it."""
    num_image_tokens: int
    """T: image tokens per image (`vision_config.num_image_tokens`, what `generate` produces)."""
    codebook_size: int
    """V: the generation head's vocabulary (`vq_config.num_embeddings`)."""


def janus_ids(model: torch.nn.Module) -> JanusIds:
    """Read `JanusIds` from a `JanusForConditionalGeneration`'s config and generation config.

    pad and BOS: `generation_config` first (the converted checkpoints set `pad_token_id` to `<｜▁pad▁｜>` there),
    then `text_config`. begin-of-image: `generation_config.boi_token_id` or
    `generation_config.generation_kwargs["boi_token_id"]` (where transformers' `generate` reads it). A missing id
    raises naming the fields looked at.
    """
    cfg = model.config
    gen = getattr(model, "generation_config", None)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else getattr(cfg, "text_config", None)

    def first(name: str, sources: list[tuple[str, Any]]) -> int:
        for _, value in sources:
            if isinstance(value, (list, tuple)):
                value = value[0] if len(value) else None
            if value is not None:
                return int(value)
        where = " or ".join(label for label, _ in sources)
        raise ValueError(f"the Janus config lacks the {name}: set {where}")

    gen_kwargs = (getattr(gen, "generation_kwargs", None) or {}) if gen is not None else {}
    pad = first("pad token id (CFG null condition)", [
        ("generation_config.pad_token_id", getattr(gen, "pad_token_id", None)),
        ("text_config.pad_token_id", getattr(text, "pad_token_id", None)),
    ])
    bos = first("BOS token id", [
        ("generation_config.bos_token_id", getattr(gen, "bos_token_id", None)),
        ("text_config.bos_token_id", getattr(text, "bos_token_id", None)),
    ])
    boi = first("begin-of-image token id", [
        ("generation_config.boi_token_id", getattr(gen, "boi_token_id", None)),
        ("generation_config.generation_kwargs['boi_token_id']", gen_kwargs.get("boi_token_id")),
    ])
    vision, vq = getattr(cfg, "vision_config", None), getattr(cfg, "vq_config", None)
    if getattr(vision, "num_image_tokens", None) is None:
        raise ValueError("the Janus config lacks vision_config.num_image_tokens (image tokens per generated image)")
    if getattr(vq, "num_embeddings", None) is None:
        raise ValueError("the Janus config lacks vq_config.num_embeddings (the image codebook size)")
    return JanusIds(pad=pad, bos=bos, boi=boi, num_image_tokens=int(vision.num_image_tokens),
                    codebook_size=int(vq.num_embeddings))


def cfg_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance `uncond + scale * (cond - uncond)` (Janus `generation_inference.py`; transformers'
    `ClassifierFreeGuidanceLogitsProcessor`), in the logits' own dtype. [..., V] x [..., V] -> [..., V].
    Scale 1 returns `cond` itself (the same distribution, without the rounding of the formula)."""
    if scale == 1.0:
        return cond
    return uncond + scale * (cond - uncond)


def null_condition(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, ids: JanusIds) -> torch.Tensor:
    """The CFG null prompt [N, P]: every real prompt token except BOS and `<begin_of_image>` replaced by the pad
    token (transformers' `generate(generation_mode="image")`; Janus's `tokens[1:-1] = pad_id`). Left padding is
    already pad and keeps the prompt's attention mask."""
    keep = (prompt_ids == ids.bos) | (prompt_ids == ids.boi) | ~prompt_mask.bool()  # [N, P]
    return torch.where(keep, prompt_ids, torch.full_like(prompt_ids, ids.pad))


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """[B, L] attention mask -> [B, L] positions counting real tokens (left padding gets 0)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from categorical `probs` [B, V] with one uniform in [0, 1) per row [B] -> ids [B].

    The first id whose cumulative probability exceeds `u * total` is taken, so a zero-probability id is never
    drawn, and the same uniform always gives the same id: a draw depends only on its own row, which makes
    batched and unbatched sampling agree.
    """
    cdf = probs.cumsum(-1)  # [B, V]
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]  # [B, 1]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)  # [B]


def _stack_left_padded(a_ids, a_mask, b_ids, b_mask, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack two left-padded prompt batches [N, Pa], [N, Pb] into [2N, max(Pa, Pb)] (more left padding)."""
    width = max(a_ids.shape[1], b_ids.shape[1])

    def widen(ids, mask):
        extra = width - ids.shape[1]
        return (torch.nn.functional.pad(ids, (extra, 0), value=pad),
                torch.nn.functional.pad(mask.bool(), (extra, 0), value=False))

    (a_ids, a_mask), (b_ids, b_mask) = widen(a_ids, a_mask), widen(b_ids, b_mask)
    return torch.cat([a_ids, b_ids]), torch.cat([a_mask, b_mask])


def _cache_keyword(lm: torch.nn.Module) -> str:
    """The language model's KV-cache argument: `cache` (transformers >= 5.2x) or `past_key_values` (earlier)."""
    params = inspect.signature(lm.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _janus_core(module: torch.nn.Module) -> torch.nn.Module:
    """The `JanusForConditionalGeneration` under DDP / accelerate / peft wrappers."""
    core = unwrap(module)
    if hasattr(core, "get_base_model"):  # peft
        core = core.get_base_model()
    if not hasattr(core, "prepare_embeddings_for_image_generation"):
        raise TypeError(f"expected a JanusForConditionalGeneration, got {type(core).__name__}")
    return core


@torch.no_grad()
def cfg_sample(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    null_ids: torch.Tensor,
    *,
    num_tokens: int,
    cfg_scale: float,
    temperature: float,
    score: str,
    uniforms: torch.Tensor | None,
    do_sample: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Janus-Pro CFG sampling with the KV cache; returns (image ids [N, T] long, scored log-probs [N, T] float32).

    Args:
        model: an unwrapped `JanusForConditionalGeneration` (in eval mode).
        prompt_ids, prompt_mask: [N, P] left-padded prompts ending in `<begin_of_image>`.
        null_ids: [N, P] the null condition of the same prompts (`null_condition`); unused when `cfg_scale == 1`.
        num_tokens: T.
        cfg_scale: s in `l_u + s (l_c - l_u)`.
        temperature: the sampling distribution is `softmax(guided / temperature)`.
        score: "conditional" or "guided": the distribution whose log-probs are recorded (temperature-scaled).
        uniforms: [N, T] in [0, 1), one per drawn token (inverse-CDF sampling); None with `do_sample=False`.
        do_sample: False takes the argmax of the guided logits (greedy).

    Memory: besides the KV cache (as in `generate`), the scored logits [N, T, V] are kept in the model dtype
    (Janus-Pro, 16 images in bf16: 16 x 576 x 16384 x 2 B = 0.3 GB).
    """
    n = prompt_ids.shape[0]
    guided_branch = cfg_scale != 1.0
    lm = model.model.language_model
    head = model.model.generation_head
    if guided_branch:
        ids2 = torch.cat([prompt_ids, null_ids])  # [2N, P]: conditional half, then unconditional half
        mask2 = torch.cat([prompt_mask, prompt_mask])  # [2N, P]
    else:
        ids2, mask2 = prompt_ids, prompt_mask
    b, p = ids2.shape
    # one preallocated mask: the image tokens are always attended, so step t uses the first P + t + 1 columns
    full_mask = torch.ones((b, p + num_tokens), dtype=torch.long, device=ids2.device)  # [B, P+T]
    full_mask[:, :p] = mask2.long()
    next_pos = mask2.long().sum(-1, keepdim=True)  # [B, 1] position of the first image token
    # a static cache (as transformers' image `generate` uses): written in place, no per-step concatenation
    cache = StaticCache(config=lm.config, max_cache_len=p + num_tokens)
    cache_kw = _cache_keyword(lm)
    positions = image_positions.positions_of(model)  # tiny-world 2-D positions (None for real checkpoints)
    embeds = model.get_input_embeddings()(ids2)  # [B, P, D]
    if positions is not None:  # <begin_of_image> predicts image token 0
        embeds = torch.cat([embeds[:, :-1], embeds[:, -1:] + positions(0, 1).to(embeds.dtype)], dim=1)
    out = lm(
        inputs_embeds=embeds,
        attention_mask=full_mask[:, :p],
        position_ids=position_ids_from_mask(mask2),
        use_cache=True,
        **{cache_kw: cache},
    )
    hidden = out.last_hidden_state[:, -1]  # [B, D]
    # the scored logits are kept (model dtype) and turned into log-probs once at the end: a few large ops
    # instead of several small ones per step, and the very function `logprob` uses
    scored = None  # [N, T, V]
    tokens = torch.empty((n, num_tokens), dtype=torch.long, device=ids2.device)  # [N, T]
    for t in range(num_tokens):
        logits = head(hidden)  # [B, V]
        if guided_branch:
            cond, uncond = logits.chunk(2)  # [N, V] each
            guided = cfg_logits(cond, uncond, cfg_scale)  # [N, V]
        else:
            cond = guided = logits
        if do_sample:
            sample_logits = guided.float() if temperature == 1.0 else guided.float() / temperature  # [N, V]
            tok = sample_from_probs(torch.softmax(sample_logits, dim=-1), uniforms[:, t])  # [N]
        else:
            tok = guided.argmax(-1)  # [N]
        if scored is None:
            scored = logits.new_empty((n, num_tokens, logits.shape[-1]))
        scored[:, t] = guided if score == "guided" else cond
        tokens[:, t] = tok
        if t + 1 == num_tokens:
            break
        step_ids = torch.cat([tok, tok]) if guided_branch else tok  # [B]
        step_embeds = model.prepare_embeddings_for_image_generation(step_ids[:, None])  # [B, 1, D]
        if positions is not None:  # image token t predicts token t + 1
            step_embeds = step_embeds + positions(t + 1, 1).to(step_embeds.dtype)
        out = lm(
            inputs_embeds=step_embeds,
            attention_mask=full_mask[:, : p + t + 1],
            position_ids=next_pos + t,
            use_cache=True,
            **{cache_kw: cache},
        )
        hidden = out.last_hidden_state[:, -1]  # [B, D]
    return tokens, selective_log_softmax(scored, tokens, temperature=temperature)  # [N, T], [N, T]


class JanusAdapter(BaseAdapter):
    """Janus-Pro text-to-image policy (`JanusForConditionalGeneration`) with an own CFG sampler.

    Generation options (constructor defaults, overridable per `sample` call):
        cfg_scale: CFG weight s (Janus-Pro default 5).
        temperature: sampling temperature (default 1).
        score: "conditional" (default; T2I-R1 / GCPO train the conditional logits) or "guided".
        prompt_template: how a prompt string becomes the conversation text (default `JANUS_T2I_TEMPLATE`).
        do_sample: False samples greedily (argmax of the guided logits).
    """

    family = "janus"
    generation_option_names = _GENERATION_KEYS
    has_unused_parameters = True  # the understanding (vision encoder) path is not used by generation
    variable_length = False  # an image is always the same number of tokens
    response_unit = "images"

    @classmethod
    def generation_options(cls, cfg) -> dict[str, Any]:
        return {"cfg_scale": cfg.cfg_scale, "temperature": cfg.temperature, "score": cfg.score_logits}

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        ref_model: torch.nn.Module | None = None,
        codec: ImageCodec | None = None,
        freeze_unused: bool = True,
        **generation_defaults: Any,
    ):
        """Args:
            model: a `JanusForConditionalGeneration`.
            tokenizer: its text tokenizer (or a processor with `.tokenizer`).
            ref_model: frozen reference copy (DGPO, KL penalty).
            codec: image codec; default the model's own VQ tokenizer (`VQCodec`).
            freeze_unused: turn off gradients of the parts text-to-image never runs (the understanding vision
                tower and aligner, the VQ tokenizer), so DDP sees no unused trainable parameters.
            generation_defaults: see the class docstring.
        """
        super().__init__(model, ref_model=ref_model)
        self.tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        core = _janus_core(model)
        self.ids = janus_ids(core)
        self.vocab_size = self.ids.codebook_size
        self.codec = codec if codec is not None else VQCodec(core)
        h, w = self.codec.grid
        if h * w != self.ids.num_image_tokens:
            raise ValueError(
                f"codec grid {self.codec.grid} has {h * w} cells but the model generates "
                f"vision_config.num_image_tokens={self.ids.num_image_tokens} image tokens"
            )
        if self.codec.codebook_size != self.vocab_size:
            raise ValueError(
                f"codec codebook_size {self.codec.codebook_size} != the model's vq_config.num_embeddings "
                f"{self.vocab_size}"
            )
        if freeze_unused:
            for name in ("vision_model", "aligner", "vqmodel"):
                getattr(core.model, name).requires_grad_(False)
        gen_cfg = getattr(core, "generation_config", None)
        self.generation_defaults = {
            "cfg_scale": float(getattr(gen_cfg, "guidance_scale", None) or 5.0),
            "temperature": float(getattr(gen_cfg, "temperature", None) or 1.0),
            "score": "conditional",
            "prompt_template": JANUS_T2I_TEMPLATE,
            "do_sample": True,
        }
        self.generation_defaults = self._generation_options(generation_defaults)

    # ------------------------------------------------------------------ options and prompts
    def _generation_options(self, overrides: dict) -> dict:
        unknown = sorted(set(overrides) - set(_GENERATION_KEYS))
        if unknown:
            raise ValueError(f"unknown Janus generation options {unknown}; valid: {list(_GENERATION_KEYS)}")
        opts = {**self.generation_defaults, **{k: v for k, v in overrides.items() if v is not None}}
        if not float(opts["temperature"]) > 0:
            raise ValueError(f"temperature must be > 0, got {opts['temperature']}")
        if not float(opts["cfg_scale"]) >= 0:
            raise ValueError(f"cfg_scale must be >= 0, got {opts['cfg_scale']}")
        opts["score"] = _score_name(opts["score"])
        if "{prompt}" not in opts["prompt_template"]:
            raise ValueError(f"prompt_template must contain '{{prompt}}', got {opts['prompt_template']!r}")
        opts["temperature"], opts["cfg_scale"] = float(opts["temperature"]), float(opts["cfg_scale"])
        opts["do_sample"] = bool(opts["do_sample"])
        return opts

    def prompt_token_ids(self, prompt: str, template: str | None = None) -> list[int]:
        """BOS + tokens of the templated prompt + `<begin_of_image>` (BOS added only if the tokenizer did not)."""
        if not isinstance(prompt, str):
            raise TypeError(f"Janus prompts are strings, got {type(prompt).__name__}")
        text = (template or self.generation_defaults["prompt_template"]).format(prompt=prompt)
        ids = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids or ids[0] != self.ids.bos:
            ids = [self.ids.bos] + ids
        return ids + [self.ids.boi]

    def null_prompt(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """The CFG null condition of `prompt_ids` [N, P] (also GCPO's negative condition)."""
        return null_condition(prompt_ids, prompt_mask, self.ids)

    # ------------------------------------------------------------------ sampling
    def sample(
        self,
        prompts: list,
        group_size: int,
        *,
        generator: torch.Generator | None = None,
        seeds: Sequence[int] | torch.Tensor | None = None,
        uniforms: torch.Tensor | None = None,
        **generation: Any,
    ) -> Rollout:
        """G images per prompt with Janus-Pro CFG sampling; rows g*G..g*G+G-1 belong to prompt g.

        Args:
            prompts: text prompts (str).
            group_size: G >= 1.
            generator: draws one seed per response (torch's default generator if None); row i's uniforms (one
                per image token) come from its own seed (`models/sampling.py`), so a response depends only on its
                seed and prompt, never on the rest of the batch, and a seeded generator reproduces the rollout.
            seeds: explicit per-response seeds ([N] ints) instead of drawing them.
            uniforms: [N, T] uniforms in [0, 1) to use instead of seeds (row i drives response i).
            generation: overrides of `generation_defaults` (cfg_scale, temperature, score, prompt_template,
                do_sample).

        Returns a Rollout with image ids [N, T] (all valid), `old_logp` of the scored distribution, PIL images
        decoded through the codec, the CFG null prompt as `neg_prompt_ids`, and extras `grid` (h, w),
        `cfg_scale`, `temperature`, `score`, `seeds` ([N], when drawn from seeds).
        """
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        prompts = list(prompts)
        if not prompts:
            raise ValueError("sample needs at least one prompt")
        opts = self._generation_options(generation)
        model = self.unwrapped_core  # the bare Janus model (peft's LoRA layers live inside it)
        device = self.device
        per_prompt = [self.prompt_token_ids(p, opts["prompt_template"]) for p in prompts]
        rows = [ids for ids in per_prompt for _ in range(group_size)]
        prompt_ids, prompt_mask = left_pad(rows, self.ids.pad, device)  # [N, P]
        null_ids = self.null_prompt(prompt_ids, prompt_mask)  # [N, P]
        n, t = prompt_ids.shape[0], self.ids.num_image_tokens
        extras: dict[str, Any] = {"grid": tuple(self.codec.grid), "cfg_scale": opts["cfg_scale"],
                                  "temperature": opts["temperature"], "score": opts["score"]}
        if opts["do_sample"]:
            if uniforms is None:
                if seeds is None:
                    seeds_t = row_seeds(n, generator)  # [N]
                else:
                    seeds_t = torch.as_tensor(seeds, dtype=torch.long).reshape(-1).cpu()  # [N]
                    if seeds_t.numel() != n:
                        raise ValueError(f"seeds must give one seed per response ({len(prompts)} prompts x group_size "
                                         f"{group_size} = {n}), got {seeds_t.numel()}")
                uniforms = row_uniforms(seeds_t, t)  # [N, T]
                extras["seeds"] = seeds_t.to(device)
            if tuple(uniforms.shape) != (n, t):
                raise ValueError(f"uniforms must have shape [N, T] = [{n}, {t}], got {tuple(uniforms.shape)}")
            uniforms = uniforms.to(device)
        was_training = model.training
        model.eval()
        try:
            tokens, logp = cfg_sample(
                model, prompt_ids, prompt_mask, null_ids, num_tokens=t, cfg_scale=opts["cfg_scale"],
                temperature=opts["temperature"], score=opts["score"], uniforms=uniforms, do_sample=opts["do_sample"],
            )
        finally:
            model.train(was_training)
        extras["terminated"] = torch.ones(tokens.shape[0], dtype=torch.bool, device=tokens.device)  # an image is never cut short
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=tokens,
            response_mask=torch.ones_like(tokens, dtype=torch.bool),
            group_size=group_size,
            prompts=[p for p in prompts for _ in range(group_size)],
            completions=self.codec.decode(tokens),
            old_logp=logp,
            neg_prompt_ids=null_ids,
            neg_prompt_mask=prompt_mask.clone(),
            extras=extras,
        )

    # ------------------------------------------------------------------ scoring
    def image_logits(
        self, module: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_ids: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced generation-head logits [B, T, V]: position t predicts `response_ids[:, t]`.

        Input = prompt token embeddings followed by the image embeddings of the first T - 1 sampled tokens (the
        generation path: `prepare_embeddings_for_image_generation`); `module` is called as a module (it may be
        DDP / peft wrapped) and only its last hidden states are used.
        """
        core = _janus_core(module)
        p = prompt_ids.shape[1]
        text_emb = core.get_input_embeddings()(prompt_ids)  # [B, P, D]
        img_emb = core.prepare_embeddings_for_image_generation(response_ids[:, :-1])  # [B, T-1, D]
        embeds = torch.cat([text_emb, img_emb.to(text_emb.dtype)], dim=1)  # [B, P+T-1, D]
        positions = image_positions.positions_of(core)
        if positions is not None:  # position p - 1 + t predicts image token t (tiny-world 2-D positions)
            t_len = response_ids.shape[1]
            embeds = torch.cat([embeds[:, : p - 1], embeds[:, p - 1 :] + positions(0, t_len).to(embeds.dtype)], dim=1)
        mask = torch.cat([prompt_mask.long(), torch.ones_like(response_ids[:, :-1])], dim=1)  # [B, P+T-1]
        out = module(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            use_cache=False,
            logits_to_keep=1,  # the text LM head is not needed
            output_hidden_states=-1,
        )
        hidden = out.hidden_states[-1][:, p - 1 :]  # [B, T, D] (the final-norm output)
        return core.model.generation_head(hidden)  # [B, T, V]

    def _scored_logits(
        self, module, prompt_ids, prompt_mask, null_ids, null_mask, response_ids, *, condition: str, score: str,
        cfg_scale: float, want_negative: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits of the scored distribution [N, T, V], null-condition logits [N, T, V] or None)."""
        if condition == "negative":
            return self.image_logits(module, null_ids, null_mask, response_ids), None
        if score == "guided" and cfg_scale != 1.0:
            ids2, mask2 = _stack_left_padded(prompt_ids, prompt_mask, null_ids, null_mask, self.ids.pad)
            both = self.image_logits(module, ids2, mask2, torch.cat([response_ids, response_ids]))  # [2N, T, V]
            cond, uncond = both.chunk(2)
            return cfg_logits(cond, uncond, cfg_scale), (uncond.detach() if want_negative else None)
        logits = self.image_logits(module, prompt_ids, prompt_mask, response_ids)  # [N, T, V]
        neg = None
        if want_negative:
            with torch.no_grad():
                neg = self.image_logits(module, null_ids, null_mask, response_ids)
        return logits, neg

    def _rollout_option(self, rollout: Rollout, key: str):
        return rollout.extras.get(key, self.generation_defaults[key])

    def logprob(
        self,
        rollout: Rollout,
        *,
        condition: str = "positive",
        use_reference: bool = False,
        stats: tuple[str, ...] = (),
        stats_against: str = "reference",
        score: str | None = None,
        **estimator: Any,
    ) -> TokenScores:
        """Teacher-forced per-token log-probs [N, T] of the rollout's image tokens.

        Args:
            condition: "positive" (the prompt) or "negative" (the CFG null prompt, GCPO's negative condition; its
                logits are the unconditional branch, which is also the guided distribution of a null prompt).
            use_reference: score with the reference model.
            stats: per-token statistics (`mmrl.algorithms.STATS`) of the scored distribution against
                `stats_against`: the reference model under the same condition, or (positive condition only) this
                model under the negative condition (GCPO's full-vocabulary KL). Computed in chunks. "entropy"
                alone needs no other side (no reference forward; `other_logp` stays None).
            score: "conditional" or "guided"; default: what the rollout was sampled with (`rollout.extras["score"]`).
            The temperature and CFG scale are the rollout's (`rollout.extras`), so the result matches `old_logp`.
        """
        if estimator:
            raise ValueError(f"unknown options for the Janus adapter's logprob: {sorted(estimator)}; it takes score=")
        if condition not in ("positive", "negative"):
            raise ValueError(f"condition must be 'positive' or 'negative', got {condition!r}")
        if stats_against not in ("reference", "negative"):
            raise ValueError(f"stats_against must be 'reference' or 'negative', got {stats_against!r}")
        if stats and stats_against == "negative" and condition == "negative":
            raise ValueError("statistics against the negative condition need condition='positive'")
        score = _score_name(score or self._rollout_option(rollout, "score"))
        cfg_scale = float(self._rollout_option(rollout, "cfg_scale"))
        temperature = float(self._rollout_option(rollout, "temperature"))
        prompt_ids, prompt_mask = rollout.prompt_ids, rollout.prompt_mask.bool()
        if rollout.neg_prompt_ids is not None:
            null_ids, null_mask = rollout.neg_prompt_ids, rollout.neg_prompt_mask.bool()
        else:
            null_ids, null_mask = self.null_prompt(prompt_ids, prompt_mask), prompt_mask
        response_ids = rollout.response_ids
        kwargs = dict(condition=condition, score=score, cfg_scale=cfg_scale)
        # the entropy is of the scored distribution alone; every other statistic needs the other side
        need_other = any(s != "entropy" for s in stats)
        with self.scoring_model(use_reference) as module:
            want_negative = need_other and stats_against == "negative"
            logits, other = self._scored_logits(
                module, prompt_ids, prompt_mask, null_ids, null_mask, response_ids, want_negative=want_negative,
                **kwargs,
            )
        if need_other and stats_against == "reference":
            with self.scoring_model(True) as ref, torch.no_grad():
                other, _ = self._scored_logits(
                    ref, prompt_ids, prompt_mask, null_ids, null_mask, response_ids, want_negative=False, **kwargs
                )
        return score_logits(
            logits, response_ids, rollout.response_mask, temperature=temperature,
            other_logits=other if need_other else None, stats=tuple(stats),
        )

    # ------------------------------------------------------------------ WDCE hooks (identity for AR models)
    def forward_noise(
        self, rollout: Rollout, num_copies: int = 1, generator: torch.Generator | None = None, *, min_rate: float | None = None
    ) -> NoisedBatch:
        """The clean sequence, R = 1 (autoregressive: WDCE becomes the weighted sequence NLL)."""
        n, t = rollout.response_ids.shape
        return NoisedBatch(
            input_ids=torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1),  # [N, P+T]
            attention_mask=torch.cat([rollout.prompt_mask.bool(), rollout.response_mask.bool()], dim=1),
            noise_mask=rollout.response_mask.bool()[None],  # [1, N, T]
            n_masked=torch.ones((1, n), device=rollout.response_ids.device),
            rates=torch.ones((1, n), device=rollout.response_ids.device),
            num_copies=1,
            prompt_len=rollout.prompt_ids.shape[1],
            extras={k: self._rollout_option(rollout, k) for k in ("cfg_scale", "temperature", "score")},
        )

    def denoise_logprob(self, noised: NoisedBatch, *, use_reference: bool = False) -> torch.Tensor:
        """[1, N, T] teacher-forced log-probs of the image tokens under the positive condition, with the score /
        temperature / CFG scale in `noised.extras` (set by `forward_noise` from the rollout; the adapter's
        defaults otherwise), 0 outside `noise_mask`."""
        p = noised.prompt_len
        prompt_ids, prompt_mask = noised.input_ids[:, :p], noised.attention_mask[:, :p]
        response_ids, response_mask = noised.input_ids[:, p:], noised.noise_mask[0]
        null_ids = self.null_prompt(prompt_ids, prompt_mask)
        d = {**self.generation_defaults, **getattr(noised, "extras", {})}
        d["score"] = _score_name(d["score"])
        with self.scoring_model(use_reference) as module:
            logits, _ = self._scored_logits(
                module, prompt_ids, prompt_mask, null_ids, prompt_mask, response_ids, condition="positive",
                score=d["score"], cfg_scale=d["cfg_scale"], want_negative=False,
            )
        scores = score_logits(logits, response_ids, response_mask, temperature=d["temperature"])
        return scores.logp[None]  # [1, N, T]

    def code_vectors(self, response_ids: torch.Tensor) -> torch.Tensor:
        """[N, T, C] the codec's code vector of every image token (STAGE's similarity masks compare them)."""
        return self.codec.code_vectors(response_ids)

    def token_strings(self, rollout: Rollout) -> list[list[str]]:
        """Image tokens have no text; each is shown as `<img:id>` (lay them out on `rollout.extras["grid"]`)."""
        return [[f"<img:{int(i)}>" for i in row] for row in rollout.response_ids.tolist()]

    # ------------------------------------------------------------------ construction and persistence
    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Weights (safetensors), config and generation config, tokenizer, and `mmrl_adapter.json` (family,
        generation defaults, codec config). A peft (LoRA) model is saved merged into its base weights (a plain
        checkpoint), as the other adapters do."""
        os.makedirs(path, exist_ok=True)
        model = self.unwrapped
        if is_peft_model(model):
            model = copy.deepcopy(model).merge_and_unload()
        core = _janus_core(model)
        if image_positions.positions_of(core) is None:
            core.save_pretrained(path)
        else:  # the transformers weights without the tiny-world position embeddings, which go to their own file
            core.save_pretrained(path, state_dict=image_positions.state_dict_without(core))
            image_positions.save(core, path)
        self.tokenizer.save_pretrained(path)
        with open(os.path.join(path, MMRL_ADAPTER_FILE), "w") as f:
            json.dump({"family": self.family, "generation_defaults": self.generation_defaults,
                       "codec": self.codec.config()}, f, indent=2)

    @property
    def unwrapped_core(self) -> torch.nn.Module:
        """The bare `JanusForConditionalGeneration` (under DDP and peft wrappers)."""
        return _janus_core(self.model)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        trust_remote_code: bool = False,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        ref_model: bool | str = False,
        codec: ImageCodec | None = None,
        **generation_defaults: Any,
    ) -> "JanusAdapter":
        """Load a transformers-format Janus checkpoint (e.g. `deepseek-community/Janus-Pro-1B` downloaded to a
        local directory) with its tokenizer; `mmrl_adapter.json`, if present, restores generation defaults and
        the codec. `ref_model=True` loads a frozen second copy, a path loads the reference from there."""
        from transformers import AutoTokenizer

        path = os.fspath(path)
        if not os.path.isdir(path):
            raise FileNotFoundError(f"Janus checkpoint directory not found: {path!r} (mmrl loads local paths only)")
        config_file = os.path.join(path, "config.json")
        if not os.path.isfile(config_file):
            raise FileNotFoundError(f"no config.json in {path!r}: not a transformers checkpoint")
        with open(config_file) as f:
            model_type = json.load(f).get("model_type")
        if model_type != "janus":
            hint = (" (the original deepseek-ai checkpoint: convert it with transformers' "
                    "src/transformers/models/janus/convert_janus_weights_to_hf.py)" if model_type == "multi_modality" else "")
            raise ValueError(f"{path!r} holds model_type={model_type!r}, the Janus adapter needs 'janus'{hint}")
        if trust_remote_code:
            from mmrl.core.remote_code import warn_remote_code

            warn_remote_code(path)
        saved: dict = {}
        adapter_file = os.path.join(path, MMRL_ADAPTER_FILE)
        if os.path.isfile(adapter_file):
            with open(adapter_file) as f:
                saved = json.load(f)
            if saved.get("family", "janus") != "janus":
                raise ValueError(f"{adapter_file} is for model family {saved.get('family')!r}, not 'janus'")
        model = _load_janus(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        ref = None
        if ref_model:
            ref_path = path if ref_model is True else os.fspath(ref_model)
            if not os.path.isdir(ref_path):
                raise FileNotFoundError(f"reference model directory not found: {ref_path!r}")
            ref = _load_janus(ref_path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
        if codec is None and saved.get("codec"):
            codec = codec_from_config(saved["codec"], model)
        defaults = {**saved.get("generation_defaults", {}), **generation_defaults}
        return cls(model, tokenizer, ref_model=ref, codec=codec, **defaults)


def _load_janus(path: str, *, dtype, device, trust_remote_code: bool) -> torch.nn.Module:
    from transformers import JanusForConditionalGeneration

    kwargs: dict = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    model = JanusForConditionalGeneration.from_pretrained(path, **kwargs)
    image_positions.load(model, path)  # tiny-world 2-D image positions, when the checkpoint has them
    if device is not None:
        model = model.to(device)
    return model.eval()
