"""DGPO: Hellinger deviation from a reference, entropy gate, softmax redistribution (docs/algorithms.md section 4).

Paper: Jin et al., "DGPO: Distribution-Guided Policy Optimization", arXiv 2605.03327, section 3 (Hellinger
deviation, entropy gate, advantage redistribution 3.2, objective 3.3). No official code was found; the
formulas follow the abstract and two independent secondary reconstructions that agree on every step
(docs/sources.md, "DGPO"): `d = H^2(pi_theta, pi_ref)` over the full vocabulary,
`H~ = H(pi_theta) / ln|V|`, `s = d * H~^kappa`, `w = n * softmax(s / tau)`, `A_it = A_i * w_it`, PPO-clip loss
without a KL term.
"""
from __future__ import annotations

import math

import torch

from mmrl.algorithms.distributions import token_distribution_stats
from mmrl.algorithms.token_weights import softmax_weights


@torch.no_grad()
def hellinger_entropy(
    policy_logits: torch.Tensor,
    ref_logits: torch.Tensor,
    *,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared Hellinger distance to the reference and policy entropy per position: (h2 [N, T], entropy [N, T]).

    `h2 = 1 - sum_v sqrt(p(v) q(v))` in [0, 1], `entropy = -sum_v p(v) log p(v)` in nats, with
    `p = softmax(policy_logits)` and `q = softmax(ref_logits)`, both [N, T, V] in any float dtype.

    Computed in float32 over chunks of `chunk_size` positions (default: about 16 MiB per float32 chunk buffer, 2 MiB
    on the CPU), never holding a float32 copy of the whole [N, T, V] tensor; under `no_grad`. Deviation (numerical
    only): h2 is evaluated as `0.5 * sum_v (sqrt p - sqrt q)^2`, algebraically equal to `1 - BC`, exact 0 for p == q.
    """
    out = token_distribution_stats(policy_logits, ref_logits, stats=("h2", "entropy"), chunk_size=chunk_size)
    return out["h2"], out["entropy"]


@torch.no_grad()
def dgpo_token_weights(
    h2: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    vocab_size: int,
    tau: float = 0.5,
    kappa: float = 1.0,
) -> torch.Tensor:
    """DGPO token weights w [N, T]: `w_it = n_i * softmax_t(h2_it * (entropy_it / ln V) ** kappa / tau)`.

    Args:
        h2: [N, T] squared Hellinger distance of policy vs reference (`hellinger_entropy`).
        entropy: [N, T] policy entropy in nats.
        mask: [N, T] valid response tokens.
        vocab_size: V, for the normalized entropy `H~ = entropy / ln V` (clamped to [0, 1]).
        tau: softmax temperature (paper default 0.5; good range 0.5-1.0).
        kappa: power of the entropy gate (paper default 1.0).

    Mean 1 over each row's valid tokens, 0 on padding, float32, no grad. When policy == reference, h2 == 0 and
    every valid weight is exactly 1, so DGPO reduces to the base loss. No deviation from the formulation above.
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if kappa < 0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    h_norm = (entropy.detach().float() / math.log(vocab_size)).clamp(0.0, 1.0)  # [N, T]
    score = h2.detach().float() * h_norm**kappa  # [N, T]
    return softmax_weights(score, mask, tau=tau)  # [N, T]
