"""Pieces every adapter shares: the reference model, padding helpers, and scoring of logits.

Adapters subclass `BaseAdapter` and implement the protocol of `mmrl.core.protocol.Policy`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch

from mmrl.algorithms.distributions import _softmax_parts, default_chunk_size, token_distribution_stats
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


class _PickedLogSoftmax(torch.autograd.Function):
    """log softmax(x / T)[target] per row of logits x [M, V] (and, on request, the entropy of softmax(x / T),
    without gradient), walking over cache-sized chunks of rows; only the [M] log-sum-exps are saved, and the backward
    writes `(onehot(target) - softmax(x / T)) * grad / T` chunk by chunk straight into the logits' gradient
    (`x / T - lse` computed from the logits into the gradient's rows, or one reused float32 chunk for low-precision
    logits, without a float32 copy of the chunk first).

    The same numbers as `log_softmax(x / T).gather(target)` and its autograd backward up to float rounding; on the
    CPU it saves the passes over the [M, V] logits that the unfused graph makes (logsumexp's max / exp / sum, its
    backward's exp and product, the gather's zero-filled scatter, the sum of the two gradients, the concatenation of
    the chunks'), and the separate entropy pass."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, rows, with_entropy):  # noqa: D401 - autograd signature
        m = logits.shape[0]
        out = torch.empty(m, dtype=torch.float32, device=logits.device)  # [M]
        lse = torch.empty_like(out)  # [M]
        ent = torch.empty_like(out) if with_entropy else None  # [M]
        for s in range(0, m, rows):
            sl = slice(s, min(s + rows, m))
            x = logits[sl].float()  # [c, V]
            if temperature != 1.0:
                x = x / temperature
            mx, z, t, tot = _softmax_parts(x)  # [c, 1], [c, V], [c, V], [c, 1]: torch.logsumexp's steps
            log_tot = tot.log()  # [c, 1]
            lse[sl] = (log_tot + mx).squeeze(-1)
            out[sl] = x.gather(-1, targets[sl, None]).squeeze(-1) - lse[sl]
            if with_entropy:  # H = log(tot) - sum_v p (x - max), p = t / tot
                ent[sl] = log_tot.squeeze(-1) - torch.linalg.vecdot(t.div_(tot), z)
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.rows = temperature, rows
        if not with_entropy:
            ent = torch.empty(0, device=logits.device)
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad_out, grad_ent):
        logits, targets, lse = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        grad = torch.empty_like(logits)  # [M, V]
        g_all = grad_out.float() / temperature  # [M]
        f32 = logits.dtype == torch.float32
        t_div = torch.tensor([temperature], dtype=torch.float32, device=logits.device)  # [1]
        buf = None if f32 else torch.empty((min(rows, logits.shape[0]), logits.shape[1]), dtype=torch.float32,
                                           device=logits.device)  # [c, V] float32 work rows of a low-precision chunk
        for s in range(0, logits.shape[0], rows):
            sl = slice(s, min(s + rows, logits.shape[0]))
            x, g = logits[sl], g_all[sl, None]  # [c, V], [c, 1]
            gx = grad[sl] if f32 else buf[: x.shape[0]]  # work in the gradient's own rows when they are float32
            # x / T - lse written straight into the work rows (the cast to float32 fused in): no copy of the chunk
            if temperature != 1.0:  # a [1] float32 divisor keeps the division float32 for low-precision logits
                torch.div(x, t_div, out=gx).sub_(lse[sl, None])
            else:
                torch.sub(x, lse[sl, None], out=gx)
            gx.exp_().mul_(-g)  # -softmax(x / T) * grad / T
            gx.scatter_add_(-1, targets[sl, None], g)  # + onehot(target) * grad / T
            if not f32:
                grad[sl] = gx
        return grad, None, None, None, None


def _picked_log_softmax(logits: torch.Tensor, index: torch.Tensor, temperature: float, chunk_size: int | None,
                        with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log softmax(logits / T) at `index` [...], entropy [...] or None) of logits [..., V] (`_PickedLogSoftmax`)."""
    v = logits.shape[-1]
    if index.numel() == 0:
        zeros = torch.zeros(index.shape, dtype=torch.float32, device=logits.device)
        return zeros, (zeros.clone() if with_entropy else None)
    flat = logits.reshape(-1, v)  # [M, V]
    rows = chunk_size or default_chunk_size(v, logits.device)
    logp, ent = _PickedLogSoftmax.apply(flat, index.reshape(-1).long(), float(temperature), max(1, int(rows)), with_entropy)
    return logp.reshape(index.shape), (ent.reshape(index.shape) if with_entropy else None)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, *, temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """log softmax(logits / temperature) at `index`: [..., V] x [...] -> [...] float32, with the gradient.

    Works over chunks of rows (`chunk_size`, default `default_chunk_size` for the logits' device), each cast to
    float32 on its own, in one fused autograd function (`_PickedLogSoftmax`: the same values and gradient as
    `log_softmax(logits / T).gather(-1, index)` up to float rounding, with fewer passes over the logits).
    """
    return _picked_log_softmax(logits, index, temperature, chunk_size, False)[0]


def selective_log_softmax_and_entropy(logits: torch.Tensor, index: torch.Tensor, *, temperature: float = 1.0,
                                      chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(`selective_log_softmax(logits, index)` [...] with the gradient, the entropy of softmax(logits / T) [...]
    without it), from one pass over each chunk of the logits."""
    return _picked_log_softmax(logits, index, temperature, chunk_size, True)


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
    if other_logits is None:
        if any(s != "entropy" for s in stats):
            raise ValueError(f"statistics {stats} need the logits of the reference / negative condition")
        if stats:  # the entropy from the log-probs' own pass over the logits
            logp, ent = selective_log_softmax_and_entropy(logits, targets, temperature=temperature)  # [N, T] x2
            st = {"entropy": ent}
        else:
            logp, st = selective_log_softmax(logits, targets, temperature=temperature), {}  # [N, T]
        return TokenScores(logp=torch.where(mask.bool(), logp, torch.zeros_like(logp)), stats=st)
    logp = selective_log_softmax(logits, targets, temperature=temperature)  # [N, T]
    logp = torch.where(mask.bool(), logp, torch.zeros_like(logp))
    with torch.no_grad():
        # the other side's log-probs come from the statistics' own pass over other_logits (bitwise the same as
        # selective_log_softmax: one pass over the [N, T, V] logits fewer)
        st = token_distribution_stats(logits.detach(), other_logits.detach(), stats=stats, temperature=temperature,
                                      other_targets=targets)
        other = st.pop("other_logp")  # [N, T]
        other = torch.where(mask.bool(), other, torch.zeros_like(other))
    return TokenScores(logp=logp, stats=st, other_logp=other)
