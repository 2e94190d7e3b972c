"""TRL's / transformers' spellings of configuration keys that mmrl names differently, accepted in YAML files and on
the command line (`mmrl train --resume_from_checkpoint auto --bf16`).

    resume_from_checkpoint: X   ->  resume_from: X                (true -> auto, false -> null)
    bf16: true                  ->  mixed_precision: bf16        (bf16: false -> mixed_precision: no)
    fp16: true                  ->  mixed_precision: fp16
    dtype: X                    ->  torch_dtype: X               (transformers 5's name)
    disable_tqdm: X             ->  progress_bar: not X

Giving both spellings of one setting with different values is an error naming both. `UNSUPPORTED` names the other
fields of trl 1.16's `GRPOConfig` and says why mmrl does not take them; such a key is refused with that reason
(README.md, "TRL GRPOConfig fields", is generated from it by scripts/trl_config_table.py).
"""
from __future__ import annotations

from typing import Any

RENAMED = {"resume_from_checkpoint": "resume_from", "dtype": "torch_dtype"}
"""TRL name -> mmrl field, same meaning and values."""

PRECISION_FLAGS = {"bf16": "bf16", "fp16": "fp16"}
"""transformers' boolean precision flags -> the `mixed_precision` value they mean."""


INVERTED = {"disable_tqdm": "progress_bar"}
"""transformers' boolean -> the mmrl boolean of opposite meaning."""

_VLLM = ("vLLM runs in colocate mode only (use_vllm, vllm_mode: colocate, vllm_gpu_memory_utilization, "
         "vllm_max_model_length); server mode, sleep mode, guided decoding and vLLM-side importance sampling are not "
         "implemented")
_DATALOADER = "prompts are drawn by mmrl's own seeded, resumable prompt stream (mmrl.prompt_stream), not a DataLoader"
_DISTRIBUTED = ("distribution is accelerate's: choose DDP / FSDP / DeepSpeed with `accelerate launch --config_file` "
                "(configs/accelerate/)")
_EVAL = ("the periodic evaluation samples and scores the eval rows with its own options (eval_steps, eval_limit, "
         "eval_generation); there is no eval loss or metric to compute")
_HUB = "push_to_hub uploads the final model once at the end (hub_model_id, hub_private_repo); no other Hub strategy"
_NOT_BUILT = "not implemented in mmrl"
_LOGGING = "metrics are written every logging_steps to metrics.jsonl and the report_to trackers"
_SAVING = "checkpoints are written every save_steps (and at the end) with the optimizer, scheduler and rollout buffer"
_KERNELS = "not wired: mmrl's models run transformers' own modules"
_TRACKIO = "trackio runs under the project named by the environment, as the other trackers"

