"""What a training method is to the trainer: the `Method` interface, the `METHODS` registry and the two small
records a loss receives and returns (docs/design.md, "Methods").

The trainer runs one loop for every method. At each buffer refresh it calls `method.shape_rewards(...)` (reward
shaping before the advantages: STAGE's entropy reward by default), then `method.prepare(buffer, ...)` (no gradient: behaviour and
reference log-probs, token weights, importance weights, kept in `buffer.method_state`), and for every micro-batch
of an optimizer step `method.loss(buffer, micro_batch)`. `TrainConfig.validate` asks the method for the errors it
knows of (`config_errors`). What a method needs (a reference model, behaviour log-probs,
mask seeds) it declares through the class methods below, so the trainer and the policy factory never test a
method's name.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from mmrl.core.registry import METHODS
from mmrl.core.seeds import derived_seed
from mmrl.methods.entropy_reward import stage_entropy_reward


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one optimizer step, with the global normalisers of that step."""

    idx: torch.Tensor
    """[n] buffer rows of this micro-batch."""
    inner: int
    """Optimizer step within the buffer, 0 .. num_iterations - 1."""
    micro: int
    """Index of the micro-batch within the optimizer step."""
    step: int
    """Optimizer steps taken before this one (seeds the DMPO noise)."""
    rank: int
    """Process index (seeds the DMPO noise)."""
    g_tokens: float
    """Valid loss tokens of the global batch (all processes, all micro-batches)."""
    g_seqs: float
    """Responses of the global batch."""
    g_groups: float
    """Groups (prompts) of the global batch."""


@dataclass
class LossOutput:
    """What `Method.loss` returns; the trainer, not the method, writes the buffer."""

    loss: torch.Tensor
    """Scalar loss of this micro-batch, already scaled by the global normalisers."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-micro-batch metrics (averaged over the step weighted by micro-batch size)."""
    credit: torch.Tensor | None = None
    """[n, T] effective per-token credit of these rows for the token-credit pictures, or None (no update)."""
    token_stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """[n, T] per-token statistics taken from the gradient forward when no behaviour forward ran (one step per
    rollout); gathered over the step and turned into buffer metrics by `Method.token_stat_metrics`."""


