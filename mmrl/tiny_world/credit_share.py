"""Does a method's token credit land on the tokens that decide the answer? (issue 25, item 3)

`method_credit` runs a registered method's own buffer and loss code (`Method.prepare`, then `Method.loss` for every
micro-batch, as the trainer calls them) on a fixed rollout with every advantage set to 1, so the credit it hands back
(`LossOutput.credit`, advantage x token weight, what the gradient sees) is the method's per-token weight itself: DGPO's
`n * softmax(H^2 * gate / tau)` against the reference, GCPO's contrast weights between the prompt and its negative
condition, 1 for GRPO. `decisive_share` is the share of an answer's credit on its decisive tokens, beside the share
uniform credit would put there (decisive tokens / all tokens).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


def decisive_share(credit: torch.Tensor, mask: torch.Tensor, decisive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(share [N], uniform [N]) of each answer's credit on its decisive tokens.

    `share_i = sum_t |c_it| d_it m_it / sum_t |c_it| m_it` (the magnitude of the credit: its sign is the advantage's,
    one per answer) and `uniform_i = sum_t d_it m_it / sum_t m_it`, what equal credit per token gives.

    Args:
        credit: [N, T] per-token credit.
        mask: [N, T] bool, the tokens the loss sees.
        decisive: [N, T] bool, the tokens that decide the answer.
    Raises ValueError on shape mismatches and on an answer with no credit or no tokens (its share is undefined).
    """
    if not credit.shape == mask.shape == decisive.shape or credit.dim() != 2:
        raise ValueError(f"credit, mask and decisive must be [N, T] of one shape, got {tuple(credit.shape)}, "
                         f"{tuple(mask.shape)}, {tuple(decisive.shape)}")
    m = mask.bool()
    d = (decisive.bool() & m).float()  # [N, T]
    c = credit.detach().float().abs() * m  # [N, T]
    total, count = c.sum(1), m.sum(1).float()  # [N]
    if bool((total <= 0).any()) or bool((count <= 0).any()):
        bad = torch.nonzero((total <= 0) | (count <= 0)).flatten().tolist()
        raise ValueError(f"answers {bad[:5]} have no credit or no tokens under the mask: their share is undefined")
    return (c * d).sum(1) / total, d.sum(1) / count


def token_marks(tokens: Sequence[str], text: str, char_mask: Sequence[bool], specials: Sequence[str] = ()) -> list[bool] | None:
    """Per token: whether any of its characters is marked in `char_mask` (a mask over the characters of `text`).
    The tokens are the response's decoded tokens in order; `specials` (the tokenizer's special tokens, which the
    decoded text leaves out) and every token after the text (EOS) are unmarked. None when the tokens do not spell
    `text` from its start (then the marks cannot be placed)."""
    out, pos = [], 0
    for tok in tokens:
        if pos < len(text) and text.startswith(tok, pos):
            out.append(any(char_mask[pos : pos + len(tok)]))
            pos += len(tok)
        elif pos >= len(text) or tok in specials:
            out.append(False)
        else:
            return None
    return out if pos == len(text) else None


def decisive_tokens(policy, rollout, char_mask_fn: Callable[[str], list[bool]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(decisive [N, T] bool on the response tokens, usable [N] bool): `char_mask_fn(completion)` marks the deciding
    characters (e.g. `countdown_steps.decisive_mask`) of each decoded completion; an answer it rejects (ValueError) or whose tokens cannot be
    aligned to its text is not usable (its row is all False)."""
    N, T = rollout.response_ids.shape
    decisive = torch.zeros(N, T, dtype=torch.bool)
    usable = torch.zeros(N, dtype=torch.bool)
    mask = rollout.response_mask.cpu().bool()
    specials = set(policy.tokenizer.all_special_tokens)
    for i, (toks, text) in enumerate(zip(policy.token_strings(rollout), rollout.completions)):
        try:
            marks = token_marks(toks, text, char_mask_fn(text), specials)
        except ValueError:
            continue
        if marks is None or not any(marks):
            continue
        decisive[i, torch.nonzero(mask[i]).flatten()[: len(marks)]] = torch.tensor(marks)
        usable[i] = True
    return decisive, usable


def method_config(method: str, family: str, **overrides: Any):
    """A validated `TrainConfig` for `method_credit`: one optimizer step per rollout, as the tiny-world comparisons
    run; the batch settings are placeholders (`method_credit` makes its own micro-batches, and with every advantage
    given no group is formed)."""
    from mmrl.config.train_config import load_config

    values = dict(method=method, family=family, num_generations=2, per_device_train_batch_size=2,
                  gradient_accumulation_steps=1, num_iterations=1, dynamic_sampling=False, progress_bar=False,
                  save_steps=0, output_dir="unused")
    values.update(overrides)
    return load_config(None, values)


@torch.no_grad()
def method_credit(cfg, policy, rollout, loss_mask: torch.Tensor | None = None, micro_batch: int = 64) -> torch.Tensor:
    """[N, T] the credit `cfg.method`'s registered class hands back for `rollout` with every advantage 1: its
    `prepare` on the buffer, then its `loss` on micro-batches of `micro_batch` rows (the trainer's order, inner step
    0). `loss_mask` defaults to the response mask. DGPO needs `policy.ref_model`; GCPO the adapter's negative
    condition."""
    from mmrl.methods.base import METHODS, MicroBatch, behaviour_is_current
    from mmrl.training.buffer import Buffer
    from mmrl.training.policy_factory import estimator_options
    from functools import partial

    method = METHODS[cfg.method](cfg, policy, partial(estimator_options, cfg))
    N = rollout.num_responses
    mask = rollout.response_mask.bool() if loss_mask is None else loss_mask.bool()
    buf = Buffer(rollout=rollout, rewards=torch.ones(N), advantages=torch.ones(N), loss_mask=mask, mask_seeds=[cfg.seed],
                 old_logp=[])
    batches = [torch.arange(s, min(N, s + micro_batch)) for s in range(0, N, micro_batch)]
    method.prepare(buf, batches, current=behaviour_is_current(cfg))
    g_tokens, g_seqs = float(mask.sum()), float(N)
    for j, idx in enumerate(batches):
        buf.store(idx, method.loss(buf, MicroBatch(idx, 0, j, 0, 0, g_tokens, g_seqs, g_seqs)))
    return buf.credit
