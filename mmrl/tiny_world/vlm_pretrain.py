"""Supervised pre-training of the tiny vision-language model (`VLMAdapter`): next-token cross-entropy on the answer
(+ EOS) given the image and question, scored through the adapter's own prompt encoding and teacher-forced forward
(`encode_prompts`, `_response_logits`: the same processor, chat template, pixel inputs and 3-D RoPE positions RL
samples and scores with).

With `label_noise` > 0 that fraction of rows is trained on a wrong answer (`corrupt(i, rng)`, a wrong answer of
row i's type): the model then spreads probability over answers, so its greedy accuracy stays partial while a
sample of 8 often holds the right answer (headroom for RL to sharpen it). Deterministic for a seed.

Curriculum (`groups`, `phases`): a list of phases `(groups of the phase, steps)` run in order, each phase's steps
drawing their rows only from those whose group (for shapes_vqa, the question type) is in the phase's groups; the steps
after the last phase draw from every row. `first_groups`, `first_steps` is the one-phase form `phases=[(first_groups,
first_steps)]` (the same batches, bit for bit). On the uniform mix of question types the tiny VLM first learns each
type's answer prior and stays there (a constant answer per type, colour at chance); starting on colour questions
alone, where no prior helps (7 equally likely answers), makes it read the image first (docs/RESULTS.md, "Tiny VLM");
a phase per type (colour, shape, count, position) before the mix asks the same of every type.

Clean labels first (`clean_steps`): the first `clean_steps` steps train on the true answers, the label noise applies
from the next step on (a model that has learnt to read the image before the wrong labels arrive).
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


def curriculum_pools(groups: Sequence[str] | None, n: int, phases: Sequence[tuple[Sequence[str], int]],
                     steps: int) -> list[tuple[torch.Tensor, int]]:
    """The curriculum's phases as (row indices [m] whose group is in the phase's groups, the phase's steps), checked:
    every phase names groups and at least one step and finds rows, and the phases fit in `steps`."""
    if not phases:
        return []
    if groups is None or len(groups) != n:
        raise ValueError(f"a curriculum needs groups= with one group per prompt ({n}), got "
                         f"{'none' if groups is None else len(groups)}")
    out, total = [], 0
    for k, (names, k_steps) in enumerate(phases):
        names = [names] if isinstance(names, str) else list(names)
        if not names or int(k_steps) < 1:
            raise ValueError(f"curriculum phase {k} needs groups and steps >= 1, got ({names}, {k_steps})")
        idx = torch.tensor([i for i, g_ in enumerate(groups) if g_ in set(names)], dtype=torch.long)  # [m]
        if not len(idx):
            raise ValueError(f"no row belongs to curriculum phase {k}'s groups {names} (first_groups / phases); "
                             f"groups seen: {sorted(set(groups))}")
        out.append((idx, int(k_steps)))
        total += int(k_steps)
    if total > steps:
        raise ValueError(f"the curriculum's phases take {total} steps, more than steps={steps}")
    return out


def vlm_sft(policy, prompts: Sequence[Any], targets: Sequence[str], *, steps: int, batch_size: int = 64, lr: float = 2e-3,
            seed: int = 0, label_noise: float = 0.0, corrupt: Callable[[int, random.Random], str] | None = None,
            groups: Sequence[str] | None = None, first_groups: Sequence[str] = (), first_steps: int = 0,
            phases: Sequence[tuple[Sequence[str], int]] = (), clean_steps: int = 0,
            eval_fn: Callable[[], dict] | None = None, eval_every: int = 0,
            progress: bool = True, desc: str = "pretrain") -> list[dict]:
    """Train a `VLMAdapter` in place on `{"prompt", "images"}` prompts -> target answers; returns the history of
    (step, loss, seconds, and "eval": `eval_fn()` every `eval_every` steps). AdamW, warm-up over 5% then a linear
    decay over all `steps`, gradient norm clipped at 1. `groups[i]`: row i's group; `phases`: the curriculum, `(groups,
    steps)` per phase, in order, the rest of the steps on every row; `first_groups` / `first_steps`: its one-phase
    form (not both); `clean_steps`: steps on the true labels before `label_noise` applies (the module docstring)."""
    from mmrl.models.base import left_pad
    from mmrl.tiny_world.pretrain import _bar, sft_optimizer, sft_update

    if not 0.0 <= label_noise < 1.0:
        raise ValueError(f"label_noise must lie in [0, 1), got {label_noise}")
    if label_noise and corrupt is None:
        raise ValueError("label_noise > 0 needs corrupt=, the function giving a wrong answer for row i")
    if len(prompts) != len(targets) or not prompts:
        raise ValueError(f"need as many targets as prompts (> 0), got {len(prompts)} prompts and {len(targets)} targets")
    if not 0 <= first_steps <= steps:
        raise ValueError(f"first_steps must lie in [0, steps={steps}], got {first_steps}")
    if not 0 <= clean_steps <= steps:
        raise ValueError(f"clean_steps must lie in [0, steps={steps}], got {clean_steps}")
    if first_steps and phases:
        raise ValueError("give the curriculum as phases= or as first_groups= / first_steps=, not both")
    if first_steps:
        if not first_groups:
            raise ValueError("first_steps > 0 needs groups= (one per prompt) and a non-empty first_groups=")
        phases = [(first_groups, first_steps)]
    phase_idx = curriculum_pools(groups, len(prompts), phases, steps)  # [(row indices [m], steps)] per phase
    model, tok = policy.model, policy.tokenizer
    eos = policy.generation_defaults["eos_token_id"][0]
    pad = policy.generation_defaults["pad_token_id"]
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    opt, sched = sft_optimizer(model, lr, steps)
    history, t0 = [], time.perf_counter()
    n = len(prompts)
    starts = {}  # step at which a pool starts -> its row indices
    at = 1
    for idx_, k in phase_idx:
        starts[at] = idx_
        at += k
    starts[at] = torch.arange(n)  # after the curriculum (from step 1 without one): every row
    model.train()
    bar = _bar(steps, desc, progress)
    for step in range(1, steps + 1):
        if step in starts:  # a phase begins: draw from its rows, in a fresh order
            pool = starts[step]
            order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
        if cursor + batch_size > len(pool):
            order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
        idx = order[cursor : cursor + batch_size].tolist()
        cursor += batch_size
        noisy = label_noise and step > clean_steps
        answers = [corrupt(i, rng) if noisy and rng.random() < label_noise else targets[i] for i in idx]
        ids, extras = policy.encode_prompts([prompts[i] for i in idx])
        p_ids, p_mask = left_pad(ids, pad, policy.device)  # [B, P]
        r_ids, r_mask = answer_batch(tok, answers, eos, pad)  # [B, T]
        r_ids, r_mask = r_ids.to(policy.device), r_mask.to(policy.device)
        logits = policy._response_logits(model, p_ids, p_mask, r_ids, r_mask, extras)  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), r_ids.masked_fill(~r_mask, -100).reshape(-1),
                               ignore_index=-100)
        history.append({"step": step, "loss": sft_update(loss, model.parameters(), opt, sched), "seconds": time.perf_counter() - t0})
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