class Method(abc.ABC):
    """A training method: what it needs, `prepare` at buffer time and `loss` per micro-batch.

    Subclasses register themselves with `@METHODS.register(name)` for every method name they implement (GRPO,
    DAPO and Dr.GRPO share one class: their differences are config defaults, `mmrl.config.train_config.METHOD_DEFAULTS`).
    """

    uses_behaviour_logprobs: ClassVar[bool] = True
    """Whether the loss uses behaviour log-probs (a PPO-style ratio); False for weight-based losses (DMPO)."""
    has_kl_token_masks: ClassVar[bool] = False
    """Whether the method has token masks that weight its KL term (`kl_reweight`: GCPO, STAGE)."""
    supports_entropy_mask: ClassVar[bool] = False
    """Whether `top_entropy_quantile` < 1 can mask the loss's tokens (a per-token policy-gradient loss)."""

    def __init__(self, cfg, policy, estimator_options):
        self.cfg, self.policy = cfg, policy
        self.estimator_options = estimator_options
        """fn(mask_seed, kind=None) -> the `logprob()` options of the policy's family."""

    @classmethod
    def needs_reference(cls, cfg) -> bool:
        """Whether a frozen reference model must be built (a KL term, or the entropy reward's reference entropies,
        by default)."""
        return cfg.beta > 0 or cfg.gcpo_entropy_reward > 0

    @classmethod
    def num_mask_seeds(cls, cfg) -> int:
        """How many estimator mask seeds one buffer draws (one per inner step with `random_masking`)."""
        return cfg.num_iterations if cfg.random_masking else 1

    @classmethod
    def config_errors(cls, cfg) -> list[str]:
        """One-line errors for settings this method cannot run with (`TrainConfig.validate`, before any model
        loads), each naming the value and what is allowed: `kl_reweight` without KL token masks."""
        if cfg.kl_reweight and not cls.has_kl_token_masks:
            own = " or ".join(name for name, m in METHODS.items() if m.has_kl_token_masks)
            return [f"kl_reweight=true weights the KL by a method's token masks; method {cfg.method!r} has none (use {own})"]
        return []

    @classmethod
    def supports_family(cls, adapter_cls) -> bool:
        """Whether this method runs on the family of `adapter_cls` (the method x family matrix asks); all by default."""
        return True

    def shape_rewards(self, rollout, rewards: torch.Tensor, micro_batches, rollout_index: int
                      ) -> tuple[torch.Tensor, dict[str, float]]:
        """The method's reward shaping of a rollout batch, before the advantages (the trainer runs it under
        `torch.no_grad()`).

        `rewards` [N] are the weighted reward totals, `micro_batches(n)` gives the index tensors the updates use,
        `rollout_index` numbers the rollout batch (for seeds). Returns the shaped rewards [N] and buffer metrics
        (averaged like the per-reward metrics). By default STAGE's entropy reward when `gcpo_entropy_reward > 0`
        (`mmrl.methods.entropy_reward.stage_entropy_reward`, with the reference's entropies), else nothing."""
        cfg = self.cfg
        if not cfg.gcpo_entropy_reward > 0:
            return rewards, {}
        est = self.estimator_options(derived_seed(cfg.seed, "entropy_reward", rollout_index))
        bonus = stage_entropy_reward(self.policy, rollout, rewards, cfg, micro_batches, est)  # [N]
        return rewards + bonus, {"rewards/entropy_bonus/abs_mean": float(bonus.abs().mean())}

    @abc.abstractmethod
    def prepare(self, buf, micro_batches: list[torch.Tensor], *, current: bool) -> None:
        """Fill the buffer's per-response quantities (runs under `torch.no_grad()`).

        `current`: the behaviour policy is the policy being updated (see `behaviour_is_current`)."""

    @abc.abstractmethod
    def loss(self, buf, mb: MicroBatch) -> LossOutput:
        """The loss of one micro-batch (carries the gradient)."""

    def token_stat_metrics(self, buf, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """Buffer metrics of [N, T] per-token statistics: the mean policy entropy."""
        mask = buf.loss_mask
        count = mask.sum().clamp(min=1)
        return {"entropy": float((stats["entropy"] * mask).sum() / count)}


@dataclass
class MicroBatchInputs:
    """What a policy-gradient loss of one micro-batch starts from (`micro_batch_inputs`)."""

    rows: object
    """The micro-batch's rows of the rollout (`Rollout.select`)."""
    mask: torch.Tensor
    """[n, T] bool: the tokens the loss sees."""
    advantages: torch.Tensor
    """[n] group advantages."""
    est: dict
    """The family's `logprob()` options for this inner step's mask seed."""
    current: bool
    """No stored behaviour log-probs: one step per rollout, the gradient forward's detached scores are the
    behaviour's (`behaviour_is_current`)."""
    stored_old: torch.Tensor | None
    """[n, T] stored behaviour log-probs of this inner step's mask seed, or None when `current`."""
    ref_logp: torch.Tensor | None
    """[n, T] stored reference log-probs of this mask seed, or None."""

    def behaviour(self, logp: torch.Tensor) -> torch.Tensor:
        """[n, T] the behaviour log-probs: the stored ones, or the detached `logp` of this forward when `current`."""
        return logp.detach() if self.current else self.stored_old


def micro_batch_inputs(method: Method, buf, mb: MicroBatch) -> MicroBatchInputs:
    """The rows, mask, advantages, estimator options and behaviour / reference log-probs of micro-batch `mb`
    (the inner step `mb.inner` uses mask seed `inner % len(mask_seeds)`)."""
    idx = mb.idx
    seed_k = mb.inner % len(buf.mask_seeds)
    current = not buf.old_logp
    return MicroBatchInputs(rows=buf.rollout.select(idx), mask=buf.loss_mask[idx], advantages=buf.advantages[idx],
                            est=method.estimator_options(buf.mask_seeds[seed_k]), current=current,
                            stored_old=None if current else buf.old_logp[seed_k][idx],
                            ref_logp=buf.ref_logp[seed_k][idx] if buf.ref_logp else None)


def first_inner_drift(x: MicroBatchInputs, logp: torch.Tensor, inner: int) -> dict[str, float]:
    """`policy/first_inner_logp_max_diff`: at the first inner step with stored behaviour log-probs, the largest
    |logp - old| over valid tokens (0 up to float noise: the same forward on the same micro-batch)."""
    if inner != 0 or x.current:
        return {}
    with torch.no_grad():
        dev = (logp.detach() - x.stored_old).abs()
        return {"policy/first_inner_logp_max_diff": float(dev[x.mask].max()) if x.mask.any() else 0.0}


def behaviour_is_current(cfg) -> bool:
    """Whether the behaviour (old) log-probs are the detached log-probs of the gradient forward itself.

    With one optimizer step per rollout (`num_iterations = 1` and `steps_per_generation` =
    `gradient_accumulation_steps`) the policy that sampled is the policy being updated,
    and a separate no-grad forward would give the very numbers the gradient forward gives (same code, same
    micro-batches, same mask seeds: the first step's ratio is exactly 1). So that forward is skipped, as TRL skips
    it (`old_per_token_logps = None` when generation and optimizer steps are aligned), and the statistics taken at
    buffer time (entropy; DGPO's Hellinger deviation against the reference, whose pass also gives the KL's
    reference log-probs) are taken from the gradient forward's logits. Methods without behaviour log-probs (DMPO)
    never take this path."""
    return cfg.steps_per_rollout == 1 and METHODS[cfg.method].uses_behaviour_logprobs


def weight_metrics(prefix: str, w: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean, std, max of token weights over valid tokens and the fraction above 2."""
    v = w[mask]
    if v.numel() == 0:
        return {}
    return {f"{prefix}/weight_mean": float(v.mean()), f"{prefix}/weight_std": float(v.std()) if v.numel() > 1 else 0.0,
            f"{prefix}/weight_max": float(v.max()), f"{prefix}/frac_weight_gt_2": float((v > 2).float().mean()),
            f"{prefix}/tokens_for_half": float(tokens_for_mass(w, mask).nanmean())}


def tokens_for_mass(w: torch.Tensor, mask: torch.Tensor, mass: float = 0.5) -> torch.Tensor:
    """[N] per answer, the smallest share of its loss tokens whose |weights| sum to at least `mass` of the answer's
    total (the heaviest first): 0.5 for uniform weights (a little above, by rounding up), near 1/T when one token
    carries the credit; nan for an answer with no loss token. w, mask: [N, T]."""
    a = (w.abs() * mask).float()  # [N, T]
    top = a.sort(dim=1, descending=True).values.cumsum(1)  # [N, T]
    total = top[:, -1:]  # [N, 1]
    count = (top < mass * total - 1e-12).sum(1) + 1  # [N] tokens needed
    n = mask.sum(1).float()  # [N]
    return torch.where(n > 0, count.float() / n.clamp(min=1), torch.full_like(n, float("nan")))


def zeros_like_tokens(buf) -> torch.Tensor:
    """[N, T] float32 zeros shaped like the buffer's loss mask."""
    return torch.zeros_like(buf.loss_mask, dtype=torch.float32)

