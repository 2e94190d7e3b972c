"""The rollout buffer: one rollout batch with everything computed once per refresh (rewards, advantages, old and
reference log-probs, the method's own per-response quantities), plus its (de)serialisation for checkpoints."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from mmrl.core.protocol import Rollout


@dataclass
class Buffer:
    """A rollout batch of one process and the per-response quantities the inner updates use."""

    rollout: Rollout
    """The sampled responses (N rows, groups contiguous)."""
    rewards: torch.Tensor
    """[N] total (weighted) reward."""
    advantages: torch.Tensor
    """[N] group advantages (zeros for DMPO, which uses weights instead)."""
    loss_mask: torch.Tensor
    """[N, T] bool: the tokens the loss sees (response mask, minus truncated responses when masked)."""
    mask_seeds: list[int]
    """One estimator mask seed per inner iteration (masked diffusion; a single entry otherwise)."""
    old_logp: list[torch.Tensor]
    """Per mask seed: [N, T] log-probs under the behaviour policy, computed by `logprob` on the same micro-batches
    the updates use (so the first inner step has ratio exactly 1)."""
    ref_logp: list[torch.Tensor] | None = None
    """Per mask seed: [N, T] reference log-probs (KL term), or None."""
    method_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """The method's own per-response tensors fixed at buffer time (`Method.prepare` writes, `Method.loss` reads;
    e.g. DGPO's and STAGE's [N, T] `token_weights`, STAGE's [N, T] `kl_weights` (the KL
    term's per-token weights), DMPO's [N] `weights`, `baseline_weights`, `elbo_v`); saved in checkpoints."""
    rollout_index: int = 0
    """Which rollout batch of the run this is (0, 1, ...)."""
    credit: torch.Tensor | None = None
    """[N, T] the effective per-token credit (advantage x token weight) for the pictures, filled during updates."""
    token_stats: dict = field(default_factory=dict)
    """Per-token statistics ([N, T] `entropy`, DGPO's `h2`) the first update takes from its gradient forward when no
    separate behaviour forward ran (one step per rollout); turned into buffer metrics after the step."""
    metrics: dict = field(default_factory=dict)
    """Buffer-time metrics (rewards, lengths, timings)."""
    columns: dict = field(default_factory=dict)
    """The dataset columns the rewards saw (every column but `prompt`), one value per response ([N] lists, the kept
    rows'), for methods that read an answer key at buffer time (DMPO's `dmpo_token_mask`); checkpoints keep the
    JSON-serialisable ones."""

    def store(self, idx: torch.Tensor, out) -> None:
        """Write what a loss handed back (`mmrl.methods.LossOutput`) for rows `idx`: the token credit, the per-token
        statistics."""
        if out.credit is not None:
            if self.credit is None:
                self.credit = torch.zeros_like(self.loss_mask, dtype=torch.float32)
            self.credit[idx] = out.credit
        for k, v in out.token_stats.items():
            if k not in self.token_stats:
                self.token_stats[k] = torch.zeros_like(self.loss_mask, dtype=torch.float32)
            self.token_stats[k][idx] = v

    def to_state(self) -> dict[str, Any]:
        """A dict of tensors and plain values that `torch.load(weights_only=True)` can read back."""
        r = self.rollout
        rollout_state = {}
        for f in fields(r):
            v = getattr(r, f.name)
            if f.name in ("prompts", "completions"):
                v = v if _jsonable(v) else None  # PIL images and other objects are not needed to resume
            elif f.name == "extras":
                v = {k: x for k, x in v.items() if _weights_only_ok(x)}
            rollout_state[f.name] = v
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("rollout", "metrics", "columns")}
        out["columns"] = {k: v for k, v in self.columns.items() if _jsonable(v)}
        out["rollout"] = rollout_state
        out["metrics"] = {k: float(v) for k, v in self.metrics.items() if isinstance(v, (int, float))}
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Buffer":
        rs = dict(state["rollout"])
        if rs.get("prompts") is None:
            rs["prompts"] = [None] * rs["response_ids"].shape[0]
        if rs.get("completions") is None:
            rs["completions"] = [None] * rs["response_ids"].shape[0]
        kw = {k: v for k, v in state.items() if k != "rollout" and k not in LEGACY_METHOD_STATE}
        # checkpoints written before method_state kept these as named buffer fields
        legacy = {LEGACY_METHOD_STATE[k]: v for k, v in state.items() if k in LEGACY_METHOD_STATE and v is not None}
        kw["method_state"] = {**legacy, **(kw.get("method_state") or {})}
        return cls(rollout=Rollout(**rs), **kw)


LEGACY_METHOD_STATE = {"token_weights": "token_weights", "kl_weights": "kl_weights", "dmpo_w": "weights", "dmpo_w_base": "baseline_weights",
                       "dmpo_elbo_v": "elbo_v"}
"""Buffer fields of earlier checkpoints -> their `method_state` key (DGPO's, STAGE's and DMPO's)."""


def _jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _weights_only_ok(v: Any) -> bool:
    if isinstance(v, torch.Tensor) or v is None or isinstance(v, (int, float, str, bool)):
        return True
    if isinstance(v, (list, tuple)):
        return all(_weights_only_ok(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _weights_only_ok(x) for k, x in v.items())
    return False


def _pad_to(x: torch.Tensor, width: int, value: Any, left: bool) -> torch.Tensor:
    """Pad dimension 1 of x [N, L, ...] to `width` with `value`, on the left or the right."""
    extra = width - x.shape[1]
    if extra <= 0:
        return x
    fill = torch.full((x.shape[0], extra, *x.shape[2:]), value, dtype=x.dtype, device=x.device)
    return torch.cat([fill, x] if left else [x, fill], dim=1)


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Stack rollouts of the same policy along N, re-padding prompts on the left and responses on the right.

    Padded positions are masked out (ids there are never read); per-response extras (tensors and lists with a
    leading N dimension) are concatenated, other extras taken from the first rollout.
    """
    if len(rollouts) == 1:
        return rollouts[0]
    first = rollouts[0]
    p_w = max(r.prompt_ids.shape[1] for r in rollouts)
    t_w = max(r.response_ids.shape[1] for r in rollouts)

    def cat(name: str, width: int | None, left: bool, value: Any):
        vals = [getattr(r, name) for r in rollouts]
        if any(v is None for v in vals):
            return None
        w = width if width is not None else max(v.shape[1] for v in vals)
        return torch.cat([_pad_to(v, w, value, left) for v in vals])

    extras = {}
    for k, v in first.extras.items():
        vals = [r.extras.get(k) for r in rollouts]
        if isinstance(v, list):
            extras[k] = [x for vv in vals for x in vv]
        elif isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == first.num_responses:
            extras[k] = torch.cat([_pad_to(x, max(y.shape[1] for y in vals), 0, False) if x.dim() > 1 else x for x in vals])
        else:
            extras[k] = v
    return Rollout(
        prompt_ids=cat("prompt_ids", p_w, True, 0),
        prompt_mask=cat("prompt_mask", p_w, True, False),
        response_ids=cat("response_ids", t_w, False, 0),
        response_mask=cat("response_mask", t_w, False, False),
        group_size=first.group_size,
        prompts=[p for r in rollouts for p in r.prompts],
        completions=[c for r in rollouts for c in r.completions],
        old_logp=cat("old_logp", t_w, False, 0.0),
        neg_prompt_ids=cat("neg_prompt_ids", None, True, 0),
        neg_prompt_mask=cat("neg_prompt_mask", None, True, False),
        extras=extras,
    )
