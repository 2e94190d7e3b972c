"""The one training configuration: a documented dataclass, loaded from YAML with `key=value` overrides.

Field names follow TRL's `GRPOConfig` wherever the concept is the same (`num_generations`, `beta`, `epsilon`,
`epsilon_high`, `num_iterations`, `loss_type`, `scale_rewards`, `max_completion_length`,
`per_device_train_batch_size`, `gradient_accumulation_steps`, `learning_rate`, ...). Every field has a docstring
(the string under it); `mmrl train --help-config` prints them.

Method defaults: a method (e.g. `dapo`) implies some settings (clip-higher, token-mean loss, dynamic sampling).
They fill every field the YAML file, the command line or the Python call `TrainConfig(method=...)` leave unset,
see `METHOD_DEFAULTS`; the three ways give the same configuration. TRL's spellings `resume_from_checkpoint`, `bf16`
and `fp16` are accepted as keys too (`mmrl.config.aliases`).

Defaults are TRL's where mmrl has no reason to differ; each deliberate difference is stated in the field's
docstring ("TRL: ...").

Validation happens in `TrainConfig.validate()`, before any model is loaded: every bad value is reported with the
field, the value and what is allowed.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mmrl.config.errors import ConfigError
from mmrl.core.constants import DEFAULT_NEGATIVE_INSTRUCTION


@dataclass
class TrainConfig:
    """Everything a training run needs. See the field docstrings; presets live in `configs/`."""

    # ---- what to train ------------------------------------------------------------------------------------
    method: str = "grpo"
    """RL method: grpo, dapo, dr_grpo, diffu_grpo (d1), gcpo, dgpo, dmpo or gspo (`mmrl.methods.METHODS`). Sets the
    defaults of METHOD_DEFAULTS."""
    family: str = "causal_lm"
    """Model family (adapter): causal_lm, vlm, janus, masked_diffusion or masked_image."""
    model_name_or_path: str = "tiny"
    """Local checkpoint directory; `tiny` builds a tiny random model of the family (tests); `tiny-world:NAME` uses
    a tiny-world base model (built and cached on first use). Never downloaded at run time."""
    ref_model_name_or_path: str | None = None
    """Reference model directory (KL, DGPO, DMPO). None: a frozen copy of the initial policy, or with LoRA the
    adapter-disabled base model."""
    trust_remote_code: bool = False
    """Allow checkpoints that ship their own modeling code (LLaDA, Dream). Off unless you trust the source."""
    torch_dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    mixed_precision: str = "no"
    """accelerate mixed precision: no, bf16 or fp16 (TRL's `bf16: true` / `fp16: true` set it). TRL: bf16 where the
    hardware has it; here off, so that a CPU run and its tests need no flag."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (transformers' `gradient_checkpointing_enable`, every family):
    less memory, about a third more compute. TRL: on by default; here off, since the tiny and CPU models this
    runs by default are compute-bound (benchmarks/gradient_checkpointing.py measures both)."""

    # ---- data and rewards ---------------------------------------------------------------------------------
    task: str = "countdown3"
    """Prompt set / task name (see `mmrl.data.tasks`), e.g. gsm8k, math500, countdown, sudoku, geneval, and the
    tiny-world tasks sudoku4, countdown3, shapes."""
    dataset_path: str | None = None
    """Data for the task, read by `datasets.load_dataset`: a JSON/JSONL/CSV/Parquet file, a directory with
    train/test files, a directory written by `Dataset.save_to_disk`, or (online) a Hub dataset name; None uses the
    task's bundled or cached data."""
    eval_split: float | int = 0.0
    """Task `jsonl` with a single file: the rows held out as the test split, a fraction in (0, 1) or a count >= 1
    (the last rows; the count is printed). 0 holds nothing out (TRL trains on the whole train split)."""
    reward_funcs: list[str] = field(default_factory=list)
    """Reward names from `mmrl.rewards.REWARDS`, or import paths of your own reward functions as TRL accepts them
    (`my_pkg.rewards.correctness`, `path/to/file.py:correctness`); empty uses the task's default rewards."""
    reward_weights: list[float] | None = None
    """One weight per reward (TRL `reward_weights`); None means all 1."""
    reward_kwargs: dict = field(default_factory=dict)
    """Per-reward configuration by reward name, e.g. `{clip_score: {pretrained: /path/to/weights}}`."""
    on_reward_error: str = "raise"
    """What a failing reward (exception, timeout, NaN/inf, wrong length or type) does once its retries are used up:
    `raise` stops with the reward's name and the sample index; `drop` drops the sample's group from the batch and
    counts it (`rewards/dropped_groups`), sampling new prompts to refill the batch."""
    reward_timeout: float | None = None
    """Seconds one call of a reward may take before it counts as failed (None: no limit)."""
    reward_retries: int = 0
    """Re-run a reward call that raised or timed out at most this many times (for remote rewards), waiting
    reward_retry_backoff x 2^k seconds before retry k + 1. Bad values (NaN, wrong length) are not retried."""
    reward_retry_backoff: float = 1.0
    """Seconds before the first reward retry; doubled for each further retry (at most 60)."""

    # ---- batch geometry (TRL semantics) -------------------------------------------------------------------
    num_generations: int = 8
    """G: responses sampled per prompt (group size), >= 2."""
    per_device_train_batch_size: int = 8
    """Responses per micro-batch per process."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step. One rollout batch = per_device_train_batch_size x
    gradient_accumulation_steps responses per process; it must hold whole groups."""
    num_iterations: int = 1
    """Optimizer steps per rollout batch (TRL's mu; DMPO's buffer reuse F): rollouts are refreshed every
    num_iterations steps."""
    max_steps: int = 100
    """Optimizer steps to train; -1 with `num_train_epochs` derives them from the dataset size. TRL: -1 (3
    epochs); here a fixed step count, as the papers' recipes give one."""
    num_train_epochs: float | None = None
    """Passes over the prompt dataset (TRL's name); used when `max_steps` is -1 or not given: max_steps =
    ceil(epochs x prompts / prompts per rollout batch, all processes) x num_iterations."""
    seed: int = 0
    """Seed of every random stream (data order, sampling, masks, initialisation of tiny models). TRL: 42; here 0,
    which the bundled presets and recorded results use."""

    # ---- generation ---------------------------------------------------------------------------------------
    max_prompt_length: int | None = None
    """Prompts longer than this many tokens (after the chat template) keep only their last max_prompt_length tokens
    (TRL's / d1's left truncation; causal_lm and masked_diffusion); a longer VLM prompt raises (its image tokens
    cannot be cut); Janus prompts are not limited. None keeps them whole."""
    max_completion_length: int = 256
    """Response tokens: max new tokens (AR families) or the generated span (masked diffusion). Janus generates its
    fixed number of image tokens. TRL: 512; here d1's 256."""
    temperature: float = 1.0
    """Sampling temperature (> 0; log-probs are of the temperature-scaled distribution, as in TRL). Masked
    diffusion samplers also accept 0 (greedy)."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1] (autoregressive text families)."""
    top_k: int = 0
    """Top-k sampling (0 = off; autoregressive text families)."""
    cfg_scale: float = 5.0
    """Janus classifier-free guidance scale s (`uncond + s * (cond - uncond)`)."""
    score_logits: str = "conditional"
    """Janus: which distribution the policy log-probs are of: `conditional` (GCPO, T2I-R1) or `guided`."""
    sampler: str | None = None
    """Masked-diffusion sampler: low_confidence, random, entropy, maskgit_plus, topk_margin, threshold,
    threshold_cache, random_order. None: the family default."""
    block_length: int = 32
    """Masked diffusion: semi-autoregressive block length; must divide max_completion_length."""
    diffusion_steps: int | None = None
    """Masked diffusion: denoising steps for the whole span (a multiple of the number of blocks); None =
    max_completion_length / 2 (d1's training setting)."""
    threshold: float = 0.9
    """Masked diffusion threshold samplers (Fast-dLLM): confidence needed to unmask in parallel."""
    diffusion_cache: str | None = None
    """Masked diffusion: Fast-dLLM KV cache for any sampler, `prefix` or `dual` (native backbones); None = no cache."""
    generation_kwargs: dict = field(default_factory=dict)
    """Further family-specific sampling options passed to `sample()`; a key the family does not know (TRL's
    `repetition_penalty`, `min_p`, a typo) is refused at start-up, naming the family's options."""
    chat_template_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the tokenizer's `apply_chat_template` for conversational prompts (TRL's name), e.g.
    `{enable_thinking: false}` (causal_lm and vlm)."""
    negative_instruction: str = DEFAULT_NEGATIVE_INSTRUCTION
    """GCPO's negative condition for text, VLM and diffusion LMs (appended to the prompt)."""

    # ---- policy loss (GRPO family) ------------------------------------------------------------------------
    learning_rate: float = 1e-6
    """AdamW learning rate (> 0)."""
    lr_scheduler_type: str = "constant"
    """transformers scheduler name: constant, constant_with_warmup, linear, cosine, ... TRL: linear; here constant,
    as the GRPO/DAPO/d1/DMPO recipes train."""
    warmup_ratio: float = 0.0
    """Fraction of max_steps used for warm-up."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float = 1.0
    """Gradient-norm clipping (on by default); 0 disables it."""
    max_nonfinite_steps: int = 3
    """A step whose loss or gradient is NaN/inf is skipped and logged; this many in a row stop the run."""
    beta: float = 0.0
    """KL coefficient to the reference (k3 estimator); 0 loads no reference for the KL."""
    epsilon: float = 0.2
    """Lower clip range (ratio >= 1 - epsilon)."""
    epsilon_high: float | None = None
    """Upper clip range (ratio <= 1 + epsilon_high); None = epsilon. DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """Dual-clip bound c > 1 for negative advantages (verl `clip_ratio_c`); None = off."""
    loss_type: str = "dapo"
    """Loss aggregation (TRL names; the method sets it, see METHOD_DEFAULTS: method grpo, the default, gives grpo;
    TRL's default is dapo whatever the method): dapo (token mean over the whole accumulated batch), bnpo (token mean of each
    micro-batch, averaged over micro-batches: d1's diffu-GRPO), grpo (sequence mean of token means), dr_grpo (sum
    over tokens / (N * max_completion_length))."""
    scale_rewards: str = "group"
    """Advantage scaling (TRL): group, batch or none."""
    mask_truncated_completions: bool = False
    """Exclude responses that never produced EOS from the loss (DAPO's overlong filtering)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts to refill."""
    dynamic_sampling_max_tries: int = 8
    """Rollout batches dynamic sampling may draw to fill one batch before it stops with an error."""
    overlong_penalty: bool = False
    """DAPO's soft overlong punishment (eq. 13) added to the reward (text families)."""
    overlong_buffer_len: int | None = None
    """Length of the soft-punishment interval L_cache; None = max_completion_length // 5."""
    nll_coef: float = 0.0
    """Coefficient of an extra mean NLL term of the sampled tokens (GCPO's VLM recipe "entropy penalty")."""
    logprob_estimator: str = "mean_field"
    """Masked diffusion log-probs for GRPO-family losses: mean_field (d1's one-step estimate) or elbo; masked_image
    also per_step (each image token at the sampler step that revealed it, models/masked_image.py)."""
    p_mask_prompt: float = 0.15
    """d1 mean-field estimator: probability of masking each prompt token."""
    random_masking: bool = True
    """d1: a fresh mask seed per inner iteration (the same seed for old, reference and current log-probs)."""

    # ---- GCPO ---------------------------------------------------------------------------------------------
    gcpo_divergence: str = "k3"
    """GCPO per-token contrast: k3 (authors' code), abs, info_gain, or full_kl (exact full-vocabulary KL)."""
    gcpo_normalization: str = "rank_power"
    """GCPO normalization: rank_power (authors' "hist") or cdf (the paper's wording)."""
    gcpo_top_fraction: float = 0.4
    """GCPO rank-power: fraction of top tokens ..."""
    gcpo_target_mass: float = 0.8
    """... that carries this fraction of the weight."""
    gcpo_entropy_reward: float = 0.0
    """STAGE's entropy reward, which GCPO's text-to-image launch turns on with 0.4 (0 = off): among the responses of
    maximal reward in a group, r_i += c (e_i - mean e), e_i = 1 / (1 + (H_ref,i - H_theta,i)^2) of the mean token
    entropies (`mmrl.algorithms.entropy_reward`). Needs the reference model; any method can use it."""

    # ---- DGPO ---------------------------------------------------------------------------------------------
    dgpo_tau: float = 0.5
    """DGPO softmax temperature tau."""
    dgpo_kappa: float = 1.0
    """DGPO entropy-gate power kappa."""
    dgpo_policy: str = "old"
    """Which policy's distributions DGPO scores: old (rollout time, no extra forward) or current (per micro-batch)."""

    # ---- DMPO ---------------------------------------------------------------------------------------------
    dmpo_loss: str = "wdce"
    """DMPO objective: wdce (weighted denoising cross-entropy) or wddo."""
    dmpo_alpha: float = 0.04
    """Reward temperature alpha of the target p* ∝ p_ref exp(r / alpha)."""
    dmpo_target: str = "reference"
    """DMPO target: `reference` (paper eq. 10: p* ∝ p_ref exp(r/alpha); the weights need log p_ref - log p_v, ELBO
    estimates for masked diffusion) or `behaviour` (the proximal limit of App. B.2 with v = theta_old: target
    ∝ p_v exp(r/alpha), weights softmax(r/alpha); forward-only, no log-likelihood estimates, no estimator noise)."""
    dmpo_coeff: float = 1.0
    """Proximal coefficient c in (0, 1] multiplying the log-weights."""
    dmpo_baseline: str = "individual"
    """Weight baseline: none, group (paper eq. 13: 1/G), individual (authors' code default), model, or
    micro_batch_mean (the authors' code's group baseline: the mean weight of each per-device micro-batch)."""
    dmpo_baseline_strength: float = 1.0
    """Strength lambda of the baseline: w_real = w - lambda * w_base."""
    dmpo_negative_scale: float = 1.0
    """Scale rho of the below-baseline (negative) weights: w_real = max(d, 0) + rho * min(d, 0), d = w - lambda *
    w_base. 1 = the paper's negative gradient insertion (an unbounded unlikelihood push on below-baseline
    responses); 0 = fit only above-baseline responses (what the tiny reasoning presets use: at useful learning rates
    the negative term drove the likelihood of the model's own outputs down until it collapsed, docs/RESULTS.md)."""
    dmpo_num_copies: int = 4
    """R: masked copies per response in the WDCE loss (antithetic pairs, so even)."""
    dmpo_elbo_copies: int = 4
    """Masked copies of the ELBO estimates of log p_ref - log p_v at buffer time (even)."""
    dmpo_min_mask_rate: float = 0.1
    """Lower end of the WDCE mask rate, lambda = min + (1 - min) U."""
    wddo_beta: float = 1.0
    """WDDO logit scale beta."""
    wddo_alpha: float = 1.0
    """WDDO weight of the fake (second-half) term."""

    # ---- LoRA ---------------------------------------------------------------------------------------------
    use_peft: bool = False
    """Train LoRA adapters (peft); the reference is then the adapter-disabled base model."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout (kept 0 by default: dropout would break ratio == 1 at the first inner step)."""
    lora_target_modules: list[str] | str = "all-linear"
    """Modules that get adapters (peft syntax)."""

    # ---- output, logging, checkpoints ---------------------------------------------------------------------
    output_dir: str = "runs/mmrl"
    """Run directory: metrics, TensorBoard, checkpoints and pictures are written only inside it."""
    logging_steps: int = 1
    """Write metrics every this many optimizer steps. TRL: 10; here every step (RL curves are noisy and short)."""
    log_completions: bool = False
    """Write a completions table every logged step (TRL's name): prompt, completion, each reward, advantage, one
    row per response, to `completions.jsonl` in the run directory and to TensorBoard / W&B as text / a table."""
    log_diagnostics: bool = True
    """Log the `diag/` metrics every step (mmrl.core.diagnostics; README.md, "Metrics"): `diag/kl_k1`, `diag/kl_k3`
    (KL to the reference on the rollout's responses; it needs a reference model: one exists with beta > 0, DMPO,
    DGPO or LoRA, and otherwise a frozen copy of the policy is built when it has at most 1e9 parameters; with beta = 0
    it costs one no-grad reference forward per rollout and mask seed, DMPO one no-grad policy forward per
    micro-batch), `diag/pos_weight_frac`, `diag/neg_weight_frac` (signed weight mass of the loss),
    `diag/update_ratio(_max)` (update size relative to the weights; it keeps one extra copy of the trainable weights
    during the optimizer step of each logged step, so raise logging_steps or turn this off for a large full
    fine-tune)."""
    report_to: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Metric sinks: jsonl (always written) and accelerate's trackers: tensorboard, wandb, mlflow, comet_ml, aim,
    clearml, dvclive, swanlab, trackio (each when installed). TRL: none; here the JSONL record the reports read, and
    TensorBoard, which is a dependency."""
    save_steps: int = 50
    """Write a checkpoint every this many optimizer steps (0 = only at the end). TRL: 500; RL steps are slower."""
    save_total_limit: int = 2
    """Keep this many most recent checkpoints. TRL: all (None); a full-model checkpoint here also holds the
    optimizer and the rollout buffer, so unbounded keeping fills disks."""
    resume_from: str | None = None
    """Resume from `auto` (latest checkpoint in output_dir) or a checkpoint directory (TRL's key
    `resume_from_checkpoint` sets it; `true` means `auto`)."""
    ddp_timeout: int = 1800
    """Seconds a process waits for the others at a collective (TRL's `ddp_timeout`); past it the run stops with a
    message naming the cause (a frozen, killed or far slower process) instead of waiting forever."""
    eval_steps: int = 0
    """Evaluate on the task's test split every this many steps (0 = off); logged as `eval/accuracy`."""
    eval_limit: int | None = 256
    """Test rows used by the periodic evaluation (None = all)."""
    eval_generation: dict = field(default_factory=dict)
    """Sampling options of the periodic evaluation; empty = DMPO's greedy evaluation decoding for the family
    (`mmrl.training.evaluate.dmpo_generation`: masked diffusion steps = max_completion_length)."""
    credit_steps: int = 0
    """Write token-credit pictures (HTML heatmaps, image overlays) every this many steps (0 = off)."""
    progress_bar: bool = True
    """Show a progress bar with ETA."""

    # ----------------------------------------------------------------------------------------------------------
    _explicit: frozenset = field(default=frozenset(), repr=False, compare=False)

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def rollout_batch_size(self) -> int:
        """Responses per process in one rollout batch."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

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
    # DGPO: PPO-clip on a DAPO base, no KL term.
    "dgpo": {"loss_type": "dapo", "epsilon_high": 0.28, "dynamic_sampling": True, "overlong_penalty": True, "beta": 0.0},
    # DMPO (authors' yaml): buffer reuse F = 8, grad clip 0.2, AdamW (0.9, 0.99), weight decay 0.1.
    "dmpo": {"num_iterations": 8, "max_grad_norm": 0.2, "adam_beta2": 0.99, "weight_decay": 0.1},
    # GSPO (Zheng et al. 2025): sequence-level ratio clipped to (1 - 3e-4, 1 + 4e-4), no KL.
    "gspo": {"epsilon": 3e-4, "epsilon_high": 4e-4, "scale_rewards": "group", "beta": 0.0},
}
"""Settings a method implies; applied to every field not set explicitly in the YAML file or on the command line."""


def field_docs() -> dict[str, str]:
    """The docstring of every field, read from this module's source (attribute docstrings)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(TrainConfig)))
    cls = tree.body[0]
    docs: dict[str, str] = {}
    body = cls.body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _public_fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")}


def _coerce(name: str, value: Any) -> Any:
    """Convert a YAML / command-line value to the field's annotated type, or raise ConfigError."""
    hints = typing.get_type_hints(TrainConfig)
    tp = hints[name]
    allowed = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and type(None) in allowed):
        if type(None) in allowed:
            return None
        raise ConfigError(f"{name}: None is not allowed (expected {_type_name(tp)})")
    last_err = None
    for t in [a for a in allowed if a is not type(None)]:
        try:
            return _coerce_one(t, value)
        except (TypeError, ValueError) as e:
            last_err = e
    raise ConfigError(f"{name}={value!r}: expected {_type_name(tp)} ({last_err})")


