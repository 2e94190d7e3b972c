"""The policy-gradient family: GRPO, DAPO, Dr.GRPO and diffu-GRPO (d1), the base of GCPO and DGPO.

One clipped surrogate (`mmrl.algorithms.policy_loss`, docs/algorithms.md section 2) on group advantages; the four
methods differ only in config defaults (`mmrl.config.train_config.METHOD_DEFAULTS`: clip range, aggregation, reward scaling,
KL, estimator). Subclasses give the advantage a per-token weight through two hooks: `buffer_scores` (the no-grad
forward at buffer time) and `scores_and_weights` (the gradient forward of a micro-batch).
"""
from __future__ import annotations

import torch

from mmrl.algorithms import accumulated_loss, aggregate, high_entropy_mask, surrogate_loss
from mmrl.core.diagnostics import measures_kl, micro_batch_sums
from mmrl.methods.base import METHODS, LossOutput, Method, MicroBatch, first_inner_drift, micro_batch_inputs

TOKEN_STATS = ("entropy", "h2")
"""Per-token statistics the first gradient forward of a buffer hands back for the buffer metrics."""


class PolicyGradient(Method):
    """Clipped surrogate with sequence advantages (broadcast over tokens), optional k3 KL and NLL terms."""

    supports_entropy_mask = True
    buffer_stats: tuple[str, ...] = ("entropy",)
    """Statistics the behaviour forward of the first mask seed takes (the buffer's entropy metric)."""

    # ------------------------------------------------------------------------------------------- buffer time

    def buffer_scores(self, rows, est: dict, first_seed: bool):
        """The behaviour forward of one micro-batch: (TokenScores, reference log-probs or None to compute them)."""
        return self.policy.logprob(rows, stats=self.buffer_stats if first_seed else (), **est), None

    def reference_from_current_forward(self) -> bool:
        """Whether the gradient forward also gives the reference log-probs (then no separate pass is needed)."""
        return False

    def after_behaviour(self, buf, stats: dict[str, torch.Tensor]) -> None:
        """Hook after the behaviour forwards (e.g. token weights fixed at buffer time)."""

    def wants_reference_logprobs(self, buf) -> bool:
        """Whether the buffer keeps reference log-probs: a KL term (beta > 0), or the `diag/kl_*` diagnostics when a
        reference model exists (with beta = 0 they cost one no-grad reference forward per mask seed on the measured
        rollouts, `mmrl.core.diagnostics.measures_kl`)."""
        return self.cfg.beta > 0 or (measures_kl(self.cfg, buf.rollout_index) and self.policy.has_reference)

    def prepare(self, buf, micro_batches, *, current: bool) -> None:
        """Behaviour log-probs (and reference log-probs, statistics) per mask seed and micro-batch.

        With one optimizer step per rollout (`current`) the behaviour policy is the policy being updated: its
        log-probs and statistics come from the gradient forward itself, so only the reference log-probs of a KL
        term are computed here (unless the gradient forward gives those too)."""
        cfg, policy = self.cfg, self.policy
        N, T = buf.rollout.response_ids.shape
        dev = buf.rollout.response_ids.device
        want_ref = self.wants_reference_logprobs(buf)
        if current:
            if want_ref and not self.reference_from_current_forward():
                est = self.estimator_options(buf.mask_seeds[0])
                ref = torch.zeros(N, T, device=dev)
                for idx in micro_batches:
                    ref[idx] = policy.logprob(buf.rollout.select(idx), use_reference=True, **est).logp
                buf.ref_logp = [ref]
            return
        stats = {name: torch.zeros(N, T, device=dev) for name in ("entropy", *self.buffer_stats)}
        buf.ref_logp = [] if want_ref else None
        for k, seed in enumerate(buf.mask_seeds):
            old = torch.zeros(N, T, device=dev)
            ref = torch.zeros(N, T, device=dev) if want_ref else None
            est = self.estimator_options(seed)
            for idx in micro_batches:
                rows = buf.rollout.select(idx)
                s, ref_logp = self.buffer_scores(rows, est, k == 0)
                if k == 0:
                    for name in self.buffer_stats:
                        stats[name][idx] = s.stats[name]
                if ref is not None:
                    ref[idx] = ref_logp if ref_logp is not None else policy.logprob(rows, use_reference=True, **est).logp
                old[idx] = s.logp
            buf.old_logp.append(old)
            if ref is not None:
                buf.ref_logp.append(ref)
        self.after_behaviour(buf, stats)
        buf.metrics.update(self.token_stat_metrics(buf, stats))

    # ---------------------------------------------------------------------------------------------- update

    def scores_and_weights(self, buf, rows, mb: MicroBatch, est: dict, current: bool, metrics: dict):
        """The gradient forward of a micro-batch: (TokenScores, token weights [n, T] or None, extra token stats)."""
        entropy = self.entropy_stats(current)
        return self.policy.logprob(rows, stats=entropy, **est), None, {}

    def entropy_stats(self, current: bool) -> tuple[str, ...]:
        """The stats the gradient forward takes: entropy for the buffer metric (current) or the entropy mask."""
        return ("entropy",) if current or self.cfg.top_entropy_quantile < 1 else ()

    def kl_token_weights(self, buf, mb: MicroBatch, weights: torch.Tensor | None) -> torch.Tensor | None:
        """[n, T] per-token weights of the KL term (`kl_reweight`), or None for a uniform KL: the ones fixed at
        buffer time (STAGE), or a method's own from its token weights (GCPO)."""
        return buf.method_state["kl_weights"][mb.idx] if "kl_weights" in buf.method_state else None

    def loss(self, buf, mb: MicroBatch) -> LossOutput:
        """The policy loss of `loss_type` (`surrogate_loss`: the clipped surrogate, or a registered one such as
        CISPO) of one micro-batch with token advantages `A_i * w_it` (`w = 1` here)."""
        cfg, inner = self.cfg, mb.inner
        x = micro_batch_inputs(self, buf, mb)
        mask = x.mask  # [n, T]
        m: dict[str, float] = {}
        scores, weights, token_stats = self.scores_and_weights(buf, x.rows, mb, x.est, x.current, m)
        logp = scores.logp  # [n, T]
        if x.current and inner == 0:
            token_stats = {**{k: scores.stats[k].float() for k in TOKEN_STATS if k in scores.stats}, **token_stats}
        else:
            token_stats = {}
        adv = x.advantages  # [n]
        token_adv = adv[:, None] * weights if weights is not None else adv  # [n, T] or [n]
        credit = None
        if inner == 0:
            credit = (token_adv if token_adv.dim() == 2 else token_adv[:, None].expand_as(mask)).detach().float() * mask
        old = x.behaviour(logp)
        ref = x.ref_logp if x.ref_logp is not None else (scores.other_logp if cfg.beta > 0 else None)
        per_token, pm = surrogate_loss(cfg.loss_type)(logp, old, token_adv, mask, eps_low=cfg.epsilon, eps_high=cfg.eps_high,
                                                      dual_clip=cfg.dual_clip, ref_logp=ref, beta=cfg.beta,
                                                      kl_weights=self.kl_token_weights(buf, mb, weights))
        if cfg.top_entropy_quantile < 1:  # TRL: per_token_loss * entropy_mask (the normaliser keeps every token)
            ent = scores.stats.get("entropy")
            if ent is None:  # a subclass's forward took other stats: one no-grad forward for the entropies
                with torch.no_grad():
                    ent = self.policy.logprob(x.rows, stats=("entropy",), **x.est).stats["entropy"]
            keep = high_entropy_mask(ent, mask, cfg.top_entropy_quantile)  # [n, T]
            per_token = per_token * keep
            m["entropy_mask/kept_frac"] = float(keep.sum()) / max(1.0, float(mask.sum()))
        loss = accumulated_loss(per_token, mask, cfg.loss_type, global_tokens=mb.g_tokens, global_seqs=mb.g_seqs,
                                max_len=cfg.max_completion_length)
        if cfg.nll_coef:
            loss = loss + cfg.nll_coef * aggregate(-logp, mask, "token_mean", num_items=mb.g_tokens)
        for k, v in pm.items():
            m[k] = float(v)
        if cfg.log_diagnostics:  # the policy before this step's update against the reference, the signed weights
            kl_ref = ref if ref is not None else (scores.other_logp if self.reference_from_current_forward() else None)
            m.update(micro_batch_sums(mask, token_adv, logp, kl_ref))
        m.update(first_inner_drift(x, logp, inner))
        return LossOutput(loss, m, credit=credit, token_stats=token_stats)


for _name in ("grpo", "dapo", "dr_grpo", "diffu_grpo"):  # one class, four presets (in this order in error messages)
    METHODS.register(_name)(PolicyGradient)
