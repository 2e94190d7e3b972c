"""Pieces every adapter shares: the reference model, padding helpers, and scoring of logits.

Adapters subclass `BaseAdapter` and implement the protocol of `mmrl.core.protocol.Policy`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from mmrl.algorithms.distributions import default_chunk_size, token_distribution_stats
from mmrl.core.protocol import TokenScores


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model under DDP / accelerate wrappers (`.module`), for generation and saving."""
    while hasattr(model, "module") and isinstance(getattr(model, "module"), torch.nn.Module):
        model = model.module
    return model


def is_peft_model(model: torch.nn.Module) -> bool:
    return hasattr(unwrap(model), "disable_adapter") and hasattr(unwrap(model), "peft_config")


class BaseAdapter:
    """State shared by the adapters: the trainable model, the frozen reference, the device.

    The reference model is either a separate frozen module (`ref_model`) or, for a peft (LoRA) model, the same
    model with its adapters disabled (what d1 and DMPO do). `scoring_model(use_reference)` yields the module to
    run; the reference is always run under `no_grad`.
    """

    family: str = "base"
    has_unused_parameters: bool = False
    """Whether some trainable parameters get no gradient in a step (DDP's `find_unused_parameters`)."""
    variable_length: bool = True
    """Whether responses vary in length (length-based reward shaping such as DAPO's overlong penalty applies)."""
    response_unit: str = "tokens"
    """What throughput is counted in: `tokens` (perf/tokens_per_s) or `images` (perf/images_per_s)."""
    records_reveal_steps: bool = False
    """Whether the sampler records each token's reveal step (the `per_step` log-prob estimator needs it)."""
    batches_negative_condition: bool = False
    """Whether the adapter has `logprob_with_negative`: GCPO's positive and negative scorings in one forward."""
    generation_option_names: tuple[str, ...] = ()
    """The `sample()` options the family knows: `generation_kwargs` keys outside it are refused at start-up
    (`TrainConfig.validate`); empty means the family does not say (no check)."""

    @classmethod
    def config_errors(cls, cfg) -> list[str]:
        """One-line errors of `cfg` for this family (`TrainConfig.validate`, before any model loads): sampling needs
        a positive temperature, the per-step estimator needs recorded reveal steps (`masked_image`). Families
        override it for their own rules."""
        e = []
        if cfg.logprob_estimator == "per_step" and not cls.records_reveal_steps:
            e.append(f"logprob_estimator='per_step' (the MaskGIT sampler's recorded reveal steps) needs family='masked_image', "
                     f"got family={cfg.family!r}")
        if not cfg.temperature > 0:
            e.append(f"temperature={cfg.temperature} must be > 0 for the {cfg.family} family (sampling needs a positive temperature)")
        return e

    @classmethod
    def greedy_generation(cls, gen_length: int, block_length: int, steps: int) -> dict[str, Any]:
        """The `sample()` options of greedy evaluation decoding (d1's and DMPO's protocols, `mmrl.training.evaluate`):
        `gen_length` new tokens, masked diffusion's `block_length` and `steps`; none by default (the family's
        sampling defaults)."""
        return {}

    @classmethod
    def tiny(cls, **options):
        """A tiny random model of this family, for tests and `model_name_or_path: tiny`; the factories and their
        options live outside the adapters, in `mmrl.models.tiny_configs`."""
        from mmrl.models import tiny_factory

        return tiny_factory(cls.family)(cls, **options)

    @classmethod
    def generation_options(cls, cfg) -> dict[str, Any]:
        """The `sample()` options this family takes from a `TrainConfig` (before `cfg.generation_kwargs`)."""
        return {}

    @classmethod
    def estimator_options(cls, cfg, mask_seed: int, *, kind: str | None = None) -> dict[str, Any]:
        """The `logprob()` options this family takes from a `TrainConfig` (exact log-probs need none)."""
        return {}

    def __init__(self, model: torch.nn.Module, *, ref_model: torch.nn.Module | None = None):
        self.model = model
        self.ref_model = ref_model
        if ref_model is not None:
            ref_model.requires_grad_(False)
            ref_model.eval()

    @property
    def unwrapped(self) -> torch.nn.Module:
        return unwrap(self.model)

    @property
    def device(self) -> torch.device:
        return next(self.unwrapped.parameters()).device

    @property
    def has_reference(self) -> bool:
        return self.ref_model is not None or is_peft_model(self.model)

    @contextlib.contextmanager
    def scoring_model(self, use_reference: bool = False) -> Iterator[torch.nn.Module]:
        """Yield the module that scores: the policy (as wrapped, so DDP syncs gradients) or the reference."""
        if not use_reference:
            yield self.model
            return
        if self.ref_model is not None:
            with torch.no_grad():
                yield self.ref_model
            return
        if is_peft_model(self.model):
            with torch.no_grad(), unwrap(self.model).disable_adapter():
                yield self.model
            return
        raise ValueError(
            "a reference model is needed (beta > 0, DGPO or DMPO) but none was given: pass ref_model= or use LoRA "
            "(the reference is then the adapter-disabled base model)"
        )


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids [B, L] long, mask [B, L] bool)."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = True
    return ids.to(device), mask.to(device)


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists into (ids [B, L] long, mask [B, L] bool)."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, : len(s)] = True
    return ids.to(device), mask.to(device)


