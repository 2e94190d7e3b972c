"""How to call a masked-diffusion backbone: forward arguments per family, Dream's logit shift, the prefix cache.

Three kinds of backbones:

- `"native"`: a transformers decoder class (Llama, Qwen2, ...) with `config.is_causal = False`, which makes
  transformers build a bidirectional attention mask for both the `sdpa` and `eager` backends (checked in
  transformers 5.24, docs/sources.md, "CPU measurements behind defaults"). Takes a 2-D padding mask, position ids,
  `logits_to_keep` and a `DynamicCache`, so it gets the LM head on the needed positions only and Fast-dLLM's
  prefix cache.
- `"llada"`: LLaDA's remote code (`LLaDAModelLM`): `model(input_ids, attention_mask=...)`, logits aligned with
  the input (no shift), no position ids (its 2025-10 code accepts a padding mask), no cache in the stock code.
- `"dream"`: Dream's remote code (`DreamModel`): `model(x, attention_mask, tok_idx)` with a 4-D boolean mask
  (or `"full"` without padding) and position ids `tok_idx`, exactly as Dream's `generation_utils.py` calls it;
  logits shifted right by one (the output at position i-1 predicts token i).
"""
from __future__ import annotations

import contextlib
import inspect

import torch

from mmrl.models.base import is_peft_model, unwrap
from mmrl.models.cpu_linear import packed_linears
from mmrl.models.dllm_samplers import suppress_tokens

