"""Supervised pre-training of the tiny base models, to partial competence (so RL has headroom).

- masked diffusion (`masked_diffusion_sft`): LLaDA's SFT objective (Nie et al. 2025, "Large Language Diffusion
  Models", section 2.3 / eq. 5): the prompt is never masked; every response token is masked with probability
  t ~ U(eps, 1); loss = sum over masked tokens of CE / t, divided by the response length. With infilling prompts
  (`response_template`) the given positions are never masked and do not count in the length.
- causal LM (`causal_sft`): next-token cross-entropy on the response given the prompt.
- Janus (`janus_sft`): next-image-token cross-entropy given the prompt, with the prompt replaced by the CFG null
  condition 10% of the time so classifier-free guidance has an unconditional model (Janus-Pro's recipe drops the
  condition the same way, docs/sources.md "T2I branch").

All loops are deterministic for a seed (own generator, fixed data order) and report held-out accuracy.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F


def _tokenize(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    return [list(tokenizer(t)["input_ids"]) for t in texts]


def pack_pairs(tokenizer, prompts: Sequence[str], targets: Sequence[str], gen_length: int, pad_id: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt ids [B, P] left padded, prompt mask [B, P], response ids [B, gen_length] = target + EOS padding)."""
    from mmrl.models.base import left_pad

    p_ids = _tokenize(tokenizer, prompts)
    t_ids = _tokenize(tokenizer, targets)
    too_long = [i for i, t in enumerate(t_ids) if len(t) > gen_length]
    if too_long:
        raise ValueError(f"{len(too_long)} targets are longer than gen_length={gen_length} tokens (first: {targets[too_long[0]]!r})")
    prompt, pmask = left_pad(p_ids, pad_id)
    resp = torch.full((len(targets), gen_length), eos_id, dtype=torch.long)
    for i, t in enumerate(t_ids):
        resp[i, : len(t)] = torch.as_tensor(t, dtype=torch.long)
    return prompt, pmask, resp


TIME_WEIGHTS = ("inv_t", "linear", "none")
"""Per-row weights of the masked-token cross-entropy as a function of the mask rate t (`diffusion_time_weights`)."""
NORMALISATIONS = ("length", "masked")
"""What the weighted masked-token cross-entropy is divided by (`masked_sft_loss`)."""


def diffusion_time_weights(t: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-row loss weights [B, 1] of mask rates t [B, 1] (values in (0, 1]).

    "inv_t": LLaDA's 1/t (Nie et al. 2025, eq. 5; the ELBO weight); "linear": 1 - t (MGDM's `linear` time
    reweighting, Ye et al. 2025, arXiv 2410.14157, which favours lightly masked rows); "none": 1.
    """
    if kind == "inv_t":
        return 1.0 / t
    if kind == "linear":
        return 1.0 - t
    if kind == "none":
        return torch.ones_like(t)
    raise ValueError(f"unknown time_weight {kind!r}; valid: {list(TIME_WEIGHTS)}")


def mgdm_token_weights(ce: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """MGDM's token reweighting (Ye et al. 2025, "Beyond Autoregression", arXiv 2410.14157): a masked
    token's cross-entropy u becomes `alpha * (1 - exp(-u))**gamma * u`, so hard tokens (large u) weigh more than easy
    ones (the focal-loss form; the weight is differentiated through, as in focal loss). ce: [...] -> same shape."""
    if alpha <= 0 or gamma < 0:
        raise ValueError(f"token_reweight needs alpha > 0 and gamma >= 0, got alpha={alpha}, gamma={gamma}")
    return alpha * (1 - torch.exp(-ce)) ** gamma * ce


def suffix_masks(fixed: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """Block-autoregressive masks [B, T]: every free response position at or after `cut` [B, 1] (values in [0, T))
    is masked, the prefix before it is visible: the conditionals a left-to-right (block length 1) decode asks for,
    and the causal phase's next-token task under bidirectional attention."""
    return (torch.arange(fixed.shape[1], device=fixed.device)[None] >= cut) & ~fixed


def anneal_share(done: int, anneal_steps: int) -> float:
    """The share of future positions each query may attend to after `done` annealed diffusion steps out of
    `anneal_steps`: `min(done / anneal_steps, 1)` (0: causal, 1: full attention)."""
    if anneal_steps <= 0 or done < 0:
        raise ValueError(f"anneal_share needs anneal_steps > 0 and done >= 0, got anneal_steps={anneal_steps}, done={done}")
    return min(done / anneal_steps, 1.0)