def mask_through_first_eos(ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """[N, T] bool: True up to and including the first EOS of each row (all True if a row has no EOS)."""
    if len(eos_ids) == 0:
        return torch.ones_like(ids, dtype=torch.bool)
    is_eos = torch.isin(ids, torch.as_tensor(list(eos_ids), device=ids.device))  # [N, T]
    after = torch.cumsum(is_eos.int(), dim=-1) - is_eos.int()  # [N, T] EOS seen strictly before
    return after == 0


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, *, temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits / temperature) at `index`: [..., V] x [...] -> [...] float32.

    Works over chunks of rows so that only one chunk at a time is cast to float32 (the gradient still flows).
    """
    v = logits.shape[-1]
    flat = logits.reshape(-1, v)  # [M, V]
    idx = index.reshape(-1)  # [M]
    rows = chunk_size or default_chunk_size(v)
    out = []
    # `split`, not slicing: the backward of a slice allocates a zero-filled gradient of the whole [M, V] input per
    # chunk (5x slower on CPU, mostly page faults); split's backward concatenates the chunk gradients once
    for chunk, chunk_idx in zip(flat.split(rows), idx.split(rows)):
        chunk = chunk.float()  # [c, V]
        if temperature != 1.0:
            chunk = chunk / temperature
        picked = chunk.gather(-1, chunk_idx[:, None]).squeeze(-1)  # [c]
        out.append(picked - torch.logsumexp(chunk, dim=-1))  # [c]
    if not out:
        return torch.zeros(index.shape, dtype=torch.float32, device=logits.device)
    return torch.cat(out).reshape(index.shape)


def score_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    other_logits: torch.Tensor | None = None,
    stats: tuple[str, ...] = (),
) -> TokenScores:
    """Turn response-position logits into `TokenScores`.

    Args:
        logits: [N, T, V] logits that predict `targets` (already aligned: position t predicts targets[:, t]).
        targets: [N, T] the sampled tokens.
        mask: [N, T] valid tokens; log-probs are 0 elsewhere.
        temperature: the sampling temperature (log-probs are of the distribution that was sampled).
        other_logits: [N, T, V] logits of the reference model / negative condition, for `stats` and `other_logp`.
        stats: names from `mmrl.algorithms.STATS`, computed in chunks (on temperature-scaled logits).
    """
    logp = selective_log_softmax(logits, targets, temperature=temperature)  # [N, T]
    logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
    if other_logits is None:
        if any(s != "entropy" for s in stats):
            raise ValueError(f"statistics {stats} need the logits of the reference / negative condition")
        st = token_distribution_stats(logits.detach(), stats=stats, temperature=temperature) if stats else {}
        return TokenScores(logp=logp, stats=st)
    with torch.no_grad():
        # the other side's log-probs come from the statistics' own pass over other_logits (bitwise the same as
        # selective_log_softmax: one pass over the [N, T, V] logits fewer)
        st = token_distribution_stats(logits.detach(), other_logits.detach(), stats=stats, temperature=temperature,
                                      other_targets=targets)
        other = st.pop("other_logp")  # [N, T]
        other = torch.where(mask.bool(), other, torch.zeros_like(other))
    return TokenScores(logp=logp, stats=st, other_logp=other)
