"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1, Chen et al. 2025, arXiv 2506.13585,
eq. 4-5), a registered policy loss (`loss_type=cispo`, TRL's spelling; docs/algorithms.md section 2)."""
from __future__ import annotations

import torch

from mmrl.algorithms.policy_loss import k3_kl
from mmrl.algorithms.registry import POLICY_LOSSES


@POLICY_LOSSES.register("cispo")
def cispo_loss(
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
    """Per-token CISPO loss `-sg(min(rho, 1 + eps_high)) * A * logp` (+ `beta * k3`) [N, T] and metrics.

    MiniMax-M1 eq. 4: `J = E[sum_it sg(r_hat_it) A_it log pi(o_it)] / sum_i |o_i|`, `r_hat = clip(rho, 1 - eps_low^IS,
    1 + eps_high^IS)` (eq. 5), with no lower bound in their runs (a large eps_low^IS): the weight is clipped from
    above only, and every token keeps a gradient (unlike PPO's clip, which drops it). The token-mean over the batch
    comes from `LOSS_TYPES["cispo"]`. Shapes and arguments as `policy_loss` (`kl_weights`: per-token weights of the KL term); `eps_low` and `dual_clip` do not apply
    (the weight is bounded already). Deviation from TRL 1.16: TRL clamps at `epsilon_high` itself
    (`torch.clamp(coef_1, max=epsilon_high)`), here at `1 + epsilon_high`, the paper's bound and mmrl's meaning of
    `epsilon_high` everywhere else (TRL's `epsilon_high=5.0` is mmrl's `epsilon_high=4.0`).

    Metrics: `cispo_clip_ratio` (TRL's name: tokens with rho > 1 + eps_high and A > 0, mean over valid tokens) and
    `kl` when beta > 0.
    """
    if eps_high < 0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (the reference policy's log-probs of the sampled tokens)")
    mask = mask.bool()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N, 1] or [N, T]
    adv = adv.to(logp.dtype)
    zero = torch.zeros_like(logp)
    log_ratio = torch.where(mask, logp.detach() - old_logp.detach(), zero)  # [N, T] (padding kept out of exp)
    ratio = torch.exp(log_ratio)  # [N, T]
    weight = torch.clamp(ratio, max=1.0 + eps_high)  # [N, T] sg(r_hat): no gradient through the weight
    loss = -weight * adv * torch.where(mask, logp, zero)  # [N, T]
    metrics: dict[str, torch.Tensor] = {}
    fmask = mask.to(logp.dtype)
    if beta > 0:
        kl = k3_kl(torch.where(mask, logp, zero), torch.where(mask, ref_logp.detach(), zero))  # [N, T]
        loss = loss + beta * (kl if kl_weights is None else kl * kl_weights.detach().to(kl.dtype))  # [N, T]
        metrics["kl"] = (kl.detach() * fmask).sum() / fmask.sum().clamp(min=1)
    loss = torch.where(mask, loss, zero)  # [N, T]
    with torch.no_grad():
        clipped = ((ratio > 1.0 + eps_high) & (adv > 0)).to(logp.dtype)  # [N, T]
        metrics["cispo_clip_ratio"] = (clipped * fmask).sum() / fmask.sum().clamp(min=1)
    return loss, metrics
