"""Faster no-grad `nn.Linear` on the CPU: oneDNN matrix products with prepacked weights (issue 29).

On the project's CPUs (AMD EPYC, AVX-512) torch's float32 `F.linear` goes to MKL's sgemm, which for the shapes of
autoregressive decoding (16 rows against a 32k x 512 LM head) runs at about a third of the core's peak; oneDNN's
`mkldnn::_linear_pointwise` with a weight reordered once for the call (`mkldnn::_reorder_linear_weight`, the kernels
torch's inductor uses on the CPU) computes the same `x W^T + b` about 2x faster there and 1.2-1.4x faster for
the large teacher-forced products (measured: 22.8 -> 10.2 ms for [16, 512] x [512, 32000]; values equal to float32
rounding, max |diff| ~1e-6 of values ~10).

`packed_linears(model, rows)` patches every plain float32 CPU `nn.Linear` of `model` for the duration of a
`with` block. Under `torch.no_grad()` each weight is reordered lazily at its first call and the packed copies are
dropped on exit (a second copy of the linear weights lives for the block: the sampler asks for it), or, with
`pack=False`, oneDNN runs on the weights as they are (no extra memory, about as fast for the large products of
teacher-forced scoring, which may run while a gradient graph is alive: DGPO's reference pass, GCPO's negative). With `grad=True`, calls that build a graph go through `OneDNNLinear` (oneDNN forward on the weight as it
is, and oneDNN for the input's gradient `g W`; the weight's gradient `g^T x` stays with MKL, which is faster for that
shape here); otherwise they fall back to `F.linear`. Under CPU autocast, or anywhere oneDNN is unavailable or gives a
different result on a small check, the block changes nothing.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Iterator

import torch

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def onednn_linear_available() -> bool:
    """Whether `mkldnn::_linear_pointwise` with a reordered weight runs here and matches `F.linear` on a small case."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        gen = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(s, generator=gen) for s in ((3, 2, 24), (40, 24), (40,)))
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 6)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        return bool(torch.allclose(got, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5))
    except Exception as err:  # noqa: BLE001 - any failure means: keep torch's own path
        log.debug("oneDNN linear unavailable (%s): keeping F.linear", err)
        return False


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """[..., out] = x [..., in] W^T [in, out] + b through oneDNN (`weight`: [out, in] as it is, or reordered)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDNNLinear(torch.autograd.Function):
    """`F.linear(x, weight, bias)` with oneDNN for the forward and for the input's gradient `g W`, MKL for the
    weight's gradient `g^T x` (same values up to float rounding; the module docstring has the timings)."""

    @staticmethod
    def forward(ctx, x, weight, bias):  # noqa: D401 - autograd signature
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, in]: a 2-D product's output is no view (in-place safe)
        ctx.save_for_backward(x2, weight)
        ctx.has_bias, ctx.lead = bias is not None, x.shape[:-1]
        return _onednn_linear(x2, weight.detach(), None if bias is None else bias.detach())  # [M, out]

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        g2 = grad_out.contiguous()  # [M, out]
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _onednn_linear(g2, weight.detach().t().contiguous(), None).view(*ctx.lead, x2.shape[-1])  # [..., in]
        if ctx.needs_input_grad[1]:
            gw = g2.t() @ x2  # [out, in]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)  # [out]
        return gx, gw, gb


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`OneDNNLinear` on inputs [..., in] -> [..., out] (the 2-D product reshaped outside the autograd function, so
    callers may modify the output in place, as `suppress_tokens` does)."""
    return OneDNNLinear.apply(x, weight, bias).view(*x.shape[:-1], weight.shape[0])


def _eligible(module: torch.nn.Module) -> bool:
    """A plain float32 CPU `nn.Linear` with plain tensor weights, without hooks or an already patched forward."""
    return (type(module) is torch.nn.Linear and type(module.weight.data) is torch.Tensor and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32 and (module.bias is None or type(module.bias.data) is torch.Tensor)
            and not module._forward_hooks and not module._forward_pre_hooks and "forward" not in module.__dict__)


def _packed_forward(module: torch.nn.Linear, rows: int, grad: bool, pack: bool):
    """A forward for `module`: oneDNN on a lazily reordered copy of its weight (`pack`) or on the weight as it is
    when no graph is being built, `OneDNNLinear` when one is and `grad`, else `F.linear`."""
    state: dict[str, torch.Tensor] = {}

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):
            return torch.nn.functional.linear(x, module.weight, module.bias)
        if torch.is_grad_enabled() and (x.requires_grad or module.weight.requires_grad
                                        or (module.bias is not None and module.bias.requires_grad)):
            if grad:
                return onednn_linear(x, module.weight, module.bias)
            return torch.nn.functional.linear(x, module.weight, module.bias)
        if not pack:
            state["w"] = module.weight.detach()
        elif "w" not in state:
            state["w"] = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), max(1, rows))
        bias = module.bias.detach() if module.bias is not None else None
        return _onednn_linear(x.contiguous(), state["w"], bias)

    return forward


@contextlib.contextmanager
def packed_linears(model: torch.nn.Module, rows: int, *, grad: bool = False, pack: bool = True) -> Iterator[int]:
    """Within the block, no-grad calls of `model`'s plain float32 CPU linears use oneDNN, on prepacked weights
    with `pack` (a second copy of the weights for the block: worth it for the many small products of decoding;
    without it, oneDNN on the weights as they are, about as fast for large products and no extra memory, for
    forwards that may run while a graph is alive), and with `grad` the calls that build a graph use `OneDNNLinear`
    (module docstring); `rows` is the expected number of input rows (a packing hint). Yields how many linears were
    patched (0 when oneDNN is unavailable: nothing changes)."""
    patched: list[torch.nn.Module] = []
    if grad and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        grad = False  # a checkpointed layer recomputes its forward after the block: keep the graph F.linear's
    if onednn_linear_available():
        for module in model.modules():
            if _eligible(module):
                module.forward = _packed_forward(module, rows, grad, pack)
                patched.append(module)
    try:
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
