"""Per-step RL diagnostics logged under `diag/` (docs/design.md, "Diagnostics"; README.md, "Metrics").

Small pure functions of tensors, plus the glue that turns per-micro-batch sums into step metrics:

- `sample_kl`: KL(pi_theta || pi_ref) estimated on the sampled responses (k1 and Schulman's k3).
- `weight_mass`: the fractions of the signed weight mass the loss puts on raising (positive) and lowering
  (negative, unlikelihood) the log-likelihood of the sampled tokens.
- `effective_sample_size`: Kish's normalised ESS of nonnegative weights (DMPO's `dmpo/ess` uses it).
- `update_ratio`: ||theta_after - theta_before|| / ||theta_before|| of one optimizer step.

A method's loss reports `micro_batch_sums(...)` as per-micro-batch metrics; the trainer averages metrics over
micro-batches weighted by their row count, so a sum divided by the row count comes out as the step's total over the
step's rows, and `finish_step_metrics` turns the totals into exact ratios over the whole step (token means, mass
fractions). Only the first process's numbers are logged (like the other metrics).
"""
from __future__ import annotations

from typing import Sequence

import torch

PREFIX = "diag/"
"""Prefix of the diagnostic metric keys; `diag/_...` keys are running sums that `finish_step_metrics` consumes."""

def sample_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """KL(pi_theta || pi_ref) estimated on tokens sampled from (approximately) pi_theta.

    Per token, with `d = ref_logp - logp`: k1 = -d (unbiased, can be negative) and k3 = exp(d) - d - 1 (Schulman
    2020, "Approximating KL divergence": unbiased and >= 0; TRL's and `mmrl.algorithms.policy_loss.k3_kl`'s KL).

    Args:
        logp: [N, T] log-probs of the sampled tokens under the policy.
        ref_logp: [N, T] log-probs of the same tokens under the reference (base) model.
        mask: [N, T] bool, the valid response tokens.

    Returns scalars: `k1`, `k3` (token means over the mask), `k1_seq`, `k3_seq` (per-response sums, mean over the
    N responses: the sequence-level KL), `tokens` (valid token count).
    """
    m = mask.bool()  # [N, T]
    d = torch.where(m, ref_logp.float() - logp.float(), torch.zeros((), device=logp.device))  # [N, T]
    k1 = -d  # [N, T]
    k3 = torch.expm1(d) - d  # [N, T] exp(d) - 1 - d, 0 where masked
    tokens = m.sum()
    n = max(int(m.shape[0]), 1)
    return {"k1": k1.sum() / tokens.clamp(min=1), "k3": k3.sum() / tokens.clamp(min=1),
            "k1_seq": k1.sum() / n, "k3_seq": k3.sum() / n, "tokens": tokens.float()}


