"""GCPO: the policy-gradient family with guidance-contrastive token weights (docs/algorithms.md section 3).

The same current policy scores each response under the positive prompt and under a negative condition; the
contrast gives a weight per token, `A_it = A_i * w_it` (`mmrl.algorithms.gcpo`). Weights are recomputed at every
micro-step from the current policy (the authors' code), so nothing is fixed at buffer time.
"""
from __future__ import annotations

import torch

from mmrl.algorithms import gcpo_token_weights, gcpo_weights_from_scores
from mmrl.algorithms.stage import gcpo_kl_mask
from mmrl.core.seeds import derived_seed
from mmrl.methods.base import METHODS, MicroBatch, weight_metrics
from mmrl.methods.policy_gradient import PolicyGradient


class EntropyReward:
    """STAGE's entropy reward (`gcpo_entropy_reward > 0`, on in the GCPO and STAGE text-to-image launches) as a
    method's reward shaping: mixed into GCPO and STAGE, before `PolicyGradient`."""

    reward_shaping_settings = ("gcpo_entropy_reward",)

    @classmethod
    def needs_reference(cls, cfg) -> bool:
        """A KL term, or the entropy reward's reference entropies."""
        return super().needs_reference(cfg) or cfg.gcpo_entropy_reward > 0

    def shape_rewards(self, rollout, rewards, micro_batches, rollout_index):
        """STAGE's entropy reward (GCPO T2I, `stage_entropy_reward`) when `gcpo_entropy_reward > 0`."""
        cfg = self.cfg
        if not cfg.gcpo_entropy_reward > 0:
            return rewards, {}
        est = self.estimator_options(derived_seed(cfg.seed, "entropy_reward", rollout_index))
        bonus = stage_entropy_reward(self.policy, rollout, rewards, cfg, micro_batches, est)  # [N]
        return rewards + bonus, {"rewards/entropy_bonus/abs_mean": float(bonus.abs().mean())}


@METHODS.register("gcpo")
class GCPO(EntropyReward, PolicyGradient):
    """Clipped surrogate with `w = gcpo_token_weights(logp(o | positive), logp(o | negative))`; optionally STAGE's
    entropy reward (`EntropyReward`) added to the rewards before the advantages."""

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


@torch.no_grad()
def stage_entropy_reward(policy, rollout, rewards: torch.Tensor, cfg, micro_batches, est: dict) -> torch.Tensor:
    """The bonus [N] of STAGE's entropy reward (`mmrl.algorithms.entropy_reward.stage_entropy_bonus`, on in the
    GCPO text-to-image launch): mean token entropies of the policy and of the reference per response, in
    micro-batches (`micro_batches(N)` yields index tensors), scored with the estimator options `est`."""
    from mmrl.algorithms.entropy_reward import stage_entropy_bonus

    h, h_ref = torch.zeros_like(rewards), torch.zeros_like(rewards)
    for idx in micro_batches(rollout.num_responses):
        mb = rollout.select(idx)
        mask = mb.response_mask.float()  # [n, T]
        count = mask.sum(-1).clamp(min=1)  # [n]
        for out, ref in ((h, False), (h_ref, True)):
            ent = policy.logprob(mb, use_reference=ref, stats=("entropy",), **est).stats["entropy"]  # [n, T]
            out[idx.to(out.device)] = ((ent.float() * mask).sum(-1) / count).to(out.device)
    return stage_entropy_bonus(rewards, h, h_ref, cfg.num_generations, coeff=cfg.gcpo_entropy_reward)
