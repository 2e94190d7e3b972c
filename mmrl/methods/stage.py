"""STAGE: the policy-gradient family with similarity-aware token masks (the GRPO baseline of GCPO's T2I branch).

Per image token, the mean cosine similarity of its VQ code vector to the same position in the group's images of
opposite advantage gives a soft mask `clamp((1 - c) / 2, 0, 1)`; the policy term is the mask-weighted token mean
per group, and with `kl_reweight` the KL term is weighted per token by `0.5 + 0.5 clamp(c + 1, 0, 1)`
(`mmrl.algorithms.stage`; docs/sources.md "STAGE baseline"). Masks depend only on the sampled ids and the
advantages, so they are fixed at buffer time. Families that expose code vectors of their response tokens
(`policy.code_vectors(response_ids) -> [N, T, C]`, Janus) can run it.
"""
from __future__ import annotations

import torch

from mmrl.algorithms.stage import opposite_advantage_similarity, stage_kl_mask, stage_token_masks, weighted_mean_weights
from mmrl.methods.base import METHODS, MicroBatch, weight_metrics
from mmrl.methods.policy_gradient import PolicyGradient


@METHODS.register("stage")
class STAGE(PolicyGradient):
    """Clipped surrogate with `A_it = A_i * w_it`, w the mask-weighted-mean weights of STAGE's similarity masks."""

    has_kl_token_masks = True  # kl_reweight

    @classmethod
    def supports_family(cls, adapter_cls) -> bool:
        """Families whose adapter gives the code vectors of its response tokens (`code_vectors`: Janus)."""
        return callable(getattr(adapter_cls, "code_vectors", None))

    @classmethod
    def config_errors(cls, cfg) -> list[str]:
        from mmrl.models import FAMILIES, adapter_class

        e = super().config_errors(cfg)
        if cfg.family in FAMILIES and not cls.supports_family(adapter_class(cfg.family)):
            e.append(f"method 'stage' compares the code vectors of image tokens; family {cfg.family!r} has none "
                    "(policy.code_vectors); use it with family janus")
        return e

    def __init__(self, cfg, policy, estimator_options):
        super().__init__(cfg, policy, estimator_options)
        if not callable(getattr(policy, "code_vectors", None)):  # a policy passed to the Trainer directly
            raise ValueError(f"method 'stage' compares the code vectors of image tokens; family {cfg.family!r} has none "
                             "(policy.code_vectors); use it with family janus")

    def prepare(self, buf, micro_batches, *, current: bool) -> None:
        super().prepare(buf, micro_batches, current=current)
        codes = self.policy.code_vectors(buf.rollout.response_ids)  # [N, T, C]
        sim = opposite_advantage_similarity(codes, buf.advantages.to(codes.device), self.cfg.num_generations)  # [N, T]
        mask = buf.loss_mask.to(sim.device)
        buf.method_state["token_weights"] = weighted_mean_weights(stage_token_masks(sim), mask, self.cfg.num_generations).to(buf.loss_mask.device)
        if self.cfg.kl_reweight:
            buf.method_state["kl_weights"] = stage_kl_mask(sim).to(buf.loss_mask.device)
        buf.metrics.update(weight_metrics("stage", buf.method_state["token_weights"], buf.loss_mask))
        buf.metrics["stage/similarity_mean"] = float(sim[mask].mean()) if mask.any() else 0.0

    def scores_and_weights(self, buf, rows, mb: MicroBatch, est: dict, current: bool, metrics: dict):
        entropy = ("entropy",) if current else ()
        return self.policy.logprob(rows, stats=entropy, **est), buf.method_state["token_weights"][mb.idx], {}
