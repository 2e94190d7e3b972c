"""Clipped policy-gradient loss and loss aggregation: GRPO / DAPO / Dr.GRPO base (docs/algorithms.md section 2).

Sources:
- PPO clipped surrogate: Schulman et al. 2017, eq. 7. DAPO clip-higher (decoupled eps_low / eps_high):
  Yu et al. 2025, "DAPO", eq. 10. Dual clip: Ye et al. 2020, "Mastering Complex Control in MOBA Games", eq. 5
  (as in verl `compute_policy_loss`, `clip_ratio_c`).
- KL to the reference with the k3 estimator: Schulman 2020, "Approximating KL Divergence"; GRPO eq. 4; TRL
  `GRPOTrainer._compute_loss` (`per_token_kl = exp(ref - logp) - (ref - logp) - 1`).
- Aggregations: DAPO eq. 10 (token mean), GRPO eq. 3 (sequence mean of token means), Dr.GRPO eq. 3 (sum over
  tokens / (N * T_max)); names as in verl's `agg_loss` (`token-mean`, `seq-mean-token-mean`,
  `seq-mean-token-sum-norm`), TRL `loss_type` = dapo / grpo / dr_grpo.
"""
from __future__ import annotations

import torch

from mmrl.algorithms.registry import AGGREGATIONS, POLICY_LOSSES, UnknownNameError


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref) on sampled tokens: `exp(ref - logp) - (ref - logp) - 1` [N, T]."""
    d = ref_logp - logp  # [N, T]
    return torch.exp(d) - d - 1  # [N, T]


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate loss (to be minimised) plus optional k3 KL; returns (loss [N, T], metrics).

    Args:
        logp: [N, T] log-probs of the sampled tokens under the current policy (carries the gradient).
        old_logp: [N, T] log-probs under the behaviour (rollout) policy; treated as constants.
        advantages: [N] sequence advantages (broadcast over tokens) or [N, T] token advantages (GCPO / DGPO pass
            `A_i * w_it`).
        mask: [N, T] bool, valid response tokens. Padding positions get loss exactly 0 (also when their
            log-probs are -inf or NaN).
        eps_low, eps_high: clip range `[1 - eps_low, 1 + eps_high]`; DAPO's clip-higher is `eps_high = 0.28`.
        dual_clip: `c > 1` bounds the loss of negative-advantage tokens by `-c * A` (verl `clip_ratio_c`); None = off.
        ref_logp: [N, T] reference-policy log-probs for the KL term (required when `beta > 0`).
        beta: KL coefficient.
        kl_weights: [N, T] per-token weights of the KL term (STAGE's and GCPO T2I's `kl_reweight`,
            `mmrl.algorithms.stage`); None = 1 for every token.

    `rho = exp(logp - old_logp)`; `loss = -min(rho * A, clip(rho) * A) + beta * m * k3(logp, ref_logp)`, m the KL
    weights. The `kl` metric is the unweighted k3 mean.

    Metrics (detached scalars, means over valid tokens, TRL's definitions): `clip_ratio/low_mean`
    (rho < 1 - eps_low and A < 0), `clip_ratio/high_mean` (rho > 1 + eps_high and A > 0), `clip_ratio/region_mean`
    (either), `clip_ratio/low_min` / `clip_ratio/high_max` (the lowest / highest per-completion clip fraction, TRL's
    `nanmin` / `nanmax` of the masked sequence means), `kl` (when beta > 0). No deviation from the sources.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1.0 (or None to disable), got {dual_clip}")
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probs of the sampled tokens)")
    mask = mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N, 1] or [N, T]
    adv = adv.to(logp.dtype)
    # padding may hold -inf log-probs; keep it out of exp() so no NaN can reach the gradient
    log_ratio = torch.where(mask, logp - old_logp.detach(), torch.zeros_like(logp))  # [N, T]
    ratio = torch.exp(log_ratio)  # [N, T]
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [N, T]
    loss = -torch.min(ratio * adv, clipped * adv)  # [N, T]
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)  # [N, T]
    metrics: dict[str, torch.Tensor] = {}
    if beta > 0:
        zero = torch.zeros_like(logp)
        kl = k3_kl(torch.where(mask, logp, zero), torch.where(mask, ref_logp.detach(), zero))  # [N, T]
        loss = loss + beta * (kl if kl_weights is None else kl * kl_weights.detach().to(kl.dtype))  # [N, T]
        metrics["kl"] = _masked_mean(kl.detach(), mask)
    loss = torch.where(mask, loss, torch.zeros_like(loss))  # [N, T]
    with torch.no_grad():
        fmask = mask.float()
        low = ((ratio < 1.0 - eps_low) & (adv < 0)).float()  # [N, T]
        high = ((ratio > 1.0 + eps_high) & (adv > 0)).float()  # [N, T]
        metrics["clip_ratio/low_mean"] = _masked_mean(low, fmask)
        metrics["clip_ratio/high_mean"] = _masked_mean(high, fmask)
        metrics["clip_ratio/region_mean"] = _masked_mean(torch.maximum(low, high), fmask)
        # TRL's extremes over completions: the per-completion (masked sequence mean) clip fractions
        count = fmask.sum(-1)  # [N]
        has = count > 0
        if bool(has.any()):
            seq_low = (low * fmask).sum(-1)[has] / count[has]  # [N']
            seq_high = (high * fmask).sum(-1)[has] / count[has]  # [N']
            metrics["clip_ratio/low_min"] = seq_low.min()
            metrics["clip_ratio/high_max"] = seq_high.max()
    return loss, metrics


@AGGREGATIONS.register("token_mean")
def _token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, *, num_items: float | None = None, max_len: int | None = None) -> torch.Tensor:
    denom = mask.sum().clamp(min=1) if num_items is None else torch.as_tensor(float(num_items)).clamp(min=1.0)
    return (per_token_loss * mask).sum() / denom


@AGGREGATIONS.register("seq_mean_token_mean")
def _seq_mean_token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, *, num_items: float | None = None, max_len: int | None = None) -> torch.Tensor:
    per_seq = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.mean()


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def _seq_mean_token_sum_norm(per_token_loss: torch.Tensor, mask: torch.Tensor, *, num_items: float | None = None, max_len: int | None = None) -> torch.Tensor:
    n, t = per_token_loss.shape
    return (per_token_loss * mask).sum() / (n * (t if max_len is None else max_len))


LOSS_TYPES = {"dapo": "token_mean", "grpo": "seq_mean_token_mean", "dr_grpo": "seq_mean_token_sum_norm", "bnpo": "token_mean",
              "cispo": "token_mean"}
"""TRL `loss_type` name -> aggregation mode of one micro-batch (`cispo`: TRL's, the global token mean). `dapo` and `bnpo` both take a token mean; they
differ across micro-batches: `dapo` divides by the tokens of the whole accumulated batch (`num_items`), `bnpo` (TRL's
name; the token mean d1 / DMPO's pinned TRL takes) by each micro-batch's own tokens, the optimizer step then
averaging the micro-batch means."""


def surrogate_loss(loss_type: str):
    """The per-token policy loss of a `loss_type`: its `POLICY_LOSSES` entry (e.g. `cispo`), else the clipped
    surrogate `policy_loss` (grpo, dapo, dr_grpo, bnpo and the aggregation modes)."""
    return POLICY_LOSSES[loss_type] if loss_type in POLICY_LOSSES else policy_loss


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_items: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [N, T] over valid tokens `mask` [N, T] to a scalar.

    - `"token_mean"` (DAPO; TRL `loss_type="dapo"`): sum over valid tokens / number of valid tokens.
    - `"seq_mean_token_mean"` (GRPO; TRL `"grpo"`): mean over sequences of each sequence's token mean; a sequence
      without valid tokens counts as 0 (as in TRL).
    - `"seq_mean_token_sum_norm"` (Dr.GRPO; TRL `"dr_grpo"`): sum over valid tokens / (N * T).
    - TRL `"bnpo"`: `"token_mean"` of the micro-batch alone (the trainer averages micro-batches).

    TRL's `loss_type` names (dapo, grpo, dr_grpo) are accepted as aliases. Options for gradient accumulation:
    `num_items` replaces the token count of `token_mean` (TRL normalises by the tokens of the whole accumulated
    batch; the trainer passes that count), `max_len` replaces T in `seq_mean_token_sum_norm` (TRL uses
    `max_completion_length`). Unknown mode: `ValueError` listing the valid ones.
    """
    if mode not in LOSS_TYPES and mode not in AGGREGATIONS:
        raise UnknownNameError(
            f"unknown aggregation mode {mode!r}; valid: {sorted(AGGREGATIONS)} or TRL loss_type names {sorted(LOSS_TYPES)}"
        )
    fn = AGGREGATIONS[LOSS_TYPES.get(mode, mode)]
    return fn(per_token_loss, mask.to(per_token_loss.dtype), num_items=num_items, max_len=max_len)


def accumulated_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    global_tokens: float,
    global_seqs: float,
    max_len: int,
) -> torch.Tensor:
    """The share of one micro-batch [n, T] in the loss of the whole (global, accumulated) batch, a scalar.

    Summed over the micro-batches of every process, the shares equal `aggregate` over the global batch (TRL's
    gradient accumulation): `token_mean` divides by the global token count; the per-sequence modes take this
    micro-batch's mean and weight it by `n / global_seqs`. `loss_type` is a TRL name or an aggregation mode.
    """
    n = float(per_token_loss.shape[0])
    mode = LOSS_TYPES.get(loss_type, loss_type)
    if loss_type == "bnpo":  # each micro-batch's own token mean, averaged over the micro-batches (d1's TRL)
        return aggregate(per_token_loss, mask, "token_mean") * n / global_seqs
    if mode == "token_mean":
        return aggregate(per_token_loss, mask, "token_mean", num_items=global_tokens)
    if mode == "seq_mean_token_mean":
        return aggregate(per_token_loss, mask, "seq_mean_token_mean") * n / global_seqs
    return aggregate(per_token_loss, mask, "seq_mean_token_sum_norm", max_len=max_len) * n / global_seqs