def _coerce_one(t: Any, value: Any) -> Any:
    origin = typing.get_origin(t)
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ValueError("not a boolean")
    if t is int:
        if isinstance(value, bool):
            raise ValueError("not an integer")
        if isinstance(value, str):
            value = float(value) if any(c in value for c in ".eE") else int(value)
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError("not an integer")
            return int(value)
        return int(value)
    if t is float:
        if isinstance(value, bool):
            raise ValueError("not a number")
        return float(value)
    if t is str:
        if isinstance(value, (dict, list)):
            raise ValueError("not a string")
        return str(value)
    if origin is list:
        (inner,) = typing.get_args(t) or (str,)
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v.strip()]
            value = parsed
        if not isinstance(value, (list, tuple)):
            raise ValueError("not a list")
        return [_coerce_one(inner, v) for v in value]
    if origin is dict or t is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ValueError("not a mapping")
        return dict(value)
    raise TypeError(f"unsupported type {t}")


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value")
    key, raw = item.split("=", 1)
    key = key.strip().replace("-", "_")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _unknown_key_error(key: str) -> ConfigError:
    from mmrl.config.aliases import alias_names

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

    fields_ = _public_fields()
    kwargs: dict[str, Any] = {}
    for key, value in translate(values).items():  # TRL's spellings (resume_from_checkpoint, bf16, ...) first
        key = key.replace("-", "_")
        if key not in fields_:
            raise _unknown_key_error(key)
        kwargs[key] = _coerce(key, value)
    cfg = TrainConfig(**kwargs, _explicit=frozenset(kwargs))  # method defaults fill the rest (TrainConfig.__init__)
    return cfg.validate() if validate else cfg