BACKBONES = ("native", "llada", "dream")


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The innermost model under DDP and peft wrappers (for capability checks only)."""
    m = unwrap(model)
    if is_peft_model(m):
        m = m.get_base_model()
    return m


def backbone_kind(model: torch.nn.Module) -> str:
    """"llada", "dream" or "native" from the config's `model_type` and the model class' module."""
    m = base_model(model)
    model_type = str(getattr(getattr(m, "config", None), "model_type", "")).lower()
    if model_type.startswith("llada"):
        return "llada"
    if model_type == "dream":
        return "dream"
    if type(m).__module__.startswith("transformers."):
        return "native"
    raise ValueError(
        f"unknown masked-diffusion backbone {type(m).__name__} (model_type={model_type!r}); supported: LLaDA "
        "(model_type 'llada'), Dream (model_type 'Dream'), or a transformers-native decoder class (e.g. Llama, "
        "Qwen2) with config.is_causal = False"
    )


def align_shifted(raw: torch.Tensor, starts_at_zero: bool) -> torch.Tensor:
    """Dream's right shift: aligned[:, i] = raw[:, i-1] (position 0 keeps raw[:, 0], it is never predicted).

    Dream `generation_utils.py`: `logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)`. For a window that
    does not start at position 0, `raw` holds positions start-1 .. L-1 and the aligned window is `raw[:, :-1]`.
    """
    if starts_at_zero:
        return torch.cat([raw[:, :1], raw[:, :-1]], dim=1)  # [B, L, V]
    return raw[:, :-1]  # [B, L - start, V]


def _cache_argument(model: torch.nn.Module) -> str | None:
    """Name of the KV-cache argument of a native model's forward (`cache` in transformers >= 5.2x, else
    `past_key_values`), or None."""
    params = inspect.signature(base_model(model).forward).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


class BackboneLogits:
    """The `logits_fn` of `models.dllm_samplers` over one backbone and one batch layout (fixed padding mask).

    Call it as `logits_fn(x) -> [B, L, V]` or `window(x, start) -> [B, L - start, V]`; logits are aligned (position
    i predicts token i) whatever the backbone. `prefill` / `suffix` implement Fast-dLLM's prefix cache for native
    backbones (`supports_cache`). `nfe` counts forward passes and `tokens_fed` the positions fed through them.

    Args:
        model: the module to call (possibly DDP / peft wrapped).
        attention_mask: [B, L] bool, False on left padding; None when no row is padded.
        kind: one of `BACKBONES`.
        shift: Dream-style right-shifted logits.
        suppress_ids: token ids whose logits are set to `SUPPRESSED_LOGIT` (the mask token: the policy's
            distribution is over real tokens, the same in sampling and scoring).
        attend: [B, L, L] bool, query i may attend to key j (native backbones, full forwards without a cache): a
            custom attention pattern in place of the bidirectional one, e.g. the annealed causal-to-full masks of
            `mmrl.tiny_world.pretrain.annealed_attention`; left-padding keys stay hidden, and every query attends
            to itself (a fully hidden row would give NaN values that the masked keys would still carry).
        fast_linears: run the forwards under `models.cpu_linear.packed_linears` (oneDNN products on the CPU, with
            and without the gradient; same values up to float rounding): the adapter's scoring forwards ask for it.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        attention_mask: torch.Tensor | None,
        *,
        kind: str,
        shift: bool,
        suppress_ids: tuple[int, ...] = (),
        attend: torch.Tensor | None = None,
        fast_linears: bool = False,
    ):
        if kind not in BACKBONES:
            raise ValueError(f"unknown backbone kind {kind!r}; valid: {list(BACKBONES)}")
        if attend is not None and kind != "native":
            raise ValueError(f"attend (a custom attention pattern) needs a native backbone, got kind {kind!r}")
        if attend is not None and (attend.dim() != 3 or attend.shape[1] != attend.shape[2]):
            raise ValueError(f"attend must be [B, L, L], got shape {tuple(attend.shape)}")
        self.model = model
        self.kind = kind
        self.fast_linears = bool(fast_linears)
        self.shift = bool(shift)
        self.suppress_ids = tuple(int(i) for i in suppress_ids)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # no padding: let the attention run without a mask
        self.attention_mask = attention_mask
        self.position_ids = None
        if attention_mask is not None:
            self.position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, L]
        self.attend_bias = None if attend is None else self._attend_bias(attend, attention_mask, model)  # [B, 1, L, L]
        self.cache_arg = _cache_argument(model) if kind == "native" else None
        self.supports_cache = self.cache_arg is not None
        self.cache = None
        self._cache_len = 0
        self.nfe = 0
        self.tokens_fed = 0

    @staticmethod
    def _attend_bias(attend: torch.Tensor, attention_mask: torch.Tensor | None, model: torch.nn.Module) -> torch.Tensor:
        """The additive 4-D mask [B, 1, L, L] (0 where allowed, the dtype's minimum elsewhere) of a pattern [B, L, L];
        transformers passes a 4-D mask through unchanged (`masking_utils`) to both the sdpa and eager backends."""
        allowed = attend.bool()
        if attention_mask is not None:
            allowed = allowed & attention_mask.bool()[:, None, :]  # padding keys hidden
        allowed = allowed | torch.eye(attend.shape[-1], dtype=torch.bool, device=attend.device)  # [B, L, L]
        dtype = next(base_model(model).parameters()).dtype
        bias = torch.zeros(allowed.shape, dtype=dtype, device=attend.device).masked_fill(~allowed, torch.finfo(dtype).min)
        return bias[:, None]  # [B, 1, L, L]

    # ----------------------------------------------------------------------------------------- forward
    def _kwargs(self, start: int, end: int, keep: int | None, device) -> dict:
        """Forward keyword arguments for the inputs x[:, start:end] (start > 0 only with a cache)."""
        am, pos = self.attention_mask, self.position_ids
        if self.kind == "native":
            kw = {}
            if self.attend_bias is not None:
                if start > 0 or self.cache is not None:
                    raise RuntimeError("a custom attention pattern (attend) supports full forwards only, not the prefix cache")
                kw["attention_mask"] = self.attend_bias
                if pos is not None:
                    kw["position_ids"] = pos
            elif am is not None:
                kw["attention_mask"] = am.long()  # [B, L]: the cache spans the whole sequence
                kw["position_ids"] = pos[:, start:end]
            elif start > 0:
                kw["position_ids"] = torch.arange(start, end, device=device)[None]
            if keep is not None:
                kw["logits_to_keep"] = keep
            return kw
        if self.kind == "llada":
            return {} if am is None else {"attention_mask": am.long()}
        # dream: 4-D boolean mask and tok_idx positions as in Dream's own sampler
        if am is None:
            return {"attention_mask": "full", "position_ids": None}
        full = am[:, None, None, :] & am[:, None, :, None]  # [B, 1, L, L]
        tok_idx = pos.masked_fill(~am, 1)  # [B, L]
        return {"attention_mask": full, "position_ids": tok_idx}

    def _forward(
        self, x: torch.Tensor, start: int, keep: int | None, use_cache: bool = False, end: int | None = None
    ) -> torch.Tensor:
        """Raw logits of the inputs x[:, start:end] (the last `keep` of them when given)."""
        end = x.shape[1] if end is None else end
        kw = self._kwargs(start, end, keep, x.device)
        if use_cache:
            kw[self.cache_arg] = self.cache
            kw["use_cache"] = True
        fast = packed_linears(self.model, x.shape[0] * (end - start), grad=True, pack=False) if self.fast_linears else contextlib.nullcontext()
        with fast:
            out = self.model(input_ids=x[:, start:end], **kw)
        self.nfe += 1
        self.tokens_fed += x.shape[0] * (end - start)
        return out.logits

    def _raw_start(self, start: int) -> int:
        return max(start - int(self.shift), 0)

    def _aligned(self, raw: torch.Tensor, length: int, raw_start: int, start: int) -> torch.Tensor:
        """Cut raw logits of positions raw_start.. to the aligned window of positions start..L-1."""
        raw = raw[:, raw.shape[1] - (length - raw_start):]  # [B, L - raw_start, V]
        out = align_shifted(raw, starts_at_zero=start == 0) if self.shift else raw
        return suppress_tokens(out, self.suppress_ids)

    def _kept_positions(self, start: int, end: int, fed_from: int, device) -> torch.Tensor:
        """[end - start] indices, among the positions fed from `fed_from` on, of the raw logits that predict the
        aligned positions start .. end-1 (i - 1 with Dream's shift, position 0 predicting itself): `logits_to_keep`
        as a 1-D tensor, so the LM head runs on those positions only and the logits come out aligned."""
        return (torch.arange(start, end, device=device) - int(self.shift)).clamp(min=0) - fed_from

    def window(self, x: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
        """[B, end - start, V] aligned logits of positions start .. end-1 (end: L when None), one full forward; the LM
        head runs on those positions only on native backbones."""
        length = x.shape[1]
        if end is not None and end < length and self.kind == "native":
            raw = self._forward(x, 0, self._kept_positions(start, end, 0, x.device))  # [B, end - start, V]
            return suppress_tokens(raw, self.suppress_ids)
        raw_start = self._raw_start(start)
        keep = length - raw_start if self.kind == "native" else None
        out = self._aligned(self._forward(x, 0, keep), length, raw_start, start)
        return out if end is None else out[:, : end - start]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.window(x, 0)

    # ----------------------------------------------------------------------------------------- selected positions
    def output_head(self) -> torch.nn.Linear | None:
        """The plain linear LM head of a native backbone (for `selected_logprob`), else None."""
        if self.kind != "native":
            return None
        from mmrl.models.head_logprob import plain_linear_head

        get = getattr(base_model(self.model), "get_output_embeddings", None)
        return plain_linear_head(get()) if callable(get) else None

    def selected_logprob(self, x: torch.Tensor, start: int, select: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[M] log-probs of `targets` at the positions `select` of the window >= start (row-major order), with the
        LM head run on those M positions only (`models.head_logprob`): the same numbers as
        `selective_log_softmax(window(x, start)[select], targets[select])`, without the [B, L - start, V] logits.

        Args:
            x: [B, L] input ids; start: first position of the window.
            select: [B, L - start] bool, the positions to score; targets: [B, L - start] the ids to score there.
        Needs `output_head()` (a native backbone with a plain linear head).
        """
        from mmrl.models.head_logprob import head_logprob

        head = self.output_head()
        if head is None:
            raise RuntimeError(f"selected_logprob needs a native backbone with a plain linear LM head ({self.kind})")
        length = x.shape[1]
        raw_start = self._raw_start(start)
        captured: list[torch.Tensor] = []

        def take_hidden(module, args):
            captured.append(args[0])  # [B, L - raw_start, H], after the final norm
            return (args[0][:, :0],)  # the head itself computes nothing

        handle = head.register_forward_pre_hook(take_hidden)
        try:
            self._forward(x, 0, length - raw_start)
        finally:
            handle.remove()
        hidden = captured[0]
        if self.shift:  # aligned position i is predicted by raw position i - 1 (Dream)
            hidden = align_shifted(hidden, starts_at_zero=start == 0)  # [B, L - start, H]
        sel = select.bool()
        return head_logprob(hidden[sel], head, targets[sel], self.suppress_ids)  # [M]

    # ----------------------------------------------------------------------------------------- prefix cache
    @property
    def supports_dual_cache(self) -> bool:
        """Dual cache needs a preallocated (static) cache: positions after the block keep their prefill keys/values."""
        from transformers import StaticCache

        if not self.supports_cache:
            return False
        return self.cache is None or isinstance(self.cache, StaticCache)

    def _fresh_cache(self, length: int):
        """A cache for `length` positions: a `StaticCache` (preallocated; a suffix step overwrites its positions in
        place, so the prefix keys/values are never copied), else a `DynamicCache`."""
        from transformers import DynamicCache

        cfg = getattr(base_model(self.model), "config", None)
        try:
            from transformers import StaticCache

            return StaticCache(config=cfg, max_cache_len=length)
        except Exception:  # older transformers or an architecture without static-cache support
            try:
                return DynamicCache(config=cfg)
            except TypeError:
                return DynamicCache()

    def _crop_to(self, n: int) -> None:
        have = int(self.cache.get_seq_length())
        if have < n:
            raise RuntimeError(f"the cache holds {have} positions but the prefix needs {n}")
        if have > n:
            self.cache.crop(n - have)  # negative: forget the positions from n on (the next update overwrites them)

    def prefill(self, x: torch.Tensor, start: int, end: int | None = None) -> torch.Tensor:
        """Full forward that keeps every position's keys/values; returns aligned logits of positions start .. end-1
        (end: L when None; the LM head runs on those positions only)."""
        if not self.supports_cache:
            raise RuntimeError(f"the {self.kind} backbone offers no KV cache")
        length = x.shape[1]
        if self.cache is None or self._cache_len != length:
            self.cache, self._cache_len = self._fresh_cache(length), length
        else:
            self._crop_to(0)
        if end is not None and end < length:
            raw = self._forward(x, 0, self._kept_positions(start, end, 0, x.device), use_cache=True)
            return suppress_tokens(raw, self.suppress_ids)  # [B, end - start, V]
        raw_start = self._raw_start(start)
        raw = self._forward(x, 0, length - raw_start, use_cache=True)
        return self._aligned(raw, length, raw_start, start)

    def suffix(self, x: torch.Tensor, start: int, end: int | None = None) -> torch.Tensor:
        """Forward of x[:, start:] (from start-1 with a shift) over the prefix keys/values of the last `prefill`;
        aligned logits of positions start .. end-1 (end: L when None; the LM head on those positions only).

        The cache is cut back to the prefix first, so repeated calls inside a block reuse the same prefix.
        """
        if self.cache is None:
            raise RuntimeError("suffix() needs a prefill() first")
        length = x.shape[1]
        raw_start = self._raw_start(start)
        if raw_start == 0:
            return self.prefill(x, start, end)
        self._crop_to(raw_start)
        if end is not None and end < length:
            raw = self._forward(x, raw_start, self._kept_positions(start, end, raw_start, x.device), use_cache=True)
            return suppress_tokens(raw, self.suppress_ids)  # [B, end - start, V]
        raw = self._forward(x, raw_start, None, use_cache=True)  # [B, L - raw_start, V]
        return self._aligned(raw, length, raw_start, start)

    def block(self, x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Fast-dLLM DualCache: forward of the block x[:, start:end] only (one earlier with a shift), attending to the
        keys/values of every other position as the last `prefill` left them -> aligned logits [B, end - start, V].

        Needs a static cache: its buffer spans the whole sequence, so cutting it back to `start` and writing the
        block leaves the suffix entries of the prefill in place (and attended to).
        """
        from transformers import StaticCache

        if not isinstance(self.cache, StaticCache):
            raise RuntimeError("block() needs a prefill() into a StaticCache first")
        raw_start, raw_end = self._raw_start(start), end - int(self.shift)
        if raw_start == 0 or raw_end <= raw_start:
            return self.prefill(x, start, end)
        self._crop_to(raw_start)
        raw = self._forward(x, raw_start, None, use_cache=True, end=raw_end)  # [B, raw_end - raw_start, V]
        return suppress_tokens(raw, self.suppress_ids)  # raw positions start-shift .. end-shift-1 = aligned start .. end-1
