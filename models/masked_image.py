"""Masked image-token generators (aMUSEd, MaskGIT-style) through diffusers' own classes, as the `masked_image` family.

A model is the layout of an `amused/amused-256` snapshot, loaded from a LOCAL directory with diffusers' and
transformers' classes: `transformer/` (`UVit2DModel`, the trained policy), `vqvae/` (`VQModel`, frozen, decodes
tokens to pixels), `text_encoder/` (`CLIPTextModelWithProjection`, frozen), `tokenizer/` (`CLIPTokenizer`) and
`scheduler/` (`AmusedScheduler`'s config: the mask token id and the masking schedule). Only the transformer trains.

- `sample`: the MaskGIT / aMUSEd schedule with classifier-free guidance (`models/maskgit.py`); per row its own
  generator, so a row with seed k reproduces `AmusedPipeline(generator=torch.Generator().manual_seed(k))` token for
  token (tests/models/test_models_masked_image.py). It records each position's reveal step (`extras["order"]`) and the
  per-step log-probs of the revealed tokens (`old_logp`).
- `logprob(estimator=...)` (docs/algorithms.md sections 5 and 7, mirrored from the masked-diffusion LM family):
  `"per_step"`: `log p(o_d | x_{s(d)})`, the probability of each token at the step that revealed it, re-scored
  teacher-forced from the recorded order (one forward per step; equals `old_logp`; the token draws of the
  trajectory, not its remasking choices); `"mean_field"`: d1 / diffu-GRPO's one-step estimate, every image token
  masked, one forward; `"elbo"`: DMPO's antithetic masked copies, per-token `log p * T / m` averaged over copies.
- `forward_noise` / `denoise_logprob`: R antithetic masked copies of the image tokens for WDCE (the text condition
  is never masked); the conditional (positive-prompt) denoiser is scored.
- GCPO's negative condition is the CFG null / negative prompt (`negative_prompt`, default "" as aMUSEd's
  pipeline), scored with the same tokens and states.

Scored distribution: `score="conditional"` (default, as the Janus family: the prompt-conditioned logits) or
`"guided"` (the CFG logits that were sampled), at the token temperature `temperature` (aMUSEd: 1). Images decode
through the VQ model, or through an `ImageCodec` when one is given (the tiny world's exact patch codebook).

Shapes: N rows, L text tokens (CLIP pads to `model_max_length`), T = h * w image tokens, V codebook size.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from einops import rearrange

from mmrl.algorithms.distributions import STATS
from mmrl.algorithms.dmpo import DEFAULT_MIN_MASK_RATE, antithetic_masks
from mmrl.models.base import BaseAdapter, score_logits, selective_log_softmax, unwrap
from mmrl.models.dllm_estimators import elbo_masks, elbo_token_contributions, row_seeds
from mmrl.models.image_codecs import ImageCodec, codec_from_config
from mmrl.models.maskgit import SCHEDULES, cfg_logits, maskgit_sample, state_at_step
from mmrl.models.sampling import row_seeds as draw_row_seeds
from mmrl.core.protocol import NoisedBatch, Rollout, TokenScores

ESTIMATORS = ("per_step", "mean_field", "elbo")
SCORES = ("conditional", "guided")
GENERATION_KEYS = ("cfg_scale", "num_steps", "temperature", "remask_temperature", "score", "negative_prompt",
                   "aesthetic_score", "crop_coord")
DEFAULT_GENERATION: dict[str, Any] = {
    "cfg_scale": 10.0,  # AmusedPipeline's guidance_scale
    "num_steps": 12,  # AmusedPipeline's num_inference_steps
    "temperature": 1.0,  # token draw temperature (aMUSEd samples softmax(logits))
    "remask_temperature": (2.0, 0.0),  # AmusedPipeline's `temperature` (the remasking Gumbel weight)
    "score": "conditional",
    "negative_prompt": "",
    "aesthetic_score": 6.0,
    "crop_coord": (0, 0),
}
ADAPTER_FILE = "mmrl_adapter.json"
SUBFOLDERS = ("transformer", "vqvae", "text_encoder", "tokenizer", "scheduler")
"""The components of an aMUSEd snapshot directory."""


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


class MaskedImageAdapter(BaseAdapter):
    """aMUSEd-style text-to-image policy (see the module docstring).

    Args:
        transformer: the `UVit2DModel` (trained).
        vqvae: the `VQModel` (frozen).
        text_encoder: the `CLIPTextModelWithProjection` (frozen).
        tokenizer: its `CLIPTokenizer`.
        mask_token_id: the transformer's mask token (`scheduler/scheduler_config.json`).
        masking_schedule: "cosine" (aMUSEd) or "linear".
        ref_model: a frozen reference copy of the transformer.
        codec: decode tokens with this `ImageCodec` instead of the VQ model.
        **generation_defaults: `GENERATION_KEYS`.
    """

    family = "masked_image"
    records_reveal_steps = True  # the MaskGIT sampler records each token's reveal step (logprob_estimator=per_step)
    generation_option_names = GENERATION_KEYS
    variable_length = False  # an image is always T tokens
    response_unit = "images"

    @classmethod
    def config_errors(cls, cfg) -> list[str]:
        """Also: no transformers attention switch (diffusers' UVit2DModel)."""
        e = super().config_errors(cfg)
        if cfg.attn_implementation is not None:
            e.append("attn_implementation: the masked_image family (diffusers' UVit2DModel) has no transformers attention "
                     "switch; leave it null")
        return e

    @classmethod
    def generation_options(cls, cfg) -> dict[str, Any]:
        opts = {"cfg_scale": cfg.cfg_scale, "temperature": cfg.temperature, "score": cfg.score_logits}
        if cfg.diffusion_steps is not None:
            opts["num_steps"] = cfg.diffusion_steps
        return opts

    @classmethod
    def estimator_options(cls, cfg, mask_seed: int, *, kind: str | None = None) -> dict[str, Any]:
        kind = kind or cfg.logprob_estimator
        opts: dict[str, Any] = {"estimator": kind, "mask_seed": int(mask_seed)}
        if kind == "elbo":
            opts["num_copies"] = cfg.dmpo_elbo_copies
            opts["min_mask_rate"] = cfg.dmpo_min_mask_rate
        return opts

    def __init__(self, transformer, vqvae, text_encoder, tokenizer, *, mask_token_id: int, masking_schedule: str = "cosine",
                 ref_model: torch.nn.Module | None = None, codec: ImageCodec | None = None, **generation_defaults: Any):
        super().__init__(transformer, ref_model=ref_model)
        self.vqvae = vqvae.eval().requires_grad_(False)
        self.text_encoder = text_encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        cfg = unwrap(transformer).config
        self.vocab_size = int(cfg.codebook_size)
        self.mask_token_id = int(mask_token_id)
        if not self.vocab_size <= self.mask_token_id < int(cfg.vocab_size):
            raise ValueError(f"mask_token_id={mask_token_id} must lie outside the codebook [0, {self.vocab_size}) and inside "
                             f"the transformer's input vocabulary (vocab_size={cfg.vocab_size})")
        _check_choice("masking_schedule", masking_schedule, SCHEDULES)
        self.masking_schedule = masking_schedule
        self.vae_scale_factor = 2 ** (len(vqvae.config.block_out_channels) - 1)
        side = int(cfg.sample_size)
        self.grid = (side, side)
        if int(vqvae.config.num_vq_embeddings) != self.vocab_size:
            raise ValueError(f"the VQ model has {vqvae.config.num_vq_embeddings} codes but the transformer predicts "
                             f"codebook_size={self.vocab_size}")
        if codec is not None and (tuple(codec.grid) != self.grid or codec.codebook_size != self.vocab_size):
            raise ValueError(f"codec {codec!r} does not fit the model: grid {self.grid}, codebook {self.vocab_size}")
        self.codec = codec
        self.generation_defaults = dict(DEFAULT_GENERATION)
        self.generation_defaults = self._options(generation_defaults)

    # ------------------------------------------------------------------------------------------ options, text
    def _options(self, overrides: dict) -> dict:
        unknown = sorted(set(overrides) - set(GENERATION_KEYS))
        if unknown:
            raise ValueError(f"unknown masked_image generation options {unknown}; valid: {list(GENERATION_KEYS)}")
        o = {**self.generation_defaults, **{k: v for k, v in overrides.items() if v is not None}}
        steps = o["num_steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"num_steps must be a positive int, got {steps!r}")
        if not (isinstance(o["temperature"], (int, float)) and o["temperature"] > 0):
            raise ValueError(f"temperature must be a number > 0 (the token draw), got {o['temperature']!r}")
        if not (isinstance(o["cfg_scale"], (int, float)) and o["cfg_scale"] >= 0):
            raise ValueError(f"cfg_scale must be a number >= 0, got {o['cfg_scale']!r}")
        _check_choice("score", {"cond": "conditional"}.get(o["score"], o["score"]), SCORES)
        o["score"] = {"cond": "conditional"}.get(o["score"], o["score"])
        if not isinstance(o["negative_prompt"], str):
            raise ValueError(f"negative_prompt must be a string, got {type(o['negative_prompt']).__name__}")
        rt = o["remask_temperature"]
        o["remask_temperature"] = tuple(float(x) for x in rt) if isinstance(rt, (list, tuple)) else float(rt)
        o["cfg_scale"], o["temperature"] = float(o["cfg_scale"]), float(o["temperature"])
        o["crop_coord"] = tuple(int(x) for x in o["crop_coord"])
        return o

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """[N, L] CLIP ids, padded / truncated to `model_max_length` (aMUSEd's pipeline)."""
        bad = [p for p in prompts if not isinstance(p, str)]
        if bad:
            raise TypeError(f"masked_image prompts are strings, got {type(bad[0]).__name__}")
        ids = self.tokenizer(list(prompts), return_tensors="pt", padding="max_length", truncation=True,
                             max_length=self.tokenizer.model_max_length).input_ids
        return ids.to(self.device)

    @torch.no_grad()
    def encode_text(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(pooled projected embedding [N, Dp], penultimate hidden states [N, L, Dh]) of CLIP ids (aMUSEd's
        conditioning: `text_embeds` and `hidden_states[-2]`)."""
        out = self.text_encoder(ids.to(self.text_encoder.device), return_dict=True, output_hidden_states=True)
        return out.text_embeds, out.hidden_states[-2]

    def micro_conds(self, n: int, dtype, opts: dict | None = None) -> torch.Tensor:
        """[N, 5] aMUSEd's micro-conditioning: width, height, crop coordinates, aesthetic score."""
        o = opts or self.generation_defaults
        side = self.grid[0] * self.vae_scale_factor
        vals = [side, side, o["crop_coord"][0], o["crop_coord"][1], o["aesthetic_score"]]
        return torch.tensor(vals, device=self.device, dtype=dtype)[None].expand(n, -1)

    # ------------------------------------------------------------------------------------------ forwards
    def image_logits(self, module, tokens: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor], opts: dict | None = None) -> torch.Tensor:
        """[B, T, V] transformer logits of the states `tokens` [B, T] under the text condition (pooled, hidden)."""
        pooled, hidden = text
        b = tokens.shape[0]
        h, w = self.grid
        out = module(rearrange(tokens, "b (h w) -> b h w", h=h, w=w), micro_conds=self.micro_conds(b, hidden.dtype, opts),
                     pooled_text_emb=pooled, encoder_hidden_states=hidden)  # [B, V, h, w]
        return rearrange(out, "b v h w -> b (h w) v")

    def _scored(self, module, states, pos_text, neg_text, *, score: str, cfg_scale: float, opts=None) -> torch.Tensor:
        """[B, T, V] logits of the scored distribution: conditional, or CFG-guided with the negative condition."""
        if score == "guided" and cfg_scale != 1.0:
            both = self.image_logits(module, torch.cat([states, states]), tuple(torch.cat([n, p]) for n, p in zip(neg_text, pos_text)), opts)
            uncond, cond = both.chunk(2)
            return cfg_logits(cond, uncond, cfg_scale)
        return self.image_logits(module, states, pos_text, opts)

    # ------------------------------------------------------------------------------------------ sampling
    def sample(self, prompts: list, group_size: int, *, generator: torch.Generator | None = None,
               seeds: Sequence[int] | torch.Tensor | None = None, **generation: Any) -> Rollout:
        """G images per prompt (rows g*G .. g*G+G-1) with the aMUSEd schedule; row n draws from a generator seeded
        with `seeds[n]` (else N seeds drawn from `generator`). Extras: `grid`, `order` [N, T], `seeds`, the
        sampling options."""
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError(f"prompts must be a non-empty list, got {prompts!r}")
        o = self._options(generation)
        rep = [p for p in prompts for _ in range(group_size)]
        n = len(rep)
        seeds_t = draw_row_seeds(n, generator) if seeds is None else torch.as_tensor(seeds, dtype=torch.long).reshape(-1).cpu()
        if seeds_t.numel() != n:
            raise ValueError(f"seeds must give one seed per response ({len(prompts)} prompts x group_size {group_size} = {n}), "
                             f"got {seeds_t.numel()}")
        gens = [torch.Generator().manual_seed(int(s)) for s in seeds_t.tolist()]
        ids = self.tokenize(rep)  # [N, L]
        neg_ids = self.tokenize([o["negative_prompt"]] * n)  # [N, L]
        pos_text, neg_text = self.encode_text(ids), self.encode_text(neg_ids)
        guided = o["cfg_scale"] != 1.0
        model = self.unwrapped

        def logits_fn(states):
            if not guided:
                return self.image_logits(model, states, pos_text, o), None
            both = self.image_logits(model, torch.cat([states, states]), tuple(torch.cat([a, b]) for a, b in zip(neg_text, pos_text)), o)
            uncond, cond = both.chunk(2)
            return cond, uncond

        with _eval_mode(model), torch.no_grad():
            out = maskgit_sample(logits_fn, gens, num_tokens=self.grid[0] * self.grid[1], mask_id=self.mask_token_id,
                                 num_steps=o["num_steps"], cfg_scale=o["cfg_scale"], temperature=o["temperature"],
                                 remask_temperature=o["remask_temperature"], schedule=self.masking_schedule)
        tokens = out["tokens"]
        extras = {"grid": tuple(self.grid), "order": out["order"], "seeds": seeds_t.to(tokens.device),
                  "terminated": torch.ones(n, dtype=torch.bool, device=tokens.device),
                  **{k: o[k] for k in ("cfg_scale", "num_steps", "temperature", "score")}}
        mask = torch.ones_like(ids, dtype=torch.bool)
        return Rollout(prompt_ids=ids, prompt_mask=mask, response_ids=tokens, response_mask=torch.ones_like(tokens, dtype=torch.bool),
                       group_size=group_size, prompts=rep, completions=self.decode(tokens),
                       old_logp=out["guided_logp"] if o["score"] == "guided" else out["cond_logp"],
                       neg_prompt_ids=neg_ids, neg_prompt_mask=mask.clone(), extras=extras)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> list:
        """PIL images of image tokens [N, T]: through the codec if given, else the VQ model (aMUSEd's pipeline:
        `vqvae.decode(force_not_quantize=True)`, clipped to [0, 1])."""
        if self.codec is not None:
            return self.codec.decode(tokens)
        from diffusers.image_processor import VaeImageProcessor

        h, w = self.grid
        vq = self.vqvae
        img = vq.decode(tokens.to(vq.device), force_not_quantize=True,
                        shape=(tokens.shape[0], h, w, vq.config.latent_channels)).sample.clip(0, 1)
        return VaeImageProcessor(vae_scale_factor=self.vae_scale_factor, do_normalize=False).postprocess(img, "pil")

    def token_strings(self, rollout: Rollout) -> list[list[str]]:
        """Image tokens have no text; each is shown as `<img:id>` (laid out on `rollout.extras["grid"]`)."""
        return [[f"<img:{int(i)}>" for i in row] for row in rollout.response_ids.tolist()]

    # ------------------------------------------------------------------------------------------ log-probs
    def _opt(self, rollout: Rollout, key: str):
        return rollout.extras.get(key, self.generation_defaults[key])

    def _texts(self, rollout: Rollout, condition: str):
        neg_ids = rollout.neg_prompt_ids if rollout.neg_prompt_ids is not None else self.tokenize(
            [self.generation_defaults["negative_prompt"]] * rollout.num_responses)
        pos, neg = self.encode_text(rollout.prompt_ids), self.encode_text(neg_ids)
        return (pos, neg) if condition == "positive" else (neg, neg)

    def logprob(self, rollout: Rollout, *, condition: str = "positive", use_reference: bool = False, stats: tuple[str, ...] = (),
                stats_against: str = "reference", estimator: str = "per_step", mask_seed: int = 0, num_copies: int = 4,
                score: str | None = None, min_mask_rate: float = DEFAULT_MIN_MASK_RATE) -> TokenScores:
        """Per-token log-probs [N, T] of the rollout's image tokens (estimators in the module docstring).

        `condition="negative"` scores under the negative prompt (GCPO); `stats` against the reference model under
        the same condition or against this model under the negative condition, from the same states. `per_step`
        scores at the rollout's token temperature (so it equals `old_logp`), `mean_field` and `elbo` the model's
        distribution (temperature 1), as the masked-diffusion LM family.
        """
        _check_choice("estimator", estimator, ESTIMATORS)
        _check_choice("condition", condition, ("positive", "negative"))
        _check_choice("stats_against", stats_against, ("reference", "negative"))
        bad = [s for s in stats if s not in STATS]
        if bad:
            raise ValueError(f"unknown statistics {bad}; valid: {list(STATS)}")
        score = {"cond": "conditional"}.get(score or self._opt(rollout, "score"), score or self._opt(rollout, "score"))
        _check_choice("score", score, SCORES)
        if condition == "negative":
            score = "conditional"  # the negative condition's own logits (the unconditional branch)
        cfg_scale = float(self._opt(rollout, "cfg_scale"))
        resp = rollout.response_ids
        n, t = resp.shape
        need_other = any(s != "entropy" for s in stats)
        pos_text, neg_text = self._texts(rollout, condition)
        other_text = pos_text if stats_against == "reference" else self._texts(rollout, "negative")[0]
        sides = [(pos_text, use_reference, True)] + ([(other_text, stats_against == "reference" or use_reference, False)] if need_other else [])

        if estimator == "per_step":
            order = rollout.extras.get("order")
            if order is None:
                raise ValueError("estimator='per_step' needs rollout.extras['order'] (recorded by MaskedImageAdapter.sample)")
            order = order.to(resp.device)
            steps = int(order.max()) + 1
            temperature = float(self._opt(rollout, "temperature"))

            def forward(module, text):
                out = None
                for s in range(steps):
                    lg = self._scored(module, state_at_step(resp, order, s, self.mask_token_id), text, neg_text,
                                      score=score, cfg_scale=cfg_scale)  # [N, T, V]
                    out = lg if out is None else torch.where((order == s)[..., None], lg, out)
                return out

            logits = [self._side(forward, text, ref, grad) for text, ref, grad in sides]
            return score_logits(logits[0], resp, rollout.response_mask, temperature=temperature,
                                other_logits=logits[1] if need_other else None, stats=tuple(stats))
        if estimator == "mean_field":
            states = torch.full_like(resp, self.mask_token_id)  # [N, T] every image token masked

            def forward(module, text):
                return self._scored(module, states, text, neg_text, score=score, cfg_scale=cfg_scale)

            logits = [self._side(forward, text, ref, grad) for text, ref, grad in sides]
            return score_logits(logits[0], resp, rollout.response_mask, other_logits=logits[1] if need_other else None,
                                stats=tuple(stats))
        # elbo: R antithetic masked copies, masks seeded by the row's prompt and tokens
        if isinstance(num_copies, bool) or not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"num_copies must be a positive int, got {num_copies!r}")
        seeds = row_seeds(mask_seed, rollout.prompt_ids, rollout.prompt_mask, resp, "image")
        masked, _ = elbo_masks(seeds, num_copies, t, resp.device, min_rate=min_mask_rate)  # [R, N, T]
        states = rearrange(torch.where(masked, torch.full_like(masked, self.mask_token_id, dtype=resp.dtype), resp[None]),
                           "r n t -> (r n) t")  # [R*N, T]
        rep = lambda x: torch.cat([x] * num_copies)  # noqa: E731  [N, ...] -> [R*N, ...]

        def forward(module, text):
            return self._scored(module, states, tuple(rep(x) for x in text), tuple(rep(x) for x in neg_text), score=score,
                                cfg_scale=cfg_scale)

        logits = [self._side(forward, text, ref, grad) for text, ref, grad in sides]
        flat = rearrange(masked, "r n t -> (r n) t")
        sc = score_logits(logits[0], resp.repeat(num_copies, 1), flat, other_logits=logits[1] if need_other else None,
                          stats=tuple(stats))
        per_copy = lambda v: rearrange(v, "(r n) t -> r n t", r=num_copies)  # noqa: E731
        count = masked.sum(0).clamp(min=1).float()  # [N, T]
        st = {k: torch.where(masked, per_copy(v), torch.zeros_like(per_copy(v))).sum(0) / count for k, v in sc.stats.items()}
        other = elbo_token_contributions(per_copy(sc.other_logp), masked) if sc.other_logp is not None else None
        return TokenScores(logp=elbo_token_contributions(per_copy(sc.logp), masked), stats=st, other_logp=other)

    def _side(self, forward, text, use_reference: bool, grad: bool) -> torch.Tensor:
        with self.scoring_model(use_reference) as m, (contextlib.nullcontext() if grad else torch.no_grad()):
            return forward(m, text)

    # ------------------------------------------------------------------------------------------ WDCE
    def forward_noise(self, rollout: Rollout, num_copies: int, generator: torch.Generator | None = None, *,
                      min_rate: float = DEFAULT_MIN_MASK_RATE) -> NoisedBatch:
        """R antithetic masked copies of the image tokens (`mmrl.algorithms.antithetic_masks`, rates
        `min_rate + (1 - min_rate) U`); copy r of response i is row `r*N + i` of `[text ids, masked tokens]`."""
        if isinstance(num_copies, bool) or not isinstance(num_copies, int) or num_copies < 1:
            raise ValueError(f"num_copies must be a positive int, got {num_copies!r}")
        resp = rollout.response_ids
        maskable = torch.ones_like(resp, dtype=torch.bool)
        dev = generator.device if generator is not None else resp.device
        masked, rates = antithetic_masks(maskable.to(dev), num_copies, generator, min_rate=min_rate, antithetic=num_copies % 2 == 0)
        masked, rates = masked.to(resp.device), rates.to(resp.device)
        copies = torch.where(masked, torch.full_like(masked, self.mask_token_id, dtype=resp.dtype), resp[None])  # [R, N, T]
        prompt = rollout.prompt_ids[None].expand(num_copies, -1, -1)  # [R, N, L]
        ids = rearrange(torch.cat([prompt, copies], dim=-1), "r n l -> (r n) l")  # [R*N, L+T]
        return NoisedBatch(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.bool), noise_mask=masked,
                           n_masked=masked.sum(-1).clamp(min=1).float(), rates=rates.float(), num_copies=num_copies,
                           prompt_len=rollout.prompt_ids.shape[1], extras={"targets": resp})

    def denoise_logprob(self, noised: NoisedBatch, *, use_reference: bool = False) -> torch.Tensor:
        """[R, N, T] log p(clean token | masked copy, prompt) at the masked positions, 0 elsewhere."""
        targets = noised.extras.get("targets")
        if targets is None:
            raise ValueError("denoise_logprob needs the clean tokens in noised.extras['targets'] (as forward_noise builds it)")
        r, p = noised.num_copies, noised.prompt_len
        text = self.encode_text(noised.input_ids[:, :p])
        with self.scoring_model(use_reference) as m:
            logits = self.image_logits(m, noised.input_ids[:, p:], text)  # [R*N, T, V]
        logp = rearrange(selective_log_softmax(logits, targets.repeat(r, 1)), "(r n) t -> r n t", r=r)
        return torch.where(noised.noise_mask, logp, torch.zeros_like(logp))

    # ------------------------------------------------------------------------------------------ persistence
    def save_pretrained(self, path) -> None:
        """The aMUSEd snapshot layout (`SUBFOLDERS`, safetensors) plus `model_index.json` and `mmrl_adapter.json`
        (family, generation defaults, the codec)."""
        from diffusers import AmusedScheduler

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        unwrap(self.model).save_pretrained(path / "transformer", safe_serialization=True)
        self.vqvae.save_pretrained(path / "vqvae", safe_serialization=True)
        self.text_encoder.save_pretrained(path / "text_encoder", safe_serialization=True)
        self.tokenizer.save_pretrained(path / "tokenizer")
        AmusedScheduler(mask_token_id=self.mask_token_id, masking_schedule=self.masking_schedule).save_pretrained(path / "scheduler")
        index = {"_class_name": "AmusedPipeline", "scheduler": ["diffusers", "AmusedScheduler"],
                 "text_encoder": ["transformers", "CLIPTextModelWithProjection"], "tokenizer": ["transformers", "CLIPTokenizer"],
                 "transformer": ["diffusers", "UVit2DModel"], "vqvae": ["diffusers", "VQModel"]}
        (path / "model_index.json").write_text(json.dumps(index, indent=2))
        meta = {"family": self.family, "generation_defaults": self.generation_defaults,
                "codec": self.codec.config() if self.codec is not None else None}
        (path / ADAPTER_FILE).write_text(json.dumps(meta, indent=2))

    @staticmethod
    def _load_transformer(path: Path, dtype=None, device=None):
        from diffusers import UVit2DModel

        kw = {} if dtype is None else {"torch_dtype": getattr(torch, dtype) if isinstance(dtype, str) else dtype}
        model = UVit2DModel.from_pretrained(path / "transformer", use_safetensors=True, local_files_only=True, **kw)
        return (model.to(device) if device is not None else model).eval()

    @classmethod
    def from_pretrained(cls, path, *, trust_remote_code: bool = False, dtype=None, device=None, ref_model: bool | str = False,
                        codec: ImageCodec | None = None, **generation_defaults) -> "MaskedImageAdapter":
        """Load an aMUSEd snapshot from a LOCAL directory (e.g. `amused/amused-256` downloaded once); `ref_model=True`
        loads a second frozen transformer (a path: from there). `mmrl_adapter.json`, if present, restores the
        generation defaults and the codec. No remote code is ever needed."""
        from diffusers import AmusedScheduler, VQModel
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        path = Path(path).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"masked_image model directory not found: {str(path)!r} (models are loaded from local paths only)")
        missing = [s for s in SUBFOLDERS if not (path / s).is_dir()]
        if missing:
            raise FileNotFoundError(f"{str(path)!r} is not an aMUSEd snapshot: missing {missing} (needs {list(SUBFOLDERS)})")
        saved: dict = {}
        if (path / ADAPTER_FILE).is_file():
            saved = json.loads((path / ADAPTER_FILE).read_text())
            if saved.get("family", cls.family) != cls.family:
                raise ValueError(f"{path / ADAPTER_FILE} is for family {saved.get('family')!r}, not {cls.family!r}")
        transformer = cls._load_transformer(path, dtype, device)
        vqvae = VQModel.from_pretrained(path / "vqvae", use_safetensors=True, local_files_only=True)
        text_encoder = CLIPTextModelWithProjection.from_pretrained(path / "text_encoder", use_safetensors=True, local_files_only=True)
        tokenizer = CLIPTokenizer.from_pretrained(path / "tokenizer", local_files_only=True)
        sched = AmusedScheduler.from_pretrained(path / "scheduler", local_files_only=True)
        if device is not None:
            vqvae.to(device)
            text_encoder.to(device)
        ref = None
        if ref_model:
            ref = cls._load_transformer(path if ref_model is True else Path(ref_model), dtype, device)
        if codec is None and saved.get("codec"):
            codec = codec_from_config(saved["codec"])
        gen = {**saved.get("generation_defaults", {}), **generation_defaults}
        return cls(transformer, vqvae, text_encoder, tokenizer, mask_token_id=sched.config.mask_token_id,
                   masking_schedule=sched.config.masking_schedule, ref_model=ref, codec=codec, **gen)