def _with_method_defaults(init):
    """Wrap the dataclass `__init__` so that `TrainConfig(method="dapo")` from Python gets the method's defaults
    exactly as `load_config` does: every field of METHOD_DEFAULTS[method] not passed explicitly takes the method's
    value. The names passed are recorded in `_explicit` (`dataclasses.replace` passes them on)."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if not kwargs.get("_explicit"):
            kwargs["_explicit"] = frozenset((set(names[: len(args)]) | set(kwargs)) - {"_explicit"})
        init(self, *args, **kwargs)
        for key, value in METHOD_DEFAULTS.get(self.method, {}).items():
            if key not in self._explicit:
                setattr(self, key, copy.deepcopy(value))

    return __init__


TrainConfig.__init__ = _with_method_defaults(TrainConfig.__init__)


def _one_of(errors: list[str], cfg: TrainConfig, name: str, allowed: typing.Iterable[str]) -> None:
    value = getattr(cfg, name)
    allowed = list(allowed)
    if value not in allowed:
        errors.append(f"{name}={value!r} is not allowed; choose one of {allowed}")


def _validate(cfg: TrainConfig) -> list[str]:
    from mmrl.algorithms import AGGREGATIONS, GCPO_DIVERGENCES, LOSS_TYPES  # light imports only

    e: list[str] = []
    from mmrl.methods import METHODS  # the registry is the one list of method names

    _one_of(e, cfg, "method", METHODS)
    if cfg.method in METHODS:
        e.extend(METHODS[cfg.method].config_errors(cfg))  # what the method itself refuses
    from mmrl.models import FAMILIES  # the adapter table is the one list of families

    _one_of(e, cfg, "family", FAMILIES)
    _one_of(e, cfg, "torch_dtype", ["float32", "bfloat16", "float16"])
    _one_of(e, cfg, "mixed_precision", ["no", "bf16", "fp16"])
    _one_of(e, cfg, "on_reward_error", ["raise", "drop"])
    e.extend(_nonfinite_floats(cfg))
    _one_of(e, cfg, "loss_type", list(LOSS_TYPES) + list(AGGREGATIONS))
    _one_of(e, cfg, "scale_rewards", ["group", "batch", "none"])
    _one_of(e, cfg, "score_logits", ["conditional", "guided"])
    _one_of(e, cfg, "logprob_estimator", ["mean_field", "elbo", "per_step"])
    if cfg.logprob_estimator == "per_step" and cfg.family != "masked_image":
        e.append(f"logprob_estimator='per_step' (the MaskGIT sampler's recorded reveal steps) needs family='masked_image', "
                 f"got family={cfg.family!r}")
    _one_of(e, cfg, "gcpo_divergence", list(GCPO_DIVERGENCES) + ["full_kl"])
    _one_of(e, cfg, "gcpo_normalization", ["rank_power", "cdf"])
    _one_of(e, cfg, "dgpo_policy", ["old", "current"])
    _one_of(e, cfg, "dmpo_loss", ["wdce", "wddo"])
    _one_of(e, cfg, "dmpo_baseline", ["none", "group", "individual", "model", "micro_batch_mean"])
    _one_of(e, cfg, "dmpo_target", ["reference", "behaviour"])
    if cfg.sampler is not None:
        from mmrl.models.masked_diffusion import SAMPLERS  # the adapter's list (imported only when a sampler is set)

        _one_of(e, cfg, "sampler", SAMPLERS)
    if cfg.diffusion_cache is not None:
        _one_of(e, cfg, "diffusion_cache", ["prefix", "dual"])
    e.extend(_unknown_generation_options(cfg))
    if cfg.num_generations < 2:
        e.append(f"num_generations={cfg.num_generations}: a group needs at least 2 responses (group-relative advantages); use >= 2")
    if cfg.num_train_epochs is not None and not cfg.num_train_epochs > 0:
        e.append(f"num_train_epochs={cfg.num_train_epochs} must be > 0 (or null)")
    if cfg.max_steps == -1 and cfg.num_train_epochs is None:
        e.append("max_steps=-1 needs num_train_epochs (TRL: the step count then comes from the epochs)")
    if not (cfg.eval_split == 0 or 0 < cfg.eval_split < 1 or (cfg.eval_split >= 1 and float(cfg.eval_split).is_integer())):
        e.append(f"eval_split={cfg.eval_split} must be 0 (no hold-out), a fraction in (0, 1) or a whole number of rows")
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations", "max_completion_length",
                 "logging_steps", "dmpo_num_copies", "dmpo_elbo_copies", "max_nonfinite_steps", "dynamic_sampling_max_tries", "block_length"):
        if getattr(cfg, name) < 1:
            e.append(f"{name}={getattr(cfg, name)} must be >= 1")
    if cfg.max_steps < 1 and not (cfg.max_steps == -1 and cfg.num_train_epochs is not None):
        e.append(f"max_steps={cfg.max_steps} must be >= 1 (or -1 with num_train_epochs)")
    if cfg.num_generations >= 2 and cfg.rollout_batch_size % cfg.num_generations:
        e.append(
            f"per_device_train_batch_size x gradient_accumulation_steps = {cfg.rollout_batch_size} responses is not a multiple of "
            f"num_generations={cfg.num_generations}: a rollout batch must hold whole groups"
        )
    if not cfg.learning_rate > 0:
        e.append(f"learning_rate={cfg.learning_rate} must be > 0")
    if cfg.family != "masked_diffusion" and not cfg.temperature > 0:
        e.append(f"temperature={cfg.temperature} must be > 0 for the {cfg.family} family (sampling needs a positive temperature)")
    if cfg.family == "masked_diffusion" and cfg.temperature < 0:
        e.append(f"temperature={cfg.temperature} must be >= 0 (0 = greedy) for masked diffusion")
    if cfg.family == "masked_diffusion" and cfg.temperature == 0:
        sampler = cfg.sampler or cfg.generation_kwargs.get("sampler") or "low_confidence"
        if sampler not in STOCHASTIC_AT_ZERO_TEMPERATURE:
            e.append(f"temperature=0 with the {sampler!r} sampler is greedy and deterministic: the num_generations "
                     f"responses of a prompt would be identical (all advantages 0); use temperature > 0, or a sampler "
                     f"that stays random at temperature 0: {list(STOCHASTIC_AT_ZERO_TEMPERATURE)}")
    if not 0 < cfg.top_p <= 1:
        e.append(f"top_p={cfg.top_p} must be in (0, 1]")
    if cfg.top_k < 0:
        e.append(f"top_k={cfg.top_k} must be >= 0 (0 = off)")
    if cfg.beta < 0:
        e.append(f"beta={cfg.beta} must be >= 0")
    if cfg.epsilon < 0 or cfg.eps_high < 0:
        e.append(f"epsilon={cfg.epsilon}, epsilon_high={cfg.epsilon_high} must be >= 0")
    if cfg.dual_clip is not None and cfg.dual_clip <= 1:
        e.append(f"dual_clip={cfg.dual_clip} must be > 1 (or null to disable)")
    if cfg.max_grad_norm < 0:
        e.append(f"max_grad_norm={cfg.max_grad_norm} must be >= 0 (0 disables clipping)")
    if not 0 <= cfg.warmup_ratio < 1:
        e.append(f"warmup_ratio={cfg.warmup_ratio} must be in [0, 1)")
    if cfg.weight_decay < 0:
        e.append(f"weight_decay={cfg.weight_decay} must be >= 0")
    if not 0 <= cfg.p_mask_prompt < 1:
        e.append(f"p_mask_prompt={cfg.p_mask_prompt} must be in [0, 1)")
    if cfg.family == "masked_diffusion" and cfg.max_completion_length >= 1 and cfg.block_length >= 1:
        if cfg.max_completion_length % cfg.block_length:
            e.append(f"block_length={cfg.block_length} does not divide max_completion_length={cfg.max_completion_length}; "
                     f"choose a divisor of {cfg.max_completion_length}")
        elif cfg.diffusion_steps is not None:
            blocks = cfg.max_completion_length // cfg.block_length
            if cfg.diffusion_steps < 1 or cfg.diffusion_steps % blocks:
                e.append(f"diffusion_steps={cfg.diffusion_steps} must be a positive multiple of the number of blocks "
                         f"({blocks} = max_completion_length / block_length)")
        if not 0 < cfg.threshold <= 1:
            e.append(f"threshold={cfg.threshold} must be in (0, 1]")
    if cfg.dmpo_num_copies % 2 or cfg.dmpo_elbo_copies % 2:
        e.append(f"dmpo_num_copies={cfg.dmpo_num_copies} and dmpo_elbo_copies={cfg.dmpo_elbo_copies} must be even (antithetic pairs)")
    if cfg.dmpo_baseline == "model" and cfg.num_generations >= 2 and cfg.per_device_train_batch_size % cfg.num_generations:
        e.append(f"dmpo_baseline='model' normalises within groups at loss time: per_device_train_batch_size="
                 f"{cfg.per_device_train_batch_size} must be a multiple of num_generations={cfg.num_generations}")
    if not cfg.dmpo_alpha > 0:
        e.append(f"dmpo_alpha={cfg.dmpo_alpha} must be > 0")
    if not 0 <= cfg.dmpo_negative_scale <= 1:
        e.append(f"dmpo_negative_scale={cfg.dmpo_negative_scale} must be in [0, 1]")
    if not 0 < cfg.dmpo_coeff <= 1:
        e.append(f"dmpo_coeff={cfg.dmpo_coeff} must be in (0, 1]")
    if not 0 <= cfg.dmpo_min_mask_rate <= 1:
        e.append(f"dmpo_min_mask_rate={cfg.dmpo_min_mask_rate} must be in [0, 1]")
    if not 0 < cfg.gcpo_top_fraction < 1 or not cfg.gcpo_top_fraction <= cfg.gcpo_target_mass < 1:
        e.append(f"gcpo_top_fraction={cfg.gcpo_top_fraction}, gcpo_target_mass={cfg.gcpo_target_mass}: need 0 < top_fraction <= target_mass < 1")
    if cfg.gcpo_entropy_reward < 0:
        e.append(f"gcpo_entropy_reward={cfg.gcpo_entropy_reward} must be >= 0 (0 = off; GCPO's T2I launch uses 0.4)")
    if not cfg.dgpo_tau > 0:
        e.append(f"dgpo_tau={cfg.dgpo_tau} must be > 0")
    if cfg.reward_weights is not None and cfg.reward_funcs and len(cfg.reward_weights) != len(cfg.reward_funcs):
        e.append(f"reward_weights has {len(cfg.reward_weights)} entries but reward_funcs has {len(cfg.reward_funcs)}")
    from mmrl.reporting.trackers import TRACKER_NAMES

    sinks = ["jsonl", *TRACKER_NAMES, "none"]
    bad_sinks = [s for s in cfg.report_to if s not in sinks]
    if bad_sinks:
        e.append(f"report_to={cfg.report_to}: unknown sinks {bad_sinks}; choose from {sinks}")
    if cfg.eval_steps < 0:
        e.append(f"eval_steps={cfg.eval_steps} must be >= 0 (0 = off)")
    if cfg.save_steps < 0 or cfg.save_total_limit < 1 or cfg.credit_steps < 0:
        e.append(f"save_steps={cfg.save_steps} (>= 0), save_total_limit={cfg.save_total_limit} (>= 1), credit_steps={cfg.credit_steps} (>= 0)")
    if not str(cfg.output_dir).strip():
        e.append("output_dir must not be empty")
    e.extend(_validate_reliability(cfg))
    if cfg.reward_funcs:
        try:
            from mmrl.rewards import REWARDS

            from mmrl.rewards.imports import RewardImportError, import_reward, is_import_path

            unknown = [r for r in cfg.reward_funcs if r not in REWARDS and not is_import_path(r)]
            if unknown:
                e.append(f"reward_funcs: unknown rewards {unknown}; valid: {sorted(REWARDS)}, or an import path "
                         "(package.module.function or path/to/file.py:function)")
            for r in cfg.reward_funcs:
                if r not in REWARDS and is_import_path(r):
                    try:
                        import_reward(r)
                    except RewardImportError as err:
                        e.append(f"reward_funcs: {err}")
        except ImportError:  # pragma: no cover - the rewards package is part of mmrl
            pass
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


STOCHASTIC_AT_ZERO_TEMPERATURE = ("random", "random_order")
"""Masked-diffusion samplers whose unmasking order is random, so that greedy tokens still give different responses."""

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
    return e


def _validate_reliability(cfg: TrainConfig) -> list[str]:
    """Reward failure handling, optimizer and LoRA ranges, paths."""
    e: list[str] = []
    e.extend(_beyond_machine_limits(cfg))
    if cfg.ddp_timeout < 1:
        e.append(f"ddp_timeout={cfg.ddp_timeout} must be >= 1 second")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or not 0 <= cfg.seed <= MAX_SEED:
        e.append(f"seed={cfg.seed!r} must be an integer in [0, 2**63 - 1] (torch generators take 64-bit seeds)")
    if cfg.reward_timeout is not None and not cfg.reward_timeout > 0:
        e.append(f"reward_timeout={cfg.reward_timeout} must be > 0 seconds (or null for no limit)")
    if cfg.reward_retries < 0:
        e.append(f"reward_retries={cfg.reward_retries} must be >= 0")
    if cfg.reward_retry_backoff < 0:
        e.append(f"reward_retry_backoff={cfg.reward_retry_backoff} must be >= 0 seconds")
    bad_cfg = {k: type(v).__name__ for k, v in cfg.reward_kwargs.items() if not isinstance(v, dict)}
    if bad_cfg:
        e.append(f"reward_kwargs: the configuration of each reward is a mapping of options, got {bad_cfg}")
    if cfg.reward_funcs:
        from mmrl.rewards.imports import reward_name

        stray = sorted(set(cfg.reward_kwargs) - set(cfg.reward_funcs) - {reward_name(r) for r in cfg.reward_funcs})
        if stray:
            e.append(f"reward_kwargs configures {stray}, which are not in reward_funcs={cfg.reward_funcs}")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            e.append(f"{name}={getattr(cfg, name)} must be in [0, 1)")
    if not cfg.adam_epsilon > 0:
        e.append(f"adam_epsilon={cfg.adam_epsilon} must be > 0")
    if cfg.lora_r < 1 or cfg.lora_alpha <= 0 or not 0 <= cfg.lora_dropout < 1:
        e.append(f"lora_r={cfg.lora_r} (>= 1), lora_alpha={cfg.lora_alpha} (> 0), lora_dropout={cfg.lora_dropout} (in [0, 1))")
    for name in ("max_prompt_length", "eval_limit"):
        if getattr(cfg, name) is not None and getattr(cfg, name) < 1:
            e.append(f"{name}={getattr(cfg, name)} must be >= 1 (or null)")
    if cfg.overlong_buffer_len is not None and not 1 <= cfg.overlong_buffer_len <= cfg.max_completion_length:
        e.append(f"overlong_buffer_len={cfg.overlong_buffer_len} must be in [1, max_completion_length="
                 f"{cfg.max_completion_length}] (or null)")
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
