"""DMPO: distribution matching with importance weights and a weighted denoising loss (docs/algorithms.md
section 5).

At buffer time: the sequence log-likelihood ratio of the reference to the behaviour policy (ELBO estimates with
shared masks for masked-diffusion models, exact for autoregressive ones), the self-normalised importance weights of
eq. 10 and the weight baseline. Per micro-step: R freshly masked copies of each response and WDCE (eq. 11) or WDDO
(section 3.4). No behaviour log-probs, no ratio.

Deviation (off by default): with `beta > 0` the loss adds GRPO's KL term, `beta` x the token mean of the k3 estimate
of KL(pi_theta || pi_ref) on the rollout's tokens (Schulman 2020; GRPO eq. 4; TRL's `per_token_kl`), scored with the
family's per-token estimator (exact for autoregressive models, mean-field for masked diffusion, as diffu-GRPO's KL).
The paper's only anchor to the base is the reference target `dmpo_target=reference`; the proximal target
(`behaviour`) has none, and the KL term is the control for that (issue 24 item 2, the KL question).
"""
from __future__ import annotations

import torch

from mmrl.algorithms import (
    DMPO_TOKEN_MASKS,
    copy_elbos,
    dmpo_baseline,
    dmpo_real_weights,
    dmpo_weights,
    wdce_loss,
    wddo_deltas,
    wddo_loss,
)
from mmrl.algorithms.dmpo import (
    LOSS_TIME_BASELINES,
    correct_token_mask,
    dmpo_trust_region_gate,
    micro_batch_mean_baseline,
    token_masked_sum,
)
from mmrl.algorithms.policy_loss import aggregate, k3_kl
from mmrl.core.diagnostics import effective_sample_size, measures_kl, micro_batch_sums
from mmrl.methods.base import METHODS, LossOutput, Method, MicroBatch, zeros_like_tokens
from mmrl.core.protocol import NoisedBatch
from mmrl.core.seeds import derived_seed


