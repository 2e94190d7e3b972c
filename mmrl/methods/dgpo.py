"""DGPO: the policy-gradient family with distribution-guided token weights (docs/algorithms.md section 4).

The squared Hellinger distance of each token's distribution to the reference, gated by the policy entropy, is
redistributed into token weights `w = n * softmax(s / tau)`, `A_it = A_i * w_it` (`mmrl.algorithms.dgpo`). With
`dgpo_policy = old` the weights are fixed at buffer time from the behaviour policy; with `current` they are
recomputed at every micro-step. The reference pass that gives the deviation also gives a KL term's reference
log-probs.
"""
from __future__ import annotations

import torch

from mmrl.algorithms import dgpo_token_weights
from mmrl.methods.base import METHODS, MicroBatch, weight_metrics
from mmrl.methods.policy_gradient import PolicyGradient

STATS = ("h2", "entropy")
"""The per-token statistics DGPO's weights are computed from."""


@METHODS.register("dgpo")
class DGPO(PolicyGradient):
    """Clipped surrogate with `w = dgpo_token_weights(H^2(pi, pi_ref), H(pi))`."""

    buffer_stats = STATS

    @classmethod
    def needs_reference(cls, cfg) -> bool:
        return True  # the Hellinger deviation is measured against the reference

    def reference_from_current_forward(self) -> bool:
        return True

    def buffer_scores(self, rows, est: dict, first_seed: bool):
        if not first_seed:
            return super().buffer_scores(rows, est, first_seed)
        s = self.policy.logprob(rows, stats=STATS, stats_against="reference", **est)
        return s, s.other_logp

    def _weights(self, h2: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        return dgpo_token_weights(h2, entropy, mask, vocab_size=self.policy.vocab_size, tau=cfg.dgpo_tau, kappa=cfg.dgpo_kappa)

    def after_behaviour(self, buf, stats: dict[str, torch.Tensor]) -> None:
        buf.method_state["token_weights"] = self._weights(stats["h2"], stats["entropy"], buf.loss_mask)

    def scores_and_weights(self, buf, rows, mb: MicroBatch, est: dict, current: bool, metrics: dict):
        mask = buf.loss_mask[mb.idx]  # [n, T]
        if not (self.cfg.dgpo_policy == "current" or current):
            return self.policy.logprob(rows, stats=(), **est), buf.method_state["token_weights"][mb.idx], {}
        scores = self.policy.logprob(rows, stats=STATS, stats_against="reference", **est)
        weights = self._weights(scores.stats["h2"], scores.stats["entropy"], mask)
        if current:  # one step per rollout: these are the buffer's weights, reported with the buffer metrics
            return scores, weights, {"dgpo_weight": weights.float()}
        metrics.update(weight_metrics("dgpo", weights, mask))
        return scores, weights, {}

    def token_stat_metrics(self, buf, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """The entropy, DGPO's weight statistics and the mean Hellinger deviation."""
        out = super().token_stat_metrics(buf, stats)
        weights = stats.get("dgpo_weight", buf.method_state.get("token_weights"))
        if "h2" in stats and weights is not None:
            mask = buf.loss_mask
            out.update(weight_metrics("dgpo", weights, mask))
            out["dgpo/h2_mean"] = float((stats["h2"] * mask).sum() / mask.sum().clamp(min=1))
        return out
