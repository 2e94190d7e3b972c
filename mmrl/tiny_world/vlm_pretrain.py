"""Supervised pre-training of the tiny vision-language model (`VLMAdapter`): next-token cross-entropy on the answer
(+ EOS) given the image and question, scored through the adapter's own prompt encoding and teacher-forced forward
(`encode_prompts`, `_response_logits`: the same processor, chat template, pixel inputs and 3-D RoPE positions RL
samples and scores with).

With `label_noise` > 0 that fraction of rows is trained on a wrong answer (`corrupt(i, rng)`, a wrong answer of
row i's type): the model then spreads probability over answers, so its greedy accuracy stays partial while a
sample of 8 often holds the right answer (headroom for RL to sharpen it). Deterministic for a seed.

Curriculum (`groups`, `first_groups`, `first_steps`): the first `first_steps` steps draw their rows only from those
whose group (for shapes_vqa, the question type) is in `first_groups`, the rest from every row. On the uniform mix of
question types the tiny VLM first learns each type's answer prior and stays there (a constant answer per type, colour
at chance); starting on colour questions alone, where no prior helps (7 equally likely answers), makes it read the
image first (docs/RESULTS.md, "Tiny VLM").
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
            groups: Sequence[str] | None = None, first_groups: Sequence[str] = (), first_steps: int = 0,
            eval_fn: Callable[[], dict] | None = None, eval_every: int = 0,
            progress: bool = True, desc: str = "pretrain") -> list[dict]:
    """Train a `VLMAdapter` in place on `{"prompt", "images"}` prompts -> target answers; returns the history of
    (step, loss, seconds, and "eval": `eval_fn()` every `eval_every` steps). AdamW, warm-up over 5% then a linear
    decay over all `steps`, gradient norm clipped at 1. `groups[i]`: row i's group; the first `first_steps` steps
    draw only rows whose group is in `first_groups` (the module docstring)."""
    from mmrl.models.base import left_pad
    from mmrl.tiny_world.pretrain import _bar, sft_optimizer

    if not 0.0 <= label_noise < 1.0:
        raise ValueError(f"label_noise must lie in [0, 1), got {label_noise}")
    if label_noise and corrupt is None:
        raise ValueError("label_noise > 0 needs corrupt=, the function giving a wrong answer for row i")
    if len(prompts) != len(targets) or not prompts:
        raise ValueError(f"need as many targets as prompts (> 0), got {len(prompts)} prompts and {len(targets)} targets")
    if not 0 <= first_steps <= steps:
        raise ValueError(f"first_steps must lie in [0, steps={steps}], got {first_steps}")
    first_idx = None
    if first_steps:
        if groups is None or len(groups) != len(prompts) or not first_groups:
            raise ValueError("first_steps > 0 needs groups= (one per prompt) and a non-empty first_groups=")
        first_idx = torch.tensor([i for i, g_ in enumerate(groups) if g_ in set(first_groups)], dtype=torch.long)
        if not len(first_idx):
            raise ValueError(f"no row belongs to first_groups={list(first_groups)}; groups seen: {sorted(set(groups))}")
    model, tok = policy.model, policy.tokenizer
    eos = policy.generation_defaults["eos_token_id"][0]
    pad = policy.generation_defaults["pad_token_id"]
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    opt, sched = sft_optimizer(model, lr, steps)
    history, t0 = [], time.perf_counter()
    n = len(prompts)
    pool = first_idx if first_idx is not None else torch.arange(n)  # the rows steps are drawn from now
    order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
    model.train()
    bar = _bar(steps, desc, progress)
    for step in range(1, steps + 1):
        if first_idx is not None and step == first_steps + 1:  # the curriculum's first phase is over: every row
            pool = torch.arange(n)
            order, cursor = pool[torch.randperm(n, generator=g)], 0
        if cursor + batch_size > len(pool):
            order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
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
        if eval_fn is not None and eval_every and (step % eval_every == 0 or step == steps):
            model.eval()
            history[-1]["eval"] = eval_fn()
            model.train()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
    if bar is not None:
        bar.close()
    model.eval()
    return history
