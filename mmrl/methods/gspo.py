"""GSPO: group advantages with a sequence-level, length-normalised importance ratio (docs/algorithms.md
section 6).

The worked example of adding a method (docs/design.md, "Adding a method"): this file and the `gspo` entry of
`mmrl.config.train_config.METHOD_DEFAULTS`. It reuses the policy-gradient family's buffer preparation (behaviour log-probs,
reference log-probs of an optional KL term) and replaces only the loss.
"""
from __future__ import annotations

import torch

from mmrl.algorithms import aggregate, k3_kl
from mmrl.algorithms.gspo import gspo_loss
from mmrl.core.diagnostics import micro_batch_sums
from mmrl.methods.base import METHODS, LossOutput, MicroBatch
from mmrl.methods.policy_gradient import PolicyGradient


@METHODS.register("gspo")
class GSPO(PolicyGradient):
    """Sequence-ratio clipped surrogate, a mean over the responses of the global batch, plus an optional k3 KL."""

    supports_entropy_mask = False  # one ratio per sequence: no token to mask

    def loss(self, buf, mb: MicroBatch) -> LossOutput:
        cfg = self.cfg
        idx = mb.idx
        rows = buf.rollout.select(idx)
        mask = buf.loss_mask[idx]  # [n, T]
        seed_k = mb.inner % len(buf.mask_seeds)
        est = self.estimator_options(buf.mask_seeds[seed_k])
        current = not buf.old_logp
        scores = self.policy.logprob(rows, stats=("entropy",) if current else (), **est)
        logp = scores.logp  # [n, T]
        old = logp.detach() if current else buf.old_logp[seed_k][idx]
        adv = buf.advantages[idx]  # [n]
        per_seq, pm = gspo_loss(logp, old, adv, mask, eps_low=cfg.epsilon, eps_high=cfg.eps_high)
        loss = per_seq.sum() / mb.g_seqs  # mean over the global batch's responses
        if cfg.beta > 0:
            ref = buf.ref_logp[seed_k][idx]
            loss = loss + cfg.beta * aggregate(k3_kl(logp, ref), mask, "token_mean", num_items=mb.g_tokens)
        token_stats = {"entropy": scores.stats["entropy"].float()} if current and mb.inner == 0 else {}
        credit = adv[:, None].expand_as(mask).detach().float() * mask if mb.inner == 0 else None
        m = {k: float(v) for k, v in pm.items()}
        if cfg.log_diagnostics:
            m.update(micro_batch_sums(mask, adv, logp, buf.ref_logp[seed_k][idx] if buf.ref_logp else None))
        if mb.inner == 0 and not current:
            with torch.no_grad():
                dev = (logp.detach() - old).abs()
                m["policy/first_inner_logp_max_diff"] = float(dev[mask].max()) if mask.any() else 0.0
        return LossOutput(loss, m, credit=credit, token_stats=token_stats)