UNSUPPORTED: dict[str, str] = {
    **{k: _VLLM for k in (
        "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_structured_outputs_regex",
        "vllm_server_base_url", "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
        "vllm_tensor_parallel_size",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_cap")},
    **{k: _DATALOADER for k in (
        "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
        "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns",
        "label_names", "train_sampling_strategy", "length_column_name", "shuffle_dataset", "data_seed", "ignore_data_skip",
        "pad_to_multiple_of", "auto_find_batch_size", "average_tokens_across_devices")},
    **{k: _DISTRIBUTED for k in (
        "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend",
        "fsdp", "fsdp_config", "deepspeed", "accelerator_config", "parallelism_config", "local_rank", "use_cpu",
        "ds3_gather_for_generation", "log_on_each_node", "save_on_each_node", "log_level_replica")},
    **{k: _EVAL for k in (
        "per_device_eval_batch_size", "prediction_loss_only", "eval_on_start", "eval_do_concat_batches",
        "eval_use_gather_object", "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics", "eval_delay",
        "bf16_full_eval", "fp16_full_eval", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
        "num_generations_eval", "do_train", "do_eval", "do_predict")},
    **{k: _HUB for k in ("hub_token", "hub_strategy", "hub_always_push", "hub_revision", "log_completions_hub_repo")},
    **{k: _LOGGING for k in ("logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level",
                             "include_num_input_tokens_seen", "num_completions_to_print", "log_unique_prompts",
                             "log_multimodal", "skip_memory_metrics", "debug")},
    **{k: _TRACKIO for k in ("project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id")},
    **{k: _SAVING for k in ("save_strategy", "save_only_model", "enable_jit_checkpoint",
                            "restore_callback_states_from_checkpoint")},
    **{k: _KERNELS for k in ("use_liger_kernel", "liger_kernel_config", "torch_compile", "torch_compile_backend",
                             "torch_compile_mode", "cast_lm_head_to_fp32", "use_transformers_continuous_batching",
                             "transformers_continuous_batching_config", "use_transformers_paged", "cache_implementation",
                             "use_cache", "tf32", "torch_empty_cache_steps")},
    "optim_args": "optim takes the AdamW variants torch ships; their hyper-parameters are adam_beta1/2, adam_epsilon, weight_decay",
    "optim_target_modules": "only for GaLore / APOLLO optimizers, which mmrl does not ship",
    "label_smoothing_factor": "no labels in RL: the loss is the method's policy objective",
    "neftune_noise_alpha": "NEFTune is a supervised fine-tuning trick; RL log-probs must be of the unperturbed model",
    "activation_checkpointing": "use gradient_checkpointing (transformers' gradient_checkpointing_enable, every family)",
    "activation_checkpointing_kwargs": "gradient_checkpointing takes no options here (non-reentrant checkpoints)",
    "gradient_checkpointing_kwargs": "gradient_checkpointing takes no options here (non-reentrant checkpoints)",
    "full_determinism": "runs are deterministic given seed (every random stream is derived from it); no global switch",
    "model_init_kwargs": "its keys are fields here: torch_dtype (or dtype), attn_implementation, trust_remote_code",
    "router_aux_loss_coef": "mixture-of-experts auxiliary losses are not added",
    "disable_dropout": "dropout is always off in rollouts and updates (the policy stays in eval mode)",
    "min_p": "the causal sampler has temperature, top_p and top_k; min_p is not implemented",
    "repetition_penalty": "the causal sampler has temperature, top_p and top_k; a repetition penalty is not implemented",
    "delta": "two-sided clipping (delta) is not implemented; dual_clip is verl's bound for negative advantages",
    "sapo_temperature_neg": "loss_type sapo is not implemented",
    "sapo_temperature_pos": "loss_type sapo is not implemented",
    "vespo_k_pos": "loss_type vespo is not implemented",
    "vespo_lambda_pos": "loss_type vespo is not implemented",
    "vespo_k_neg": "loss_type vespo is not implemented",
    "vespo_lambda_neg": "loss_type vespo is not implemented",
    "importance_sampling_level": "sequence-level ratios are method=gspo (GSPO's own clip range); token level otherwise",
    "multi_objective_aggregation": "rewards are summed with reward_weights, then normalised (TRL's default sum_then_normalize)",
    "entropy_coef": "no entropy bonus in the loss; nll_coef adds a mean NLL term",
    "use_adaptive_entropy": "no entropy bonus in the loss",
    "entropy_coef_min": "no entropy bonus in the loss",
    "entropy_coef_max": "no entropy bonus in the loss",
    "entropy_coef_delta": "no entropy bonus in the loss",
    "entropy_target": "no entropy bonus in the loss",
    "max_tool_calling_iterations": "no tool calling in rollouts",
    "off_policy_mask_threshold": "no off-policy sequence masking (rollouts are the policy's own)",
    "use_bias_correction_kl": "the KL is the k3 estimator on the policy's own samples",
}
"""trl 1.16 `GRPOConfig` fields mmrl does not take, with the reason (shown when one is given)."""

UNSUPPORTED_VALUES: dict[str, dict[str, str]] = {
    "vllm_mode": {"server": "vllm_mode server (a separate vLLM server process) is not implemented; colocate runs vLLM in "
                            "the trainer's process"},
    "loss_type": {"sapo": "loss_type sapo is not implemented",
                  "vespo": "loss_type vespo is not implemented", "luspo": "loss_type luspo is not implemented"},
}
"""Values of accepted TRL fields that mmrl does not implement, with the reason."""


def alias_names() -> list[str]:
    return sorted([*RENAMED, *PRECISION_FLAGS, *INVERTED])


def unsupported_reason(key: str) -> str | None:
    """Why a TRL field is not taken, or None if `key` is no such field."""
    return UNSUPPORTED.get(key.replace("-", "_"))


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
        return value.lower() in ("true", "yes", "1", "on")
    from mmrl.config.errors import ConfigError

    raise ConfigError(f"{key}={value!r}: expected true or false")


def translate(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with TRL spellings replaced by mmrl's field names (other keys untouched)."""
    from mmrl.config.errors import ConfigError

    out: dict[str, Any] = {}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key in RENAMED:
            key_to, value_to = RENAMED[key], value
            if key == "resume_from_checkpoint" and (value is True or str(value).lower() == "true"):
                value_to = "auto"  # TRL: True resumes from the latest checkpoint of output_dir
            elif key == "resume_from_checkpoint" and (value is False or str(value).lower() == "false"):
                value_to = None
        elif key in INVERTED:
            key_to, value_to = INVERTED[key], not _as_bool(key, value)
        elif key in PRECISION_FLAGS:
            if not _as_bool(key, value):
                if any(k.replace("-", "_") == "mixed_precision" for k in values) or any(
                        k != key and k in PRECISION_FLAGS and _as_bool(k, v) for k, v in values.items()):
                    continue  # `bf16: false` beside an explicit precision says nothing more
                key_to, value_to = "mixed_precision", "no"
            else:
                key_to, value_to = "mixed_precision", PRECISION_FLAGS[key]
        else:
            key_to, value_to = key, value
        if key_to in out and out[key_to] != value_to:
            raise ConfigError(f"{key}={value!r} contradicts {key_to}={out[key_to]!r}; give the setting once")
        out[key_to] = value_to
    return out
