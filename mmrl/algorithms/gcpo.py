"""GCPO: guidance-contrastive token weights (docs/algorithms.md section 3).

Paper: Li, Kallidromitis, Gokul, Kyuragi, Grover, "Guidance Contrastive Token Credit Assignment for Discrete
Policy Optimization", arXiv 2605.29198 (GCPO). Code: github.com/jacklishufan/gcpo (`dp_actor.py` and
`t2i/.../importance.py`, `compute_importance_weights`).

The token weight measures how much the prompt matters for the sampled token: the same current policy scores
the response under the positive prompt and under a negative condition (CFG null prompt for images, a
"generate an incorrect answer" instruction for text). Tokens whose probability moves most get most credit;
the token advantage is `A_it = A_i * w_it` for both signs of `A_i` (the paper's eq. 6 as implemented).
"""
from __future__ import annotations

import torch

from mmrl.algorithms.registry import GCPO_DIVERGENCES, TOKEN_WEIGHTS


@GCPO_DIVERGENCES.register("k3")
def _k3(logp_pos: torch.Tensor, logp_neg: torch.Tensor) -> torch.Tensor:
    # authors' code: single-sample k3 estimate of KL(pi(.|x+) || pi(.|x-)) at the sampled token
    r = torch.clamp(logp_neg - logp_pos, -20.0, 20.0)  # [N, T]
    return torch.clamp(torch.exp(r) - r - 1.0, 0.0, 10.0)  # [N, T]


@GCPO_DIVERGENCES.register("abs")
def _abs(logp_pos: torch.Tensor, logp_neg: torch.Tensor) -> torch.Tensor:
    return (logp_pos - logp_neg).abs()  # [N, T]


@GCPO_DIVERGENCES.register("info_gain")
def _info_gain(logp_pos: torch.Tensor, logp_neg: torch.Tensor) -> torch.Tensor:
    return logp_pos - logp_neg  # [N, T]


@torch.no_grad()
def gcpo_weights_from_scores(
    d: torch.Tensor,
    mask: torch.Tensor,
    *,
    normalization: str = "rank_power",
    top_fraction: float = 0.4,
    target_mass: float = 0.8,
) -> torch.Tensor:
    """Normalize per-token contrast scores `d` [N, T] into GCPO weights [N, T] (float32, no grad, 0 on padding).

    Use this for scores computed elsewhere, e.g. the exact full-vocabulary
    `KL(pi(.|x+) || pi(.|x-))` of the seed's wording (`divergence="full_kl"`), which the model adapters compute
    in chunks. `normalization`: `"rank_power"` (default, authors' "hist") or `"cdf"` (the paper's wording);
    see `mmrl.algorithms.token_weights`.
    """
    fn = TOKEN_WEIGHTS[normalization]
    if normalization not in ("rank_power", "cdf"):
        raise ValueError(f"GCPO normalization must be 'rank_power' or 'cdf', got {normalization!r}")
    return fn(d, mask, top_fraction=top_fraction, target_mass=target_mass)


@torch.no_grad()
def gcpo_token_weights(
    logp_pos: torch.Tensor,
    logp_neg: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: str = "k3",
    normalization: str = "rank_power",
    top_fraction: float = 0.4,
    target_mass: float = 0.8,
) -> torch.Tensor:
    """GCPO token weights w [N, T] from sampled-token log-probs under the positive / negative condition.

    Args:
        logp_pos: [N, T] `log pi(y_t | x+, y<t)` of the current policy.
        logp_neg: [N, T] `log pi(y_t | x-, y<t)`, same policy, same response, negative condition.
        mask: [N, T] valid response tokens.
        divergence: `"k3"` (default, authors' code: `r = clamp(logp_neg - logp_pos, -20, 20)`,
            `d = exp(r) - r - 1` clamped to [0, 10]), `"abs"` (`|logp_pos - logp_neg|`), or `"info_gain"`
            (`logp_pos - logp_neg`), the latter two from the authors' earlier commits. For the exact
            full-vocabulary KL use `gcpo_weights_from_scores`.
        normalization, top_fraction, target_mass: see `gcpo_weights_from_scores`.

    Deviations from the authors' code: ties get average ranks (deterministic); the result is float32 whatever the
    input dtype. Computed under `no_grad`; the weights are constants in the loss.
    """
    if divergence == "full_kl":
        raise ValueError(
            "divergence='full_kl' needs full distributions: compute the per-token KL with the model adapter "
            "(logprob(..., stats=('full_kl',))) and pass it to gcpo_weights_from_scores"
        )
    d = GCPO_DIVERGENCES[divergence](logp_pos.detach().float(), logp_neg.detach().float())  # [N, T]
    return gcpo_weights_from_scores(d, mask, normalization=normalization, top_fraction=top_fraction, target_mass=target_mass)
