"""A KV cache that grows in place for the autoregressive samplers (issue 29).

transformers' `DynamicLayer.update` appends each decoding step's keys and values with `torch.cat`, so step t copies
the whole cache so far (an O(T^2) copy over a rollout) and allocates a fresh buffer every step; on the benchmark's
28M Qwen2 (16 rows x 256 tokens) those copies were a large share of the rollout. `reserve_cache` gives every plain
`DynamicLayer` of a cache room for `extra` more positions once: the prefill's keys and values are copied into
buffers [B, H, L + extra, D] and each later `update` writes its positions into the buffer and hands back the view of
the filled part. Attention reads the same numbers as with concatenation (the view holds the same values), so the
outputs are unchanged; only the copies go.

Layers of other kinds (sliding windows, static, quantized, linear attention) are left as they are.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys / values are views [B, H, length, D] of buffers with spare positions; it grows
    (doubling) only if an update overflows them."""

    def reserve(self, extra: int) -> None:
        """Copy the current keys / values into buffers with room for `extra` more positions."""
        self._buf_k = _with_room(self.keys, extra)  # [B, H, L + extra, D]
        self._buf_v = _with_room(self.values, extra)
        self._length = self.keys.shape[-2]
        self.keys, self.values = self._buf_k[..., : self._length, :], self._buf_v[..., : self._length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        new = key_states.shape[-2]
        end = self._length + new
        if end > self._buf_k.shape[-2]:
            self._buf_k = _with_room(self.keys, max(new, self._buf_k.shape[-2]))
            self._buf_v = _with_room(self.values, max(new, self._buf_v.shape[-2]))
        self._buf_k[..., self._length : end, :] = key_states
        self._buf_v[..., self._length : end, :] = value_states
        self._length = end
        self.keys, self.values = self._buf_k[..., :end, :], self._buf_v[..., :end, :]
        return self.keys, self.values

    def _detach_buffers(self) -> None:
        """Back to the keys / values as owned tensors (for operations that replace them: reorder, select, crop)."""
        self.keys, self.values = self.keys.contiguous(), self.values.contiguous()
        self._buf_k, self._buf_v, self._length = self.keys, self.values, self.keys.shape[-2]

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._detach_buffers()

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._detach_buffers()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._detach_buffers()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._detach_buffers()


def _with_room(x: torch.Tensor, extra: int) -> torch.Tensor:
    """[B, H, L + extra, D]: `x` [B, H, L, D] copied to the front of a new buffer (the rest uninitialised)."""
    shape = list(x.shape)
    shape[-2] += extra
    buf = torch.empty(shape, dtype=x.dtype, device=x.device)
    buf[..., : x.shape[-2], :] = x
    return buf


def reserve_cache(cache, extra: int) -> int:
    """Give every initialised plain `DynamicLayer` of `cache` (a transformers `Cache`) room for `extra` more
    positions (`ReservedLayer`); returns how many layers were converted (0: the cache is used as it is)."""
    if not isinstance(extra, int) or extra < 0:
        raise ValueError(f"extra must be an integer >= 0, got {extra!r}")
    converted = 0
    for layer in getattr(cache, "layers", ()):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layer.__class__ = ReservedLayer
            layer.reserve(extra)
            converted += 1
    return converted