def weight_mass(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Positive and negative mass of the signed weights the loss multiplies the log-likelihood gradient by.

    The policy-gradient family's weights are the token advantages `A_i * w_it` (GRPO: `w = 1`; GCPO, DGPO: token
    weights); DMPO's are the per-response WDCE weights `w_i - baseline`. Positive weight raises the likelihood of
    a sampled token, negative weight lowers it (unlikelihood).

    Args:
        weights: [N] per-response weights (broadcast over the tokens) or [N, T] per-token weights.
        mask: [N, T] bool, the valid tokens.

    Returns scalars: `pos`, `neg` (sums of max(w, 0) and max(-w, 0) over valid tokens), `pos_frac`, `neg_frac`
    (pos / (pos + neg), neg / (pos + neg); they sum to 1, both 0 when every weight is 0: no update signal).
    """
    m = mask.bool()  # [N, T]
    w = (weights[:, None] if weights.dim() == 1 else weights).float().expand(m.shape)  # [N, T]
    zero = torch.zeros((), device=w.device)
    pos = torch.where(m, w.clamp(min=0), zero).sum()
    neg = torch.where(m, (-w).clamp(min=0), zero).sum()
    return {"pos": pos, "neg": neg, **_fractions(pos, neg)}


def _fractions(pos: torch.Tensor | float, neg: torch.Tensor | float) -> dict:
    total = pos + neg
    if float(total) <= 0:
        return {"pos_frac": pos * 0.0, "neg_frac": neg * 0.0}
    return {"pos_frac": pos / total, "neg_frac": neg / total}


@torch.no_grad()
def effective_sample_size(w: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """Kish's effective sample size `(sum w)^2 / sum w^2` of nonnegative weights, divided by their count n: in
    [1/n, 1], 1 for equal weights, 1/n when one weight holds all the mass (0 when all are 0).

    Args:
        w: [..., n] weights (or [N] with `group_size`).
        group_size: when given, w [N] is split into groups of this size (contiguous) and one ESS per group returned.

    Returns [...] (or [N / group_size]). For DMPO's weights, which sum to 1 per group, this is the authors'
    `1 / (G * sum_i w_i^2)` (`dmpo/ess`, `mmrl.algorithms.dmpo`).
    """
    w = w.float()
    if group_size is not None:
        w = w.reshape(-1, group_size)  # [B, G]
    n = w.shape[-1]
    return w.sum(-1).square() / (n * w.square().sum(-1)).clamp(min=1e-12)


def update_size(before: list[torch.Tensor], after: Sequence[torch.Tensor]) -> dict[str, float]:
    """The size of one update, in one pass over the weights: `global` = `||theta_after - theta_before|| /
    ||theta_before||` (L2 over all the tensors), `max` = the largest per-tensor ratio (over tensors with a nonzero norm
    before: LoRA's B starts at 0), and `abs_mean` = `mean |theta_after - theta_before|` over every element (divided by
    the learning rate, about 1 for the first steps of a fresh AdamW, where every weight moves by about lr; less when
    the second moments are larger than the gradients, `init_optimizer_from_base`).

    Consumes `before` (the `snapshot` copies, overwritten with the differences): no second copy of the weights, and
    the norms run as multi-tensor kernels (`torch._foreach_norm`) instead of three Python loops over float32 copies
    (the diagnostics' cost is measured by benchmarks/diagnostics_overhead.py, issue 29).

    Args:
        before: the trainable tensors before the optimizer step (`snapshot`'s copies, in the weights' dtype). The
            difference is taken in that dtype: exact where the old and new value are within a factor of 2 of each
            other (Sterbenz's lemma), which a small step gives for nearly every weight, rounded to the dtype's
            precision for a weight that crosses or leaves zero; the norms accumulate and return in float32.
        after: the same tensors after the step, in the same order.
    """
    if not before:
        return {"global": 0.0, "max": 0.0, "abs_mean": 0.0}
    f32 = torch.float32
    base = [float(x) ** 2 for x in torch._foreach_norm(before, 2, dtype=f32)]  # ||theta_before||^2 per tensor
    torch._foreach_sub_(before, [a.detach() for a in after])  # before <- before - after
    diff = [float(x) ** 2 for x in torch._foreach_norm(before, 2, dtype=f32)]  # ||update||^2 per tensor
    l1 = sum(float(x) for x in torch._foreach_norm(before, 1, dtype=f32))  # sum |update|
    worst = max([(d / b) ** 0.5 for d, b in zip(diff, base) if b > 0], default=0.0)
    total = sum(base)
    return {"global": (sum(diff) / total) ** 0.5 if total > 0 else 0.0, "max": worst,
            "abs_mean": l1 / max(sum(b.numel() for b in before), 1)}


# ------------------------------------------------------------------------------------------ step metrics


def micro_batch_sums(mask: torch.Tensor, weights: torch.Tensor | None = None, logp: torch.Tensor | None = None,
                     ref_logp: torch.Tensor | None = None) -> dict[str, float]:
    """One micro-batch's contribution to the step's diagnostics, as per-row densities (sum / rows).

    Args:
        mask: [n, T] bool valid loss tokens.
        weights: [n] or [n, T] signed weights of the loss (see `weight_mass`), or None.
        logp, ref_logp: [n, T] policy (before this step's update) and reference log-probs of the sampled tokens;
            no KL without `ref_logp`.
    """
    with torch.no_grad():
        n = max(int(mask.shape[0]), 1)
        out: dict[str, float] = {}
        if weights is not None:
            wm = weight_mass(weights.detach(), mask)
            out[PREFIX + "_pos"], out[PREFIX + "_neg"] = float(wm["pos"]) / n, float(wm["neg"]) / n
        if logp is not None and ref_logp is not None:
            kl = sample_kl(logp.detach(), ref_logp.detach(), mask)
            out[PREFIX + "_tokens"] = float(kl["tokens"]) / n
            out[PREFIX + "_k1"], out[PREFIX + "_k3"] = float(kl["k1"] * kl["tokens"]) / n, float(kl["k3"] * kl["tokens"]) / n
            out[PREFIX + "kl_k1_seq"], out[PREFIX + "kl_k3_seq"] = float(kl["k1_seq"]), float(kl["k3_seq"])
        return out


def snapshot(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the trainable tensors before the optimizer step (one extra copy of the trainable weights, on their
    device), for `update_ratio`."""
    return [p.detach().clone() for p in params]


def finish_step_metrics(metrics: dict[str, float], before: list[torch.Tensor] | None,
                        params: Sequence[torch.Tensor]) -> None:
    """In place: turn the `diag/_...` step totals of `micro_batch_sums` into `diag/kl_k1`, `diag/kl_k3`,
    `diag/pos_weight_frac`, `diag/neg_weight_frac`, and add `diag/update_ratio(_max)` and `diag/update_abs_mean` when
    `before` was taken."""
    sums = {k[len(PREFIX) + 1:]: metrics.pop(k) for k in [k for k in metrics if k.startswith(PREFIX + "_")]}
    if "pos" in sums:
        fr = _fractions(sums["pos"], sums["neg"])
        metrics[PREFIX + "pos_weight_frac"], metrics[PREFIX + "neg_weight_frac"] = fr["pos_frac"], fr["neg_frac"]
    if "tokens" in sums:
        tokens = max(sums["tokens"], 1e-12)
        metrics[PREFIX + "kl_k1"], metrics[PREFIX + "kl_k3"] = sums["k1"] / tokens, sums["k3"] / tokens
    if before is not None:
        r = update_size(before, params)  # (consumes the snapshot)
        metrics[PREFIX + "update_ratio"], metrics[PREFIX + "update_ratio_max"] = r["global"], r["max"]
        metrics[PREFIX + "update_abs_mean"] = r["abs_mean"]


def logged_step(cfg, step: int) -> bool:
    """Whether optimizer step `step` (1-based) writes metrics (`logging_steps`, and always the last step)."""
    return step % cfg.logging_steps == 0 or step == cfg.max_steps


def wants_diagnostic_reference(cfg, policy) -> bool:
    """Whether to build a frozen reference for `diag/kl_*` alone: only when asked (`diagnostics_reference`), with
    `log_diagnostics` on, no reference yet and no LoRA (its reference is the adapter-disabled base).

    Off by default: the copy doubles the weights in memory and its forward ran every rollout (3.8 s of a 25 s GRPO
    beta-0 step on the 28M causal-LM benchmark, issue 29), so by default the KL is logged only where a reference
    exists anyway (beta > 0, DGPO, DMPO, LoRA), as TRL logs `kl` only with beta > 0."""
    if not (cfg.log_diagnostics and cfg.diagnostics_reference) or cfg.use_peft or policy.has_reference:
        return False
    return True


def measures_kl(cfg, rollout_index: int) -> bool:
    """Whether the buffer of rollout `rollout_index` (0-based) measures the `diag/kl_*` that need forwards the method
    would not otherwise run (a reference forward with beta = 0, DMPO's per-token scores): every
    `diagnostics_kl_every`-th rollout, the first included. The KL a KL term or DGPO's reference pass gives for free is
    logged on every step regardless."""
    return bool(cfg.log_diagnostics) and rollout_index % cfg.diagnostics_kl_every == 0
