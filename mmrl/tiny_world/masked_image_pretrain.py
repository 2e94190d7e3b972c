"""Supervised pre-training of the tiny aMUSEd (`shapes-masked`): MaskGIT's masked-token objective on shapes scenes.

Chang et al. 2022, "MaskGIT", section 3.1 (as aMUSEd trains, Patil et al. 2024, section 3): per image a mask ratio
`r = cos(pi/2 u)`, u ~ U(0, 1) (the sampler's cosine schedule), each image token masked with probability r (at
least one per image), loss = cross-entropy of the masked tokens given the visible ones and the prompt. The prompt is
replaced by the negative prompt ("") `cfg_dropout` of the time, so classifier-free guidance and GCPO's negative
condition have an unconditional model. The tiny CLIP text encoder trains jointly here (aMUSEd freezes a pre-trained
one; the tiny world has none), and is frozen again afterwards: RL trains the transformer only.

The scenes are drawn as in `janus_sft` (`mmrl/tiny_world/pretrain.py`): fresh random slot scenes satisfying each
sampled prompt's GenEval record, a `caption_noise` fraction drawn for a corrupted record under the original caption,
rows balanced over GenEval tasks when `groups` is given. Deterministic for a seed.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def maskgit_masks(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """[B, T] bool: per row a ratio `cos(pi/2 u)`, u ~ U(0, 1), each token masked with that probability; a row that
    drew no mask gets its lowest-uniform token masked (MaskGIT trains on at least one masked token)."""
    ratio = torch.cos(math.pi / 2 * torch.rand(batch, 1, generator=generator))  # [B, 1]
    u = torch.rand(batch, length, generator=generator)  # [B, T]
    masked = u < ratio
    first = torch.zeros_like(masked).scatter_(1, u.argmin(-1, keepdim=True), True)
    return masked | (~masked.any(-1, keepdim=True) & first)


def maskgit_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the masked positions: logits [B, T, V], targets [B, T], masked [B, T] -> scalar."""
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")  # [B*T]
    m = masked.reshape(-1).float()
    return (ce * m).sum() / m.sum().clamp(min=1)


def masked_image_sft(policy, prompts: Sequence[str], metadata: Sequence[dict], *, steps: int, batch_size: int = 64,
                     lr: float = 2e-3, seed: int = 0, cfg_dropout: float = 0.1, draw_tokens: Callable,
                     caption_noise: float = 0.0, corrupt: Callable | None = None, groups: Sequence[str] | None = None,
                     progress: bool = True, desc: str = "pretrain") -> list[dict]:
    """Train a `MaskedImageAdapter`'s transformer and text encoder in place; returns the history (step, loss,
    seconds). `draw_tokens(record, rng) -> [T]` draws a scene's image tokens."""
    import numpy as np

    from mmrl.tiny_world.pretrain import _bar, record_step, sft_optimizer, sft_update

    if not 0.0 <= caption_noise < 1.0:
        raise ValueError(f"caption_noise must lie in [0, 1), got {caption_noise}")
    if caption_noise and corrupt is None:
        raise ValueError("caption_noise > 0 needs corrupt=, the function that makes a caption's record wrong")
    n = len(prompts)
    weights = None
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"groups must give one label per prompt ({n}), got {len(groups)}")
        sizes = {lab: list(groups).count(lab) for lab in set(groups)}
        weights = torch.tensor([1.0 / (len(sizes) * sizes[lab]) for lab in groups], dtype=torch.float64)  # [n]
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    ids_all = policy.tokenize(list(prompts)).cpu()  # [n, L]
    null = policy.tokenize([policy.generation_defaults["negative_prompt"]]).cpu()  # [1, L]
    trained = torch.nn.ModuleList([policy.model, policy.text_encoder])
    policy.text_encoder.requires_grad_(True)
    opt = sft_optimizer(trained, lr, steps)[0]  # the schedule of janus_sft: warm-up, constant, decay over the last 20%
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * min(1.0, max(0.05, 5 * (1 - s / steps))))
    history, t0 = [], time.perf_counter()
    trained.train()
    bar = _bar(steps, desc, progress)
    for step in range(1, steps + 1):
        if weights is None:
            idx = torch.randint(0, n, (batch_size,), generator=g).tolist()
        else:
            idx = torch.multinomial(weights, batch_size, replacement=True, generator=g).tolist()
        records = [corrupt(metadata[i], rng) if caption_noise and rng.random() < caption_noise else metadata[i] for i in idx]
        target = torch.as_tensor(np.stack([draw_tokens(r, rng) for r in records]), dtype=torch.long)  # [B, T]
        drop = torch.rand(batch_size, generator=g) < cfg_dropout  # [B]
        ids = torch.where(drop[:, None], null, ids_all[idx])  # [B, L]
        masked = maskgit_masks(batch_size, target.shape[1], g)  # [B, T]
        states = torch.where(masked, torch.full_like(target, policy.mask_token_id), target)
        out = policy.text_encoder(ids, return_dict=True, output_hidden_states=True)
        logits = policy.image_logits(policy.model, states, (out.text_embeds, out.hidden_states[-2]))  # [B, T, V]
        loss = maskgit_loss(logits, target, masked)
        record_step(history, bar, step, sft_update(loss, trained.parameters(), opt, sched), t0)
    if bar is not None:
        bar.close()
    trained.eval()
    policy.text_encoder.requires_grad_(False)
    return history
