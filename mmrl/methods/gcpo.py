"""GCPO: the policy-gradient family with guidance-contrastive token weights (docs/algorithms.md section 3).

The same current policy scores each response under the positive prompt and under a negative condition; the
contrast gives a weight per token, `A_it = A_i * w_it` (`mmrl.algorithms.gcpo`). Weights are recomputed at every
micro-step from the current policy (the authors' code), so nothing is fixed at buffer time.
"""
from __future__ import annotations

import torch

from mmrl.algorithms import gcpo_token_weights, gcpo_weights_from_scores
from mmrl.algorithms.stage import gcpo_kl_mask
from mmrl.methods.base import METHODS, MicroBatch, weight_metrics
from mmrl.methods.entropy_reward import stage_entropy_reward  # noqa: F401  (its import path before the hook)
from mmrl.methods.policy_gradient import PolicyGradient


@METHODS.register("gcpo")
class GCPO(PolicyGradient):
    """Clipped surrogate with `w = gcpo_token_weights(logp(o | positive), logp(o | negative))`."""

    has_kl_token_masks = True  # kl_reweight

    def scores_and_weights(self, buf, rows, mb: MicroBatch, est: dict, current: bool, metrics: dict):
        cfg, policy = self.cfg, self.policy
        mask = buf.loss_mask[mb.idx]  # [n, T]
        entropy = self.entropy_stats(current)
        if cfg.gcpo_divergence == "full_kl":
            # the exact KL(pi(.|positive) || pi(.|negative)) over the vocabulary, from the adapter's chunked pass
            scores = policy.logprob(rows, stats=("kl", *entropy), stats_against="negative", **est)
            weights = gcpo_weights_from_scores(scores.stats["kl"], mask, normalization=cfg.gcpo_normalization,
                                               top_fraction=cfg.gcpo_top_fraction, target_mass=cfg.gcpo_target_mass)
        else:
            if cfg.gcpo_negative_forward == "batched" and policy.batches_negative_condition:
                # one forward over the positive and negative prompts (2n rows); the negative half is detached
                scores, logp_neg = policy.logprob_with_negative(rows, stats=entropy, **est)  # [n, T] each
            else:
                # the negative-condition forward runs before the positive one, so its logits are freed before the
                # graph of the gradient forward is built (peak memory stays that of GRPO)
                with torch.no_grad():
                    logp_neg = policy.logprob(rows, condition="negative", **est).logp  # [n, T]
                scores = policy.logprob(rows, stats=entropy, **est)
            weights = gcpo_token_weights(scores.logp.detach(), logp_neg, mask, divergence=cfg.gcpo_divergence,
                                         normalization=cfg.gcpo_normalization, top_fraction=cfg.gcpo_top_fraction,
                                         target_mass=cfg.gcpo_target_mass)
        metrics.update(weight_metrics("gcpo", weights, mask))
        return scores, weights, {}

    def kl_token_weights(self, buf, mb: MicroBatch, weights):
        """GCPO T2I's `kl_reweight`: `0.5 + 0.5 clamp(2 - 2 w, 0, 1)` of this step's token weights."""
        return gcpo_kl_mask(weights) if self.cfg.kl_reweight else None