def annealed_attention(u: torch.Tensor, share: float) -> torch.Tensor:
    """Attention-mask annealing from causal to full attention (DiffuLLaMA, Gong et al. 2025, "Scaling Diffusion
    Language Models via Adaptation from Autoregressive Models", arXiv 2410.17891): query i attends to
    every key j <= i, and to a future key j > i when its uniform draw u[..., i, j] < share.

    u: [..., L, L] uniforms in [0, 1); share in [0, 1]. Returns the bool pattern [..., L, L] (True = may attend):
    causal at share 0, full at share 1, and for fixed u growing with share (each pattern contains the ones before)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must lie in [0, 1], got {share!r}")
    length = u.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=u.device).tril()  # [L, L]
    return causal | (u < share)


def through_first_eos(x_r: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """Bool [B, T]: the response positions up to and including each row's first EOS (any of `eos_ids`); a row
    without an EOS keeps every position. The post-EOS padding `pack_pairs` writes is what it leaves out."""
    is_eos = torch.isin(x_r, torch.as_tensor(list(eos_ids), dtype=x_r.dtype, device=x_r.device))  # [B, T]
    return (is_eos.long().cumsum(-1) - is_eos.long()) == 0  # [B, T]: no EOS strictly before the position


LOSS_OPTIONS = ("eps", "time_weight", "normalise", "token_reweight", "suffix_frac", "pad_loss")
"""The keys of a masked-diffusion pre-training recipe (`TinySpec.recipe`, `masked_diffusion_sft`'s options) that
choose the loss itself (`masked_sft_loss`); the others (`ar_init_steps`, `diffusion_lr`, `anneal_steps`) choose the
schedule around it."""


def loss_options(recipe: dict) -> dict:
    """The `masked_sft_loss` keyword options of a masked-diffusion pre-training `recipe` (`LOSS_OPTIONS`), so a
    fine-tuning run fits its data with the loss its base was pre-trained with (e.g. `countdown3-md`:
    `{"time_weight": "none", "normalise": "masked"}`; `{}` is LLaDA's eq. 5)."""
    return {k: (float(v) if k == "suffix_frac" else v) for k, v in recipe.items() if k in LOSS_OPTIONS}


def masked_sft_loss(policy, x_p: torch.Tensor, m_p: torch.Tensor, x_r: torch.Tensor, fixed: torch.Tensor,
                    generator: torch.Generator, *, eps: float = 1e-3, time_weight: str = "inv_t",
                    normalise: str = "length", token_reweight: Sequence[float] | None = None,
                    suffix_frac: float = 0.0, attend: torch.Tensor | None = None, pad_loss: bool = True) -> torch.Tensor:
    """The masked-diffusion SFT loss of one batch, a scalar: t ~ U(eps, 1) per row, every free response token masked
    with probability t; by default LLaDA's eq. 5, `sum(CE over masked tokens / t) / (number of free response tokens)`.

    `time_weight` replaces 1/t (`diffusion_time_weights`), `normalise="masked"` divides by the number of masked
    tokens instead (MGDM's average token loss), `token_reweight=(alpha, gamma)` applies `mgdm_token_weights`,
    `suffix_frac` of the rows (drawn per row) mask a uniformly drawn suffix instead (`suffix_masks`; their t is the
    masked share of the row). `attend` [B, P + T, P + T] replaces the bidirectional attention with a custom
    pattern (`annealed_attention`).
    `pad_loss=False` (a deviation from LLaDA's eq. 5, which scores every masked response position, EOS padding
    included) scores only the masked positions up to and including each row's first EOS (`through_first_eos`):
    the positions after it are masked with the same draws (as at inference, where the whole response starts masked)
    but carry no loss, and the normaliser counts only the kept positions (`normalise="masked"`: the masked ones
    through the first EOS; `"length"`: the free ones through the first EOS). The default (True) is the loss as it
    was, bit for bit.

    Args: prompt ids x_p [B, P] and mask m_p [B, P], response ids x_r [B, T], fixed [B, T] (infilled given positions,
    never masked and not counted), a CPU generator for t and the masks.
    """
    if normalise not in NORMALISATIONS:
        raise ValueError(f"unknown normalise {normalise!r}; valid: {list(NORMALISATIONS)}")
    if not isinstance(pad_loss, bool):
        raise ValueError(f"pad_loss must be True or False, got {pad_loss!r}")
    b, t_len = x_r.shape
    t = eps + (1 - eps) * torch.rand(b, 1, generator=generator)  # [B, 1]
    masked = (torch.rand(b, t_len, generator=generator) < t) & ~fixed  # [B, T]
    if suffix_frac:  # drawn only when asked, so the default recipe's random stream is unchanged
        cut = torch.randint(0, t_len, (b, 1), generator=generator)  # [B, 1]
        pick = torch.rand(b, 1, generator=generator) < suffix_frac  # [B, 1]
        suffix = suffix_masks(fixed, cut)  # [B, T]
        masked = torch.where(pick, suffix, masked)
        t = torch.where(pick, suffix.float().mean(-1, keepdim=True).clamp(min=eps), t)
    noisy = torch.where(masked, torch.full_like(x_r, policy.mask_token_id), x_r)
    logits = policy.backbone_logits(m_p, t_len, policy.model, attend=attend)(torch.cat([x_p, noisy], dim=1))[:, -t_len:]  # [B, T, V]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x_r.reshape(-1), reduction="none").view(b, t_len)
    if token_reweight is not None:
        ce = mgdm_token_weights(ce, *token_reweight)
    if pad_loss:
        counted, free = masked, b * t_len - fixed.sum()  # [B, T], the free positions of the batch
    else:
        kept = through_first_eos(x_r, policy.eos_token_ids)  # [B, T]
        counted, free = masked & kept, (kept & ~fixed).sum()  # [B, T], the free positions through the first EOS
    num = (ce * counted * diffusion_time_weights(t, time_weight)).sum()
    den = counted.sum() if normalise == "masked" else free
    return num / den.clamp(min=1)


def masked_diffusion_sft(
    policy,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    gen_length: int,
    steps: int,
    batch_size: int = 64,
    lr: float = 2e-3,
    seed: int = 0,
    eps: float = 1e-3,
    eval_fn: Callable[[], float] | None = None,
    eval_every: int = 0,
    progress: bool = True,
    desc: str = "pretrain",
    ar_init_steps: int = 0,
    time_weight: str = "inv_t",
    normalise: str = "length",
    token_reweight: Sequence[float] | None = None,
    diffusion_lr: float | None = None,
    suffix_frac: float = 0.0,
    anneal_steps: int = 0,
    pad_loss: bool = True,
    keep_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,
) -> list[dict]:
    """Train a `MaskedDiffusionAdapter` in place with LLaDA's SFT loss (or the `masked_sft_loss` variant that
    `time_weight`, `normalise`, `token_reweight` choose); returns the history of (step, loss, seconds, eval).

    `ar_init_steps` > 0 first trains the same backbone as a causal LM for that many steps (`causal_phase`), then
    runs the `steps` masked-diffusion steps with a fresh optimizer: the AR-to-diffusion adaptation of Dream
    (Ye et al. 2025, initialised from Qwen2.5) and DiffuLLaMA (Gong et al. 2025, arXiv 2410.17891), which needs
    Dream's shifted logits (`policy.shift_logits`) so that position i-1 keeps predicting token i.
    `diffusion_lr` is the masked-diffusion steps' learning rate (default `lr`, the causal phase's).
    `anneal_steps` = K > 0 anneals the attention from causal to full over the first K diffusion steps (DiffuLLaMA's
    attention-mask annealing, Gong et al. 2025, arXiv 2410.17891): at diffusion step s = 1, 2, ... each query
    attends to all past positions and to each future one with probability `anneal_share(s - 1, K)` = (s - 1) / K,
    drawn per row, query and key (`annealed_attention`, from its own generator so the masking draws are the
    default recipe's); from step K + 1 on the attention is fully bidirectional.
    `pad_loss=False` leaves the post-EOS padding out of the loss (`masked_sft_loss`; the draws are unchanged).
    `keep_optimizer(opt)` is called with the diffusion steps' AdamW after the last step (the base build keeps its
    state, `mmrl.tiny_world.optimizer_state`).
    """
    if time_weight not in TIME_WEIGHTS:
        raise ValueError(f"unknown time_weight {time_weight!r}; valid: {list(TIME_WEIGHTS)}")
    if normalise not in NORMALISATIONS:
        raise ValueError(f"unknown normalise {normalise!r}; valid: {list(NORMALISATIONS)}")
    if token_reweight is not None and len(token_reweight) != 2:
        raise ValueError(f"token_reweight must be [alpha, gamma], got {token_reweight!r}")
    if not 0.0 <= float(suffix_frac) <= 1.0:
        raise ValueError(f"suffix_frac must lie in [0, 1], got {suffix_frac!r}")
    if diffusion_lr is not None and not float(diffusion_lr) > 0:
        raise ValueError(f"diffusion_lr must be > 0, got {diffusion_lr!r}")
    if int(anneal_steps) != anneal_steps or anneal_steps < 0:
        raise ValueError(f"anneal_steps must be an integer >= 0, got {anneal_steps!r}")
    if not isinstance(pad_loss, bool):
        raise ValueError(f"pad_loss must be True or False, got {pad_loss!r}")
    model = policy.model
    tok = policy.tokenizer
    texts = [policy._prompt_text(p) for p in prompts]
    if ar_init_steps:
        causal_phase(policy, texts, targets, steps=int(ar_init_steps), batch_size=batch_size, lr=lr, seed=seed,
                     progress=progress, desc=f"{desc} (causal phase)")
    prompt, pmask, resp = pack_pairs(tok, texts, targets, gen_length, policy.pad_token_id, policy.eos_token_ids[0])
    templates = policy.response_templates(list(prompts), gen_length)  # infilling prompts: given cells never masked
    fixed = (templates != policy.mask_token_id).cpu() if templates is not None else torch.zeros_like(resp, dtype=torch.bool)
    n = prompt.shape[0]
    g = torch.Generator().manual_seed(seed)
    g_attend = torch.Generator().manual_seed(seed + 1) if anneal_steps else None
    opt, sched = sft_optimizer(model, lr if diffusion_lr is None else float(diffusion_lr), steps)
    history: list[dict] = []
    t0 = time.perf_counter()
    model.train()
    bar = _bar(steps, desc, progress)
    order = torch.randperm(n, generator=g)
    cursor = 0
    for step in range(1, steps + 1):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=g), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        attend = None
        if anneal_steps and step <= anneal_steps:
            width = prompt.shape[1] + gen_length
            u = torch.rand(len(idx), width, width, generator=g_attend)  # [B, L, L]
            attend = annealed_attention(u, anneal_share(step - 1, int(anneal_steps))).to(prompt.device)
        loss = masked_sft_loss(policy, prompt[idx], pmask[idx], resp[idx], fixed[idx], g, eps=eps, time_weight=time_weight,
                               normalise=normalise, token_reweight=token_reweight, suffix_frac=float(suffix_frac),
                               attend=attend, pad_loss=pad_loss)
        loss_value = sft_update(loss, model.parameters(), opt, sched)
        record_step(history, bar, step, loss_value, t0, model=model, eval_fn=eval_fn, eval_every=eval_every, steps=steps)
    if bar is not None:
        bar.close()
    model.eval()
    if keep_optimizer is not None:
        keep_optimizer(opt)
    return history


def causal_phase(policy, prompts: Sequence[str], targets: Sequence[str], *, steps: int, batch_size: int, lr: float,
                 seed: int, progress: bool = False, desc: str = "causal phase") -> list[dict]:
    """Next-token pre-training of a `MaskedDiffusionAdapter`'s backbone with causal attention (`causal_sft` on the
    same model, `config.is_causal` True for the phase and False again afterwards); needs shifted logits, so the
    causal LM's alignment (position i-1 predicts token i) is the one the diffusion model keeps."""
    from mmrl.models.dllm_backbone import base_model

    if not policy.shift_logits:
        raise ValueError("ar_init_steps needs a masked-diffusion model with shift_logits=True (Dream's alignment), "
                         "else the causal phase trains position i to predict token i+1 and the diffusion phase undoes it")
    config = base_model(policy.model).config
    config.is_causal = True
    try:
        return causal_sft(policy, prompts, targets, steps=steps, batch_size=batch_size, lr=lr, seed=seed, progress=progress,
                          desc=desc, eos_id=policy.eos_token_ids[0], pad_id=policy.pad_token_id)
    finally:
        config.is_causal = False


def causal_sft(policy, prompts: Sequence[str], targets: Sequence[str], *, steps: int, batch_size: int = 64, lr: float = 2e-3,
               seed: int = 0, eval_fn: Callable[[], float] | None = None, eval_every: int = 0, progress: bool = True,
               desc: str = "pretrain", eos_id: int | None = None, pad_id: int | None = None,
               trim_padding: bool = False, keep_optimizer: Callable[[torch.optim.Optimizer], None] | None = None) -> list[dict]:
    """Train a `CausalLMAdapter` in place on prompt -> target + EOS (loss on the target tokens only); `eos_id` /
    `pad_id` default to the adapter's generation defaults (`causal_phase` passes a diffusion model's).
    `trim_padding`: cut each batch to its longest row (TRL's dynamic padding) instead of the longest row of the data;
    the loss is the same function of the weights (right padding under a causal mask is never attended to), the
    step is cheaper when lengths vary (countdown4_steps: 60-160 tokens). Off by default, so the bases built before
    it keep their exact floating-point history. `keep_optimizer(opt)` is called with the AdamW after the last step."""
    from mmrl.models.base import right_pad

    model, tok = policy.model, policy.tokenizer
    eos = policy.generation_defaults["eos_token_id"][0] if eos_id is None else int(eos_id)
    pad = policy.generation_defaults["pad_token_id"] if pad_id is None else int(pad_id)
    seqs, starts = [], []
    for p, t in zip(_tokenize(tok, prompts), _tokenize(tok, targets)):
        seqs.append(p + t + [eos])
        starts.append(len(p))
    ids, mask = right_pad(seqs, pad)  # [N, L]
    labels = ids.clone()
    for i, s in enumerate(starts):
        labels[i, :s] = -100
    labels[~mask] = -100
    g = torch.Generator().manual_seed(seed)
    opt, sched = sft_optimizer(model, lr, steps)
    history, t0 = [], time.perf_counter()
    n = ids.shape[0]
    order, cursor = torch.randperm(n, generator=g), 0
    model.train()
    bar = _bar(steps, desc, progress)
    for step in range(1, steps + 1):
        if cursor + batch_size > n:
            order, cursor = torch.randperm(n, generator=g), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        width = int(mask[idx].sum(1).max()) if trim_padding else ids.shape[1]
        b_ids, b_mask, b_labels = ids[idx, :width], mask[idx, :width], labels[idx, :width]  # [B, W]
        logits = model(input_ids=b_ids, attention_mask=b_mask).logits[:, :-1]  # [B, W-1, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), b_labels[:, 1:].reshape(-1), ignore_index=-100)
        loss_value = sft_update(loss, model.parameters(), opt, sched)
        record_step(history, bar, step, loss_value, t0, model=model, eval_fn=eval_fn, eval_every=eval_every, steps=steps)
    if bar is not None:
        bar.close()
    model.eval()
    if keep_optimizer is not None:
        keep_optimizer(opt)
    return history


def sft_optimizer(model, lr: float, steps: int):
    """(AdamW, scheduler) of the supervised pre-training loops: betas (0.9, 0.98), weight decay 0.01 on the trainable
    parameters; warm-up over the first 5% of the steps, then a linear decay to 5% of `lr`."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * max(0.05, 1 - s / steps))
    return opt, sched


def sft_update(loss: torch.Tensor, params, opt: torch.optim.Optimizer, sched=None, max_grad_norm: float = 1.0) -> float:
    """One supervised optimizer step of the tiny-world training loops: backward of `loss`, the gradient of `params`
    clipped to norm `max_grad_norm`, the optimizer (and scheduler) step; returns the loss value."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    if sched is not None:
        sched.step()
    return loss.item()


def record_step(history: list[dict], bar, step: int, loss_value: float, t0: float, *, model=None,
                eval_fn: Callable[[], float] | None = None, eval_every: int = 0, steps: int = 0) -> dict:
    """Append step `step`'s record {"step", "loss", "seconds" since `t0`} to `history`, with "eval" (`eval_fn()`,
    the model in eval mode) every `eval_every` steps and at the last step `steps`; advance the progress `bar`."""
    rec = {"step": step, "loss": loss_value, "seconds": time.perf_counter() - t0}
    if eval_fn is not None and eval_every and (step % eval_every == 0 or step == steps):
        model.eval()
        rec["eval"] = float(eval_fn())
        model.train()
    history.append(rec)
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", **({"eval": f"{rec['eval']:.3f}"} if "eval" in rec else {}))
    return rec


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="step", dynamic_ncols=True, leave=False)


