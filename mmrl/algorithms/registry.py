"""Name -> function registries for the leaf functions of the algorithm core (docs/algorithms.md, "Registries").

Plain dicts (`mmrl.core.registry.Registry`): unknown lookups and duplicate registrations raise errors listing the valid
names. The engine's other registries (methods, rewards, tasks, model sources) live in `mmrl.core.registry`.
"""
from __future__ import annotations

from mmrl.core.registry import REWARDS, Registry, UnknownNameError  # noqa: F401  (REWARDS: an alias, see mmrl.core.registry)

ADVANTAGES = Registry("advantage estimator")
"""`scale` name -> fn(rewards [N], group_size, eps) -> advantages [N]."""
TOKEN_WEIGHTS = Registry("token-weight normalization")
"""name -> fn(scores [N,T], mask [N,T], **options) -> weights [N,T] (no grad, 0 on padding)."""
GCPO_DIVERGENCES = Registry("GCPO divergence")
"""name -> fn(logp_pos [N,T], logp_neg [N,T]) -> per-token contrast score [N,T]."""
POLICY_LOSSES = Registry("policy loss")
"""TRL `loss_type` name -> fn(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip, ref_logp, beta, kl_weights) ->
(per-token loss [N,T], metrics); a loss type without an entry takes the clipped surrogate (`policy_loss`). Adding a
plain policy-gradient loss: one function registered here plus its aggregation in `LOSS_TYPES` (verl's
`register_policy_loss`)."""
AGGREGATIONS = Registry("loss aggregation")
"""mode -> fn(per_token_loss [N,T], mask [N,T], **options) -> scalar."""
DMPO_BASELINES = Registry("DMPO weight baseline")
"""kind -> fn(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v) -> w_base [N]."""
DMPO_TOKEN_MASKS = Registry("DMPO token mask")
"""`dmpo_token_mask` name -> fn(policy, buf) -> [N, T] bool: the response tokens WDCE fits (entries in
`mmrl.methods.dmpo`, which read the buffer)."""