@METHODS.register("dmpo")
class DMPO(Method):
    """WDCE / WDDO on the reward-tilted target `p* ∝ p_ref exp(r / alpha)`."""

    uses_behaviour_logprobs = False

    @classmethod
    def needs_reference(cls, cfg) -> bool:
        return True  # the target is tilted from the reference

    @classmethod
    def num_mask_seeds(cls, cfg) -> int:
        return 1  # fresh noise every micro-step; the buffer's ELBOs use one set of shared masks

    def prepare(self, buf, micro_batches, *, current: bool) -> None:
        """DMPO eq. 10: ELBO (or exact) log p_ref - log p_v with shared masks, importance weights, baseline.

        With `dmpo_target=behaviour` (App. B.2's proximal limit) the log-ratio term is 0 and no likelihood is
        estimated unless the model baseline or WDDO needs log p_v."""
        cfg, policy = self.cfg, self.policy
        N = buf.rollout.num_responses
        dev = buf.rewards.device
        need_v = (cfg.dmpo_target == "reference" or cfg.dmpo_loss == "wddo" or cfg.dmpo_baseline == "model"
                  or cfg.dmpo_trust_region is not None)
        est = self.estimator_options(buf.mask_seeds[0], kind="elbo")
        est_kl = self._kl_estimator(buf)
        elbo_v, elbo_ref = torch.zeros(N, device=dev), torch.zeros(N, device=dev)
        # diag/kl_*: per-token scores of the behaviour policy and the reference on the measured rollouts, reusing the
        # likelihood forwards when their estimator is the per-token one (autoregressive families)
        diag = measures_kl(cfg, buf.rollout_index) and policy.has_reference
        need_ref = diag or cfg.beta > 0  # the KL term needs the reference's per-token scores on every buffer
        ref_tok = zeros_like_tokens(buf) if need_ref else None  # [N, T]
        pol_tok = zeros_like_tokens(buf)  # [N, T] behaviour per-token scores (zeros when not measured)
        for idx in micro_batches if (need_v or need_ref) else []:
            rows = buf.rollout.select(idx)
            v = r = None
            if need_v:
                v = policy.logprob(rows, **est).logp  # [n, T]
                elbo_v[idx] = v.sum(-1).to(dev)
            if cfg.dmpo_target == "reference":
                r = policy.logprob(rows, use_reference=True, **est).logp  # [n, T]
                elbo_ref[idx] = r.sum(-1).to(dev)
            if need_ref:
                if r is None or est_kl != est:
                    r = policy.logprob(rows, use_reference=True, **est_kl).logp  # [n, T]
                ref_tok[idx] = r.float().to(ref_tok.device)
            if diag:
                if v is None or est_kl != est:
                    v = policy.logprob(rows, **est_kl).logp  # [n, T]
                pol_tok[idx] = v.float().to(pol_tok.device)
        buf.ref_logp = [ref_tok] if need_ref else None
        buf.method_state["kl_measured"] = diag  # pol_tok holds the behaviour's scores (else zeros)
        log_ratio = elbo_ref - elbo_v if cfg.dmpo_target == "reference" else torch.zeros(N, device=dev)  # [N]
        G = cfg.num_generations
        buf.method_state["weights"] = dmpo_weights(buf.rewards, log_ratio, G, alpha=cfg.dmpo_alpha, coeff=cfg.dmpo_coeff)
        if cfg.dmpo_loss == "wdce" and cfg.dmpo_baseline not in LOSS_TIME_BASELINES:
            buf.method_state["baseline_weights"] = dmpo_baseline(cfg.dmpo_baseline, rewards=buf.rewards, log_ref_minus_v=log_ratio, group_size=G,
                                            alpha=cfg.dmpo_alpha, coeff=cfg.dmpo_coeff)
        buf.method_state["elbo_v"] = elbo_v
        if cfg.dmpo_token_mask is not None:  # the response tokens WDCE fits (`dmpo_token_mask`)
            keep = DMPO_TOKEN_MASKS[cfg.dmpo_token_mask](policy, buf)  # [N, T] bool
            buf.method_state["token_mask"] = keep
            buf.metrics["dmpo/token_mask_frac"] = float(keep.sum() / buf.rollout.response_mask.sum().clamp(min=1))
        buf.old_logp = [pol_tok]  # no ratio in DMPO's loss: only the diagnostics' behaviour scores
        ess = effective_sample_size(buf.method_state["weights"], G)
        buf.metrics.update({"dmpo/ess": float(ess.mean()), "dmpo/weight_max": float(buf.method_state["weights"].max())})
        if cfg.dmpo_target == "reference":
            buf.metrics.update({"dmpo/log_ref_minus_v_mean": float(log_ratio.mean()),
                                "dmpo/log_ref_minus_v_std": float(log_ratio.std()) if N > 1 else 0.0})

    def _kl_estimator(self, buf) -> dict:
        """The family's per-token estimator (`logprob_estimator`: exact, mean-field, per-step) for `diag/kl_*`. Not
        the ELBO: its token terms `log p * T / m` sum to a sequence estimate but are not per-token log-probs, and
        exp() of their differences (k3) blows up with T / m (10^2-10^6 nats on 256 image tokens)."""
        kind = "mean_field" if self.cfg.logprob_estimator == "elbo" else None
        return self.estimator_options(buf.mask_seeds[0], kind=kind)

    def kl_diagnostics(self, buf, idx: torch.Tensor, inner: int, current: torch.Tensor | None = None) -> dict[str, float]:
        """`mmrl.core.diagnostics.micro_batch_sums` of the KL of the behaviour policy (the policy before the buffer's
        first update) to the reference, from the per-token terms `prepare` kept (`_kl_estimator`), at the buffer's
        first inner step: no forward here (a no-grad forward per micro-batch and optimizer step would add to every
        update). With the KL term the loss's own per-token scores at the first inner step (`current` [n, T], the
        behaviour's) serve on every buffer, as a policy-gradient KL term's do."""
        if not buf.ref_logp or inner != 0:
            return {}
        if buf.method_state.get("kl_measured"):
            logp = buf.old_logp[0][idx]
        elif current is not None:
            logp = current.detach()
        else:
            return {}
        return micro_batch_sums(buf.loss_mask[idx], logp=logp, ref_logp=buf.ref_logp[0][idx])

    def kl_term(self, buf, mb: MicroBatch, rows, exact: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(`beta` x the global token mean of k3 KL(pi_theta || pi_ref) of this micro-batch (carries the gradient),
        the per-token scores it used [n, T]): the loss's exact log-probs `exact` [n, T] where the family has them
        (autoregressive), else a gradient forward with the family's per-token estimator (`_kl_estimator`)."""
        cfg, idx = self.cfg, mb.idx
        logp = exact if exact is not None else self.policy.logprob(rows, **self._kl_estimator(buf)).logp  # [n, T]
        mask = buf.loss_mask[idx].to(logp.device).bool()  # [n, T]
        ref = buf.ref_logp[0][idx].to(device=logp.device, dtype=logp.dtype)  # [n, T]
        zero = torch.zeros_like(logp)
        kl = k3_kl(torch.where(mask, logp, zero), torch.where(mask, ref, zero))  # [n, T]
        return cfg.beta * aggregate(kl, mask, "token_mean", num_items=mb.g_tokens), logp

    def loss(self, buf, mb: MicroBatch) -> LossOutput:
        """WDCE (eq. 11) or WDDO on R masked copies of each response (fresh masks every micro-step)."""
        cfg, policy = self.cfg, self.policy
        idx = mb.idx
        rows = buf.rollout.select(idx)
        gen = torch.Generator(device="cpu").manual_seed(derived_seed(cfg.seed, "noise", mb.step, mb.micro, mb.rank))
        noised: NoisedBatch = policy.forward_noise(rows, cfg.dmpo_num_copies, gen, min_rate=cfg.dmpo_min_mask_rate)
        lp = policy.denoise_logprob(noised)  # [R, n, T]
        masked_sum = lp.sum(-1)  # [R, n]
        elbo_theta = _copy_elbos(masked_sum, noised)  # [R, n]
        kl_loss, kl_logp = None, None
        if cfg.beta > 0:
            kl_loss, kl_logp = self.kl_term(buf, mb, rows, lp[0] if _is_exact(noised) else None)
        m: dict[str, float] = self.kl_diagnostics(buf, idx, mb.inner, kl_logp) if cfg.log_diagnostics else {}
        credit = None
        G = cfg.num_generations
        if cfg.dmpo_loss == "wdce":
            w = buf.method_state["weights"][idx]  # [n]
            if cfg.dmpo_baseline == "model":
                log_theta_minus_v = elbo_theta.detach().mean(0) - buf.method_state["elbo_v"][idx]  # [n]
                w_base = dmpo_baseline("model", rewards=buf.rewards[idx], log_ref_minus_v=torch.zeros_like(w), group_size=G,
                                       log_theta_minus_v=log_theta_minus_v)
            elif cfg.dmpo_baseline == "micro_batch_mean":  # the authors' code: the mean over this micro-batch
                w_base = micro_batch_mean_baseline(w)
            else:
                w_base = buf.method_state["baseline_weights"][idx]
            w_real = dmpo_real_weights(w, w_base, cfg.dmpo_baseline_strength, cfg.dmpo_negative_scale)  # [n]
            if cfg.dmpo_trust_region is not None:  # the same shared masks as the buffer's log p_v: a low-noise difference
                with torch.no_grad():
                    now = policy.logprob(rows, **self.estimator_options(buf.mask_seeds[0], kind="elbo")).logp.sum(-1)
                n_tok = buf.loss_mask[idx].sum(-1).clamp(min=1).to(now.dtype)  # [n]
                per_token = (now.to(buf.method_state["elbo_v"].device) - buf.method_state["elbo_v"][idx]) / n_tok.to(buf.method_state["elbo_v"].device)
                keep = dmpo_trust_region_gate(w_real, per_token, cfg.dmpo_trust_region)  # [n]
                m["dmpo/trust_region_clipped"] = float(1 - keep.float().mean())
                m["dmpo/log_ratio_per_token"] = float(per_token.mean())
                w_real = w_real * keep.to(w_real.dtype)
            fit_sum = masked_sum  # [R, n]
            if "token_mask" in buf.method_state:  # WDCE on the kept tokens only, the normaliser unchanged
                fit_sum = token_masked_sum(lp, buf.method_state["token_mask"][idx])  # [R, n]
            loss = wdce_loss(-fit_sum, noised.n_masked, w_real, num_groups=int(mb.g_groups))
            if cfg.log_diagnostics:  # the WDCE weights on each response's log-likelihood
                m.update(micro_batch_sums(buf.loss_mask[idx], w_real))
            m["dmpo/w_real_pos_sum"] = float(w_real.clamp(min=0).sum() / max(1.0, len(idx) / G))
            credit = w_real.detach().float()[:, None] * buf.loss_mask[idx]
            if "token_mask" in buf.method_state:
                credit = credit * buf.method_state["token_mask"][idx].to(credit.device)
        else:
            delta_real, delta_fake = wddo_deltas(elbo_theta, buf.method_state["elbo_v"][idx])
            loss = wddo_loss(delta_real, delta_fake, buf.method_state["weights"][idx], beta=cfg.wddo_beta, alpha_ddo=cfg.wddo_alpha) * len(idx) / mb.g_seqs
            m["dmpo/delta_mean"] = float(delta_real.detach().mean())
            if cfg.log_diagnostics:  # WDDO's weights are the nonnegative importance weights
                m.update(micro_batch_sums(buf.loss_mask[idx], buf.method_state["weights"][idx]))
        m["dmpo/masked_ce"] = float((-masked_sum.detach() / noised.n_masked.clamp(min=1)).mean())
        if kl_loss is not None:
            m["kl"] = float(kl_loss.detach()) / cfg.beta * mb.g_tokens / max(1.0, float(buf.loss_mask[idx].sum()))
            loss = loss + kl_loss
        return LossOutput(loss, m, credit=credit)


@DMPO_TOKEN_MASKS.register("correct_cells")
def _correct_cells(policy, buf) -> torch.Tensor:
    """[N, T] bool: the response tokens equal to the row's `solution` written as a response span
    (`policy.response_templates` of the solution: the same tokens and positions as an infilled response), among the
    tokens the policy chose (`buf.loss_mask`); `correct_token_mask`."""
    solutions = buf.columns.get("solution")
    if solutions is None:
        raise ValueError("dmpo_token_mask='correct_cells' needs a 'solution' column in the training rows (the answer "
                         f"written as the response span); the rows have {sorted(buf.columns)}")
    ids = buf.rollout.response_ids  # [N, T]
    templates = getattr(policy, "response_templates", None)
    answer = templates([{"prompt": "", "response_template": s} for s in solutions], ids.shape[1]) if templates else None
    if answer is None:
        raise ValueError("dmpo_token_mask='correct_cells' needs a policy that writes an answer as a response span "
                         "(`response_templates`: masked-diffusion infilling)")
    return correct_token_mask(ids, answer.to(ids.device), buf.loss_mask.to(ids.device))  # [N, T]


def _is_exact(noised: NoisedBatch) -> bool:
    """One copy with every response token at rate 1: the autoregressive adapters' clean sequence, whose
    `denoise_logprob` equals the teacher-forced per-token log-probs."""
    return noised.num_copies == 1 and bool((noised.rates == 1).all())


def _copy_elbos(masked_sum: torch.Tensor, noised: NoisedBatch) -> torch.Tensor:
    """[R, n] per-copy sequence log-likelihood estimates: exact for AR adapters (one copy, every token at rate 1),
    else `copy_elbos` with |o| the positions any copy may mask."""
    if _is_exact(noised):
        return masked_sum
    n_tokens = noised.noise_mask.any(0).sum(-1).to(masked_sum.dtype)  # [n] maskable positions |o|
    counts = noised.noise_mask.sum(-1).to(masked_sum.dtype).clamp(min=1)  # [R, n]
    return copy_elbos(masked_sum, counts, n_tokens)
