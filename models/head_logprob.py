"""Log-probs of given tokens at selected positions, straight from the final hidden states (issue 29).

WDCE (DMPO eq. 11) and the ELBO estimator score only the masked positions of each copy (on average about half of the
span), yet a plain forward puts every position through the LM head and keeps the [rows, L, V] logits for the
backward (3 float32 copies of them at the peak: the logits, the log-softmax intermediate, their gradient). Here the
hidden states of the selected positions [M, H] go through the head in chunks of rows, and the backward recomputes
each chunk's logits from the saved hidden states instead of keeping them, so only one chunk of [c, V] logits is ever
alive; the output is the same `log softmax(h W^T + b)[target]` (same values, same gradients, up to float rounding).

The head's logit of each id in `suppress_ids` is set to `SUPPRESSED_LOGIT` first (the mask token: the policy's
distribution is over real tokens), so no gradient reaches its weight row, as with `suppress_tokens` on full logits.
"""
from __future__ import annotations

from typing import Sequence

import torch

from mmrl.algorithms.distributions import default_chunk_size
from mmrl.models.dllm_samplers import SUPPRESSED_LOGIT


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, suppress: list[int]) -> torch.Tensor:
    """[c, V] float32 logits of hidden rows `h` [c, H], with the suppressed ids set to `SUPPRESSED_LOGIT`."""
    logits = torch.nn.functional.linear(h, weight, bias).float()  # [c, V]
    if suppress:
        logits[:, suppress] = SUPPRESSED_LOGIT
    return logits


class _HeadLogprob(torch.autograd.Function):
    """log softmax(h W^T + b)[target] per row, chunked over rows, logits recomputed in the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, suppress, rows):  # noqa: D401 - autograd signature
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # [M]
        lse = torch.empty_like(out)  # [M]
        for s in range(0, hidden.shape[0], rows):
            logits = _chunk_logits(hidden[s:s + rows], weight, bias, suppress)  # [c, V]
            lse[s:s + rows] = torch.logsumexp(logits, dim=-1)
            out[s:s + rows] = logits.gather(-1, targets[s:s + rows, None]).squeeze(-1) - lse[s:s + rows]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.suppress, ctx.rows = suppress, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        suppress, rows = ctx.suppress, ctx.rows
        need_h, need_w, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], rows):
            h = hidden[s:s + rows]  # [c, H]
            g = grad_out[s:s + rows].float()  # [c]
            probs = _chunk_logits(h, weight, bias, suppress).sub_(lse[s:s + rows, None]).exp_()  # [c, V] in place
            # d/dlogits of logit[t] - logsumexp = onehot(t) - softmax; constant (suppressed) logits get none
            grad_logits = probs.mul_(-g[:, None])
            grad_logits.scatter_add_(1, targets[s:s + rows, None], g[:, None])
            if suppress:
                grad_logits[:, suppress] = 0.0
            gl = grad_logits.to(weight.dtype)
            if need_h:
                grad_h[s:s + rows] = gl @ weight  # [c, H]
            if need_w:
                grad_w.addmm_(grad_logits.t(), h.float())  # [V, H]
            if need_b:
                grad_b += grad_logits.sum(0)
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None)


def head_logprob(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, suppress_ids: Sequence[int] = (),
                 rows_per_chunk: int | None = None) -> torch.Tensor:
    """[M] float32 `log softmax(head(hidden))[targets]` of hidden rows [M, H] and target ids [M] (see the module
    docstring); `rows_per_chunk` defaults to `default_chunk_size` (about 16 MiB of float32 logits per chunk)."""
    rows = rows_per_chunk or default_chunk_size(head.weight.shape[0])
    return _HeadLogprob.apply(hidden, head.weight, head.bias, targets.long(), [int(i) for i in suppress_ids], max(1, rows))


def plain_linear_head(module: torch.nn.Module) -> torch.nn.Linear | None:
    """The module if it is a plain `torch.nn.Linear` LM head (not wrapped by peft, no hooks that change its output),
    else None (the caller then takes the full-logits path)."""
    if type(module) is not torch.nn.Linear or module._forward_hooks or module._forward_pre_hooks:
        return None
    return module