def janus_sft(policy, prompts: Sequence[str], metadata: Sequence[dict], *, steps: int, batch_size: int = 64, lr: float = 2e-3,
              seed: int = 0, cfg_dropout: float = 0.1, eval_fn: Callable[[], float] | None = None, eval_every: int = 0,
              progress: bool = True, desc: str = "pretrain", draw_tokens: Callable | None = None,
              caption_noise: float = 0.0, corrupt: Callable | None = None, groups: Sequence[str] | None = None) -> list[dict]:
    """Train a tiny `JanusAdapter` in place on shapes scenes drawn for each prompt's GenEval record.

    Every step draws fresh random scenes that satisfy the sampled prompts, as image tokens
    (`draw_tokens(record, rng) -> [T]` ids; default the palette cells of `mmrl.tiny_world.shapes.scene_for_metadata`), and
    minimises the next-image-token cross-entropy given the prompt; a `cfg_dropout` fraction of rows sees the CFG null
    prompt instead (unconditional training for guidance). With `caption_noise` > 0 that fraction of rows is drawn for
    `corrupt(record, rng)` instead while keeping the original caption (noisy captions, `mmrl.tiny_world.caption_noise`).
    With `groups` (a label per prompt, e.g. its GenEval task) rows are drawn uniformly over the groups, then over the
    group's prompts; else uniformly over prompts.
    """
    import numpy as np

    from mmrl.tiny_world.shapes import scene_for_metadata
    from mmrl.models.base import left_pad

    if not 0.0 <= caption_noise < 1.0:
        raise ValueError(f"caption_noise must lie in [0, 1), got {caption_noise}")
    if caption_noise and corrupt is None:
        raise ValueError("caption_noise > 0 needs corrupt=, the function that makes a caption's record wrong")

    model = policy.model
    grid = policy.codec.grid
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    ids_per_prompt = [policy.prompt_token_ids(p) for p in prompts]
    opt = sft_optimizer(model, lr, steps)[0]  # its own schedule below
    # warm-up, constant, then a linear decay over the last 20%: the model attends to the caption only after a
    # loss plateau of several hundred steps, and a decay over the whole run slows it down right there (measured)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * min(1.0, max(0.05, 5 * (1 - s / steps))))
    if draw_tokens is None:
        draw_tokens = lambda record, r: scene_for_metadata(record, r, grid=grid[0]).cells().reshape(-1)  # noqa: E731
    history, t0 = [], time.perf_counter()
    model.train()
    bar = _bar(steps, desc, progress)
    n = len(prompts)
    row_weights = None
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"groups must give one label per prompt ({n}), got {len(groups)}")
        sizes = {lab: list(groups).count(lab) for lab in set(groups)}
        row_weights = torch.tensor([1.0 / (len(sizes) * sizes[lab]) for lab in groups], dtype=torch.float64)  # [n]
    for step in range(1, steps + 1):
        if row_weights is None:
            idx = torch.randint(0, n, (batch_size,), generator=g).tolist()
        else:
            idx = torch.multinomial(row_weights, batch_size, replacement=True, generator=g).tolist()
        records = [corrupt(metadata[i], rng) if caption_noise and rng.random() < caption_noise else metadata[i] for i in idx]
        target = torch.as_tensor(np.stack([draw_tokens(r, rng) for r in records]), dtype=torch.long)  # [B, T]
        prompt, pmask = left_pad([ids_per_prompt[i] for i in idx], policy.ids.pad)  # [B, P]
        drop = torch.rand(batch_size, generator=g) < cfg_dropout  # [B]
        null = policy.null_prompt(prompt, pmask)
        prompt = torch.where(drop[:, None], null, prompt)
        logits = policy.image_logits(model, prompt, pmask, target)  # [B, T, V]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1))
        loss_value = sft_update(loss, model.parameters(), opt, sched)
        record_step(history, bar, step, loss_value, t0, model=model, eval_fn=eval_fn, eval_every=eval_every, steps=steps)
    if bar is not None:
        bar.close()
    model.eval()
    return history
