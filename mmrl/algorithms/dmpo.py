"""DMPO: importance weights, weight baselines, WDCE and WDDO losses (docs/algorithms.md section 5).

Paper: Zhu, Guo, Choi, Molodyk, Yuan, Tao, Chen, "Enhancing Reasoning for Diffusion LLMs via Distribution
Matching Policy Optimization", arXiv 2510.08233v3 (DMPO). Code: github.com/yuchen-zhu-zyc/DMPO
(`dmpo_trainer.py`). DMPO fits p_theta to the reward-tilted target `p*(o|q) ∝ p_ref(o|q) exp(r(q,o)/alpha)` by
minimising the forward KL(p* || p_theta) with self-normalised importance samples from the behaviour policy v.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mmrl.algorithms.groups import check_group_size, group_softmax, to_groups
from mmrl.algorithms.registry import DMPO_BASELINES
from mmrl.core.diagnostics import effective_sample_size  # noqa: F401  (re-exported: Kish's ESS, one definition)


def _check_alpha(alpha: float) -> None:
    if not alpha > 0:
        raise ValueError(f"alpha (the reward temperature of the DMPO target) must be > 0, got {alpha}")


@torch.no_grad()
def dmpo_weights(
    rewards: torch.Tensor,
    log_ref_minus_v: torch.Tensor,
    group_size: int,
    *,
    alpha: float = 0.04,
    coeff: float = 1.0,
) -> torch.Tensor:
    """Self-normalised importance weights w [N] of the target p*, summing to 1 within each group.

    DMPO eq. 10: `l_i = coeff * (r_i / alpha + log p_ref(o_i) - log p_v(o_i))`, `w = softmax(l)` over the G
    responses of the same prompt (an empirical estimate of the partition function Z(q)).

    Args:
        rewards: [N] scalar rewards.
        log_ref_minus_v: [N] sequence log-likelihood ratio of the reference vs the behaviour policy (ELBO
            estimates with shared masks for masked-diffusion models, exact sums for autoregressive models).
        group_size: G.
        alpha: reward temperature (authors' yaml: 0.04).
        coeff: proximal coefficient c in [0, 1] (App. B.2, `coeff` in the code); 1 = plain DMPO.
    """
    _check_alpha(alpha)
    logits = coeff * (rewards.float() / alpha + log_ref_minus_v.float())  # [N]
    return group_softmax(logits, group_size)  # [N]


@DMPO_BASELINES.register("none")
def _baseline_none(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v):
    check_group_size(rewards.shape[0], group_size)
    return torch.zeros(rewards.shape[0], dtype=torch.float32, device=rewards.device)  # [N]


@DMPO_BASELINES.register("group")
def _baseline_group(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v):
    check_group_size(rewards.shape[0], group_size)
    return torch.full((rewards.shape[0],), 1.0 / group_size, dtype=torch.float32, device=rewards.device)  # [N]


@DMPO_BASELINES.register("individual")
def _baseline_individual(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v):
    _check_alpha(alpha)
    logits = coeff * (log_ref_minus_v.float() - rewards.float() / alpha)  # [N] "bad target" p ∝ p_ref e^{-r/alpha}
    return group_softmax(logits, group_size)  # [N]


@DMPO_BASELINES.register("model")
def _baseline_model(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v):
    if log_theta_minus_v is None:
        raise ValueError("the 'model' baseline needs log_theta_minus_v (detached ELBO_theta - ELBO_v per response)")
    return group_softmax(log_theta_minus_v.detach().float(), group_size)  # [N]


@DMPO_BASELINES.register("correct_only")
def _baseline_correct_only(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v):
    """w_base = w * 1[r <= 0] [N]: with strength 1 and the baseline subtracted, `w_real = w * 1[r > 0]` >= 0, so
    under a 1 / 0 correctness reward every wrong answer gets weight 0 and a group with no right answer contributes
    nothing (with "none" such a group fits its own wrong answers at 1/G each). Ours, not the paper's: issue 24 item
    5's "fully-solved 1 / 0 reward so positive weight lands only on correct answers"."""
    w = dmpo_weights(rewards, log_ref_minus_v, group_size, alpha=alpha, coeff=coeff)  # [N]
    return w * (rewards <= 0).to(w.dtype)  # [N]


@torch.no_grad()
def dmpo_baseline(
    kind: str,
    *,
    rewards: torch.Tensor,
    log_ref_minus_v: torch.Tensor,
    group_size: int,
    alpha: float = 0.04,
    coeff: float = 1.0,
    log_theta_minus_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weight baseline w_base [N] subtracted from the DMPO weights: `w_real = w - strength * w_base`.

    DMPO section 3.3 ("negative gradient insertion"); the paper writes weights that average 1 (`N * softmax`),
    we keep the code's softmax that sums to 1, so every baseline is divided by G accordingly.

    - `"none"`: zeros (plain WDCE; fails at small batch, paper Fig. 4).
    - `"group"` (eq. 13): `1/G`.
    - `"individual"` (eq. 14; the authors' code default): `softmax(coeff * (log_ref_minus_v - r / alpha))` in the group.
    - `"correct_only"` (ours): `w * 1[r <= 0]`, so `w_real = w * 1[r > 0]`: weight only on right answers of a
      1 / 0 reward, none on wrong ones (also in a group with no right answer, where "none" gives each 1/G).
    - `"model"` (eq. 15): `softmax(log_theta_minus_v)` in the group, the detached ELBO of the current model minus
      the stored one. Deviation: the authors' code takes this softmax over the per-device batch; we take it over
      the group, which does not depend on how a group is split across devices.
    """
    fn = DMPO_BASELINES[kind]
    return fn(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v)


def micro_batch_mean_baseline(w: torch.Tensor) -> torch.Tensor:
    """The authors' code's group baseline: the mean of the weights w [n] of one per-device micro-batch, for every
    row of it ([n]). Authors' code: yuchen-zhu-zyc/DMPO dmpo_trainer.py `compute_loss` with `advantage_centering`
    subtracts `advantages.mean()` over the local batch. A micro-batch holds a fraction of a group (8 of 16 rows in
    the released recipe), so this is sum_{rows} w / n, anywhere between 0 and 1/n, where the paper's eq. 13 gives
    exactly 1/G (`"group"`)."""
    return w.detach().float().mean().expand(w.shape[0])  # [n]


LOSS_TIME_BASELINES = ("model", "micro_batch_mean")
"""Baselines computed at loss time from the micro-batch (not stored in the buffer by `dmpo_baseline`)."""


DEFAULT_MIN_MASK_RATE = 0.1
"""Lower end of the WDCE mask rate (authors' code `loss_mask_prob_clamp`; the config's `dmpo_min_mask_rate`)."""


def antithetic_masks(
    maskable: torch.Tensor,
    num_copies: int,
    generator: torch.Generator | None = None,
    *,
    min_rate: float = DEFAULT_MIN_MASK_RATE,
    antithetic: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random masks for the R noised copies of each response: (masked [R, N, T] bool, rates [R, N]).

    Each copy masks every maskable position i.i.d. with rate `lambda = min_rate + (1 - min_rate) * U`,
    `U ~ U(0, 1)` per (copy, response) (authors' code `loss_mask_prob_clamp`: range [0.1, 1.0]). With
    `antithetic=True` copies come in pairs: copy `R/2 + k` masks exactly the maskable positions copy `k` left
    unmasked (rate `1 - lambda`), so each token is masked exactly once per pair. `maskable` [N, T] marks the
    response positions (the prompt is never in it). `num_copies` must be even when antithetic.
    """
    if num_copies < 1:
        raise ValueError(f"num_copies must be >= 1, got {num_copies}")
    if antithetic and num_copies % 2:
        raise ValueError(f"antithetic masks come in pairs: num_copies must be even, got {num_copies}")
    if not 0.0 <= min_rate <= 1.0:
        raise ValueError(f"min_rate must be in [0, 1], got {min_rate}")
    maskable = maskable.bool()
    n, t = maskable.shape
    draws = num_copies // 2 if antithetic else num_copies
    dev = maskable.device
    u = torch.rand((draws, n), generator=generator, device=dev)  # [R', N]
    rates = min_rate + (1.0 - min_rate) * u  # [R', N]
    masked = (torch.rand((draws, n, t), generator=generator, device=dev) < rates[..., None]) & maskable  # [R', N, T]
    if antithetic:
        masked = torch.cat([masked, ~masked & maskable], dim=0)  # [R, N, T]
        rates = torch.cat([rates, 1.0 - rates], dim=0)  # [R, N]
    return masked, rates


def copy_elbos(masked_logp_sum: torch.Tensor, n_masked: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """Per-copy sequence ELBO estimates [R, N]: `sum_masked log p * |o| / m` for each of the R masked copies.

    DMPO code `compute_log_prob_elbo` (LLaDA's likelihood estimator with the 1/t weight, t = m/|o|):
    `masked_logp_sum` [R, N] sums log p_theta(o_d | masked input) over the masked positions of each copy,
    `n_masked` [R, N] counts them (clamped >= 1), `n_tokens` [N] is the response length |o|.
    """
    return masked_logp_sum * n_tokens.to(masked_logp_sum.dtype) / n_masked.clamp(min=1)  # [R, N]


def elbo_from_masked_logp(masked_logp_sum: torch.Tensor, n_masked: torch.Tensor, n_tokens: torch.Tensor) -> torch.Tensor:
    """Sequence ELBO estimate [N] from R masked copies: the mean over copies of `copy_elbos`."""
    return copy_elbos(masked_logp_sum, n_masked, n_tokens).mean(0)  # [N]


def dmpo_real_weights(w: torch.Tensor, w_base: torch.Tensor, strength: float, negative_scale: float = 1.0) -> torch.Tensor:
    """The weights WDCE uses [N]: `d = w - strength * w_base` (DMPO section 3.3, negative gradient insertion), then
    `w_real = max(d, 0) + negative_scale * min(d, 0)`.

    Responses weighted below their baseline get a negative weight, i.e. their likelihood is pushed down; nothing
    bounds that push (the likelihood of a response can fall without limit). `negative_scale = 1` is the paper;
    smaller values shrink the unlikelihood term and 0 removes it (only above-baseline responses are fitted, as in
    rejection-sampling fine-tuning), a deviation measured on the tiny world (docs/RESULTS.md, "Reasoning RL")."""
    d = w - strength * w_base  # [N]
    return d.clamp(min=0) + negative_scale * d.clamp(max=0)  # [N]


def dmpo_trust_region_gate(w_real: torch.Tensor, log_ratio: torch.Tensor, delta: float) -> torch.Tensor:
    """Which responses keep their WDCE gradient [N] bool under a per-response trust region of `delta` nats.

    A deviation from DMPO (ours; PPO's clipped surrogate, Schulman et al. 2017, eq. 7, carried over to a weighted
    likelihood): with the weights fixed at rollout time and F > 1 optimizer steps per rollout batch, WDCE keeps
    pushing an above-baseline response up and a below-baseline one down however far the policy has already moved
    them. `log_ratio` [N] is the current minus the behaviour log-likelihood per response token (detached); a
    positive weight stops acting once `log_ratio > delta`, a negative one once `log_ratio < -delta`, exactly as
    PPO's clip zeroes the gradient of a token whose ratio left [1 - eps, 1 + eps] in the direction of its advantage.
    The unlikelihood push on the model's own wrong answers is then bounded by `delta` per token per rollout batch.
    """
    if not delta > 0:
        raise ValueError(f"the DMPO trust region delta must be > 0 nats per token, got {delta}")
    if w_real.shape != log_ratio.shape or w_real.dim() != 1:
        raise ValueError(f"w_real and log_ratio must both be [N]; got {tuple(w_real.shape)} and {tuple(log_ratio.shape)}")
    lr = log_ratio.detach()
    return ((w_real > 0) & (lr <= delta)) | ((w_real < 0) & (lr >= -delta)) | (w_real == 0)  # [N]


def wddo_deltas(elbo_theta: torch.Tensor, elbo_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Delta [N], Delta' [N]) of WDDO from per-copy ELBOs `elbo_theta` [R, N] and the stored `elbo_v` [N].

    DMPO section 3.4 / the authors' `ddo` loss: `Delta` averages the first half of the (antithetic) copies and
    `Delta'` the complementary half, so the two terms use independent masks; with one copy both use it."""
    R = elbo_theta.shape[0]
    half = max(1, R // 2)
    delta_real = elbo_theta[:half].mean(0) - elbo_v  # [N]
    delta_fake = (elbo_theta[half:] if R > 1 else elbo_theta).mean(0) - elbo_v  # [N]
    return delta_real, delta_fake


def correct_token_mask(response_ids: torch.Tensor, answer_ids: torch.Tensor, maskable: torch.Tensor) -> torch.Tensor:
    """Which response tokens are right [N, T] bool: `maskable & (response_ids == answer_ids)`.

    Ours, not the paper's: issue 24 item 5's control "restrict the WDCE loss to correctly filled cells". For an
    infilling task whose response span is the answer itself, one token per cell (sudoku4: 16 cells, one digit token
    each), `answer_ids` [N, T] is the solution written as a response span (the same tokenisation and positions as
    `response_ids` [N, T]) and `maskable` [N, T] marks the tokens the policy chose (the blank cells; given cells and
    padding are False). A blank cell filled with the solution's digit is True; a wrong digit, a given cell and
    padding are False.
    """
    if response_ids.shape != answer_ids.shape or response_ids.shape != maskable.shape or response_ids.dim() != 2:
        raise ValueError(f"response_ids, answer_ids and maskable must all be [N, T]; got {tuple(response_ids.shape)}, "
                         f"{tuple(answer_ids.shape)}, {tuple(maskable.shape)}")
    return maskable.bool() & (response_ids == answer_ids.to(response_ids.device))  # [N, T]


def token_masked_sum(token_logp: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per-copy sums [R, N] of the masked log-likelihood terms `token_logp` [R, N, T] over the tokens `keep` [N, T]
    (bool) only: `sum_d keep[i, d] * token_logp[r, i, d]`.

    With `keep` = `correct_token_mask`, WDCE (eq. 11) then fits only the right cells of each response: the CE of a
    masked wrong cell is dropped, the normaliser (the copy's number of masked tokens, `wdce_loss`'s `n_masked`) is
    kept, so a response's term is its weight times the mean CE over its masked tokens with the wrong ones counted as
    0 (a response with no right cell contributes nothing). The wrong cells stay in the denoiser's input as context.
    """
    if token_logp.dim() != 3 or token_logp.shape[1:] != keep.shape:
        raise ValueError(f"token_logp must be [R, N, T] and keep [N, T]; got {tuple(token_logp.shape)} and {tuple(keep.shape)}")
    return (token_logp * keep.to(device=token_logp.device, dtype=token_logp.dtype)[None]).sum(-1)  # [R, N]


def wdce_loss(masked_ce_sum: torch.Tensor, n_masked: torch.Tensor, w_real: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Weighted denoising cross-entropy (DMPO eq. 11), a scalar.

    `loss = (1/num_groups) * sum_i w_real_i * mean_r(masked_ce_sum[r, i] / n_masked[r, i])`.

    Args:
        masked_ce_sum: [R, N] sum over the masked positions of copy r of `-log p_theta(o_d | masked input)`
            (carries the gradient).
        n_masked: [R, N] number of masked positions (clamped >= 1).
        w_real: [N] constant weights `w - strength * w_base` (each group's w sums to 1).
        num_groups: number of prompts the weights were normalised over.

    Deviations from the authors' code: the code sums over the local batch; dividing by the number of groups makes
    the scale independent of the batch size (a constant factor). Like the code, the CE is divided by the realised
    number of masked tokens m, not by the mask rate (the constant |o| is dropped). For autoregressive models R = 1,
    `n_masked = 1` and `masked_ce_sum` is the sequence NLL: WDCE becomes weighted NLL.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if masked_ce_sum.dim() != 2 or masked_ce_sum.shape != n_masked.shape or masked_ce_sum.shape[1] != w_real.shape[0]:
        raise ValueError(
            f"expected masked_ce_sum and n_masked [R, N] and w_real [N]; got {tuple(masked_ce_sum.shape)}, "
            f"{tuple(n_masked.shape)}, {tuple(w_real.shape)}"
        )
    per_sample = (masked_ce_sum / n_masked.clamp(min=1).to(masked_ce_sum.dtype)).mean(0)  # [N]
    return (w_real.detach().to(per_sample.dtype) * per_sample).sum() / num_groups


def wddo_loss(
    delta_real: torch.Tensor,
    delta_fake: torch.Tensor,
    w: torch.Tensor,
    *,
    beta: float = 1.0,
    alpha_ddo: float = 1.0,
) -> torch.Tensor:
    """Weighted direct discriminative optimisation (DMPO section 3.4, WDDO), a scalar.

    `loss = -mean_i[w_i * logsigmoid(beta * Delta_i)] - alpha_ddo * mean_i[logsigmoid(-beta * Delta'_i)]`,
    `Delta = ELBO_theta(o) - ELBO_v(o)` on one half of the antithetic masks (`delta_real` [N]) and `Delta'` on the
    complementary half (`delta_fake` [N]), both carrying the gradient through ELBO_theta; `w` [N] are the DMPO
    weights (no baseline). Follows the authors' code (`loss: ddo`, `ddo_beta = ddo_alpha = 1`, independent halves);
    the `.mean()` over responses scales the weighted term by 1/N relative to the paper, absorbed by `alpha_ddo`.
    """
    if not (delta_real.shape == delta_fake.shape == w.shape) or w.dim() != 1:
        raise ValueError(
            f"delta_real, delta_fake and w must all be [N]; got {tuple(delta_real.shape)}, {tuple(delta_fake.shape)}, {tuple(w.shape)}"
        )
    real = w.detach().to(delta_real.dtype) * F.logsigmoid(beta * delta_real)  # [N]
    fake = F.logsigmoid(-beta * delta_fake)  # [N]
    return -real.mean() - alpha_ddo * fake.mean()
