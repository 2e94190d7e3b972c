"""GSPO: group advantages with a sequence-level, length-normalised importance ratio (docs/algorithms.md
section 6).

The worked example of adding a method (docs/design.md, "Adding a method"): this file and the `gspo` entry of
`mmrl.config.train_config.METHOD_DEFAULTS`. It reuses the policy-gradient family's buffer preparation (behaviour log-probs,
reference log-probs of an optional KL term) and replaces only the loss.
"""
from __future__ import annotations

from mmrl.algorithms import aggregate, k3_kl
from mmrl.algorithms.gspo import gspo_loss
from mmrl.core.diagnostics import micro_batch_sums
from mmrl.methods.base import METHODS, LossOutput, MicroBatch, first_inner_drift, micro_batch_inputs
from mmrl.methods.policy_gradient import PolicyGradient


@METHODS.register("gspo")
class GSPO(PolicyGradient):
    """Sequence-ratio clipped surrogate, a mean over the responses of the global batch, plus an optional k3 KL."""

    supports_entropy_mask = False  # one ratio per sequence: no token to mask

    def loss(self, buf, mb: MicroBatch) -> LossOutput:
        cfg = self.cfg
        x = micro_batch_inputs(self, buf, mb)  # rows, mask, advantages, behaviour / reference log-probs
        scores = self.policy.logprob(x.rows, stats=("entropy",) if x.current else (), **x.est)
        logp = scores.logp  # [n, T]
        per_seq, pm = gspo_loss(logp, x.behaviour(logp), x.advantages, x.mask, eps_low=cfg.epsilon, eps_high=cfg.eps_high)
        loss = per_seq.sum() / mb.g_seqs  # mean over the global batch's responses
        if cfg.beta > 0:
            loss = loss + cfg.beta * aggregate(k3_kl(logp, x.ref_logp), x.mask, "token_mean", num_items=mb.g_tokens)
        token_stats = {"entropy": scores.stats["entropy"].float()} if x.current and mb.inner == 0 else {}
        credit = x.advantages[:, None].expand_as(x.mask).detach().float() * x.mask if mb.inner == 0 else None
        m = {k: float(v) for k, v in pm.items()}
        if cfg.log_diagnostics:
            m.update(micro_batch_sums(x.mask, x.advantages, logp, x.ref_logp))
        m.update(first_inner_drift(x, logp, mb.inner))
        return LossOutput(loss, m, credit=credit, token_stats=token_stats)