def tiny_amused_components(*, seed: int = 0, words: Sequence[str] = (), grid: int = 4, codebook_size: int = 8,
                           hidden_size: int = 32, num_hidden_layers: int = 1, num_attention_heads: int = 2,
                           text_hidden_size: int = 32, text_layers: int = 1, model_max_length: int = 16,
                           init_std: float | None = None) -> dict[str, Any]:
    """Randomly initialised (seeded) aMUSEd components with the real classes, the keyword arguments of
    `AmusedPipeline`: `transformer` (`UVit2DModel`, a `grid` x `grid` token canvas), `vqvae` (`VQModel`, 2 levels:
    images of 2 * grid pixels), `text_encoder` (`CLIPTextModelWithProjection`), `tokenizer` (`tiny_clip_tokenizer`
    over `words`) and `scheduler` (`AmusedScheduler`, mask id = codebook_size). `init_std`: normal init of every
    transformer weight matrix / kernel and the text encoder's `initializer_range` (None: the classes' defaults)."""
    from diffusers import AmusedScheduler, UVit2DModel, VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    from mmrl.models.clip_tokenizer import tiny_clip_tokenizer

    tok = tiny_clip_tokenizer(words, model_max_length=model_max_length)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_cfg = CLIPTextConfig(vocab_size=len(tok), hidden_size=text_hidden_size, intermediate_size=2 * text_hidden_size,
                                  projection_dim=text_hidden_size, num_hidden_layers=text_layers + 1, num_attention_heads=2,
                                  max_position_embeddings=model_max_length, initializer_range=init_std or 0.02,
                                  bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text_encoder = CLIPTextModelWithProjection(text_cfg).eval()
        transformer = UVit2DModel(
            hidden_size=hidden_size, cond_embed_dim=text_hidden_size, micro_cond_encode_dim=2, micro_cond_embed_dim=10,
            encoder_hidden_size=text_hidden_size, vocab_size=codebook_size + 1, codebook_size=codebook_size,
            in_channels=hidden_size, block_out_channels=hidden_size, num_res_blocks=1, block_num_heads=num_attention_heads,
            num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads, intermediate_size=2 * hidden_size,
            sample_size=grid).eval()
        if init_std is not None:
            for name, p in transformer.named_parameters():
                if p.dim() > 1:
                    torch.nn.init.normal_(p, std=init_std)
        vqvae = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                        latent_channels=4, num_vq_embeddings=codebook_size, vq_embed_dim=4, norm_num_groups=4,
                        sample_size=2 * grid, lookup_from_codebook=True).eval()
    sched = AmusedScheduler(mask_token_id=codebook_size)
    return {"transformer": transformer, "vqvae": vqvae, "text_encoder": text_encoder, "tokenizer": tok, "scheduler": sched}


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
