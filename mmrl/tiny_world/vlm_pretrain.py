"""Supervised pre-training of the tiny vision-language model (`VLMAdapter`): next-token cross-entropy on the answer
(+ EOS) given the image and question, scored through the adapter's own prompt encoding and teacher-forced forward
(`encode_prompts`, `_response_logits`: the same processor, chat template, pixel inputs and 3-D RoPE positions RL
samples and scores with).

With `label_noise` > 0 that fraction of rows is trained on a wrong answer (`corrupt(i, rng)`, a wrong answer of
row i's type): the model then spreads probability over answers, so its greedy accuracy stays partial while a
sample of 8 often holds the right answer (headroom for RL to sharpen it). Deterministic for a seed.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F


def answer_batch(tokenizer, answers: Sequence[str], eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T] = answer tokens + EOS, right padded with pad; mask [B, T] bool, True through the EOS)."""
    from mmrl.models.base import right_pad

    seqs = [list(tokenizer(a, add_special_tokens=False)["input_ids"]) + [eos_id] for a in answers]
    return right_pad(seqs, pad_id)


def vlm_sft(policy, prompts: Sequence[Any], targets: Sequence[str], *, steps: int, batch_size: int = 64, lr: float = 2e-3,
            seed: int = 0, label_noise: float = 0.0, corrupt: Callable[[int, random.Random], str] | None = None,
            progress: bool = True, desc: str = "pretrain") -> list[dict]:
    """Train a `VLMAdapter` in place on `{"prompt", "images"}` prompts -> target answers; returns the history of
    (step, loss, seconds). AdamW, warm-up over 5% then a linear decay, gradient norm clipped at 1."""
    from mmrl.models.base import left_pad
    from mmrl.tiny_world.pretrain import _bar, sft_optimizer

    if not 0.0 <= label_noise < 1.0:
        raise ValueError(f"label_noise must lie in [0, 1), got {label_noise}")
    if label_noise and corrupt is None:
        raise ValueError("label_noise > 0 needs corrupt=, the function giving a wrong answer for row i")
    if len(prompts) != len(targets) or not prompts:
        raise ValueError(f"need as many targets as prompts (> 0), got {len(prompts)} prompts and {len(targets)} targets")
    model, tok = policy.model, policy.tokenizer
    eos = policy.generation_defaults["eos_token_id"][0]
    pad = policy.generation_defaults["pad_token_id"]
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    opt, sched = sft_optimizer(model, lr, steps)
    history, t0 = [], time.perf_counter()
    n = len(prompts)
    order, cursor = torch.randperm(n, generator=g), 0
    model.train()
    bar = _bar(steps, desc, progress)
    for step in range(1, steps + 1):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=g), 0
        idx = order[cursor : cursor + batch_size].tolist()
        cursor += batch_size
        answers = [corrupt(i, rng) if label_noise and rng.random() < label_noise else targets[i] for i in idx]
        ids, extras = policy.encode_prompts([prompts[i] for i in idx])
        p_ids, p_mask = left_pad(ids, pad, policy.device)  # [B, P]
        r_ids, r_mask = answer_batch(tok, answers, eos, pad)  # [B, T]
        r_ids, r_mask = r_ids.to(policy.device), r_mask.to(policy.device)
        logits = policy._response_logits(model, p_ids, p_mask, r_ids, r_mask, extras)  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), r_ids.masked_fill(~r_mask, -100).reshape(-1),
                               ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        history.append({"step": step, "loss": loss.item(), "seconds": time.perf_counter() - t0})
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    return history
