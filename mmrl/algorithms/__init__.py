"""The algorithm core of mmrl: pure tensor functions, one per equation (see docs/algorithms.md).

No models, no I/O, no global state. Shapes use fixed letters: N responses (= prompts x G), G group size,
T response tokens, V vocabulary, R masked copies.
"""
from mmrl.algorithms.advantages import group_advantages
from mmrl.algorithms.dgpo import dgpo_token_weights, hellinger_entropy
from mmrl.algorithms.distributions import STATS, token_distribution_stats
from mmrl.algorithms.dmpo import (
    antithetic_masks,
    copy_elbos,
    dmpo_baseline,
    dmpo_real_weights,
    dmpo_trust_region_gate,
    dmpo_weights,
    effective_sample_size,
    elbo_from_masked_logp,
    wdce_loss,
    wddo_deltas,
    wddo_loss,
)
from mmrl.algorithms.gcpo import gcpo_token_weights, gcpo_weights_from_scores
from mmrl.algorithms.entropy_mask import high_entropy_mask
from mmrl.algorithms.groups import check_group_size
from mmrl.algorithms.policy_loss import LOSS_TYPES, accumulated_loss, aggregate, k3_kl, policy_loss, surrogate_loss
from mmrl.algorithms.cispo import cispo_loss
from mmrl.algorithms.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    DMPO_BASELINES,
    DMPO_TOKEN_MASKS,
    GCPO_DIVERGENCES,
    POLICY_LOSSES,
    TOKEN_WEIGHTS,
    Registry,
    UnknownNameError,
)
from mmrl.algorithms.reward_shaping import soft_overlong_penalty
from mmrl.algorithms.token_weights import average_ranks, cdf_weights, rank_power_alpha, rank_power_weights, softmax_weights

__all__ = [
    "high_entropy_mask",
    "ADVANTAGES", "AGGREGATIONS", "DMPO_BASELINES", "DMPO_TOKEN_MASKS", "GCPO_DIVERGENCES", "LOSS_TYPES", "POLICY_LOSSES", "STATS", "TOKEN_WEIGHTS", "Registry", "UnknownNameError", "aggregate", "antithetic_masks", "average_ranks",
    "cdf_weights", "check_group_size", "cispo_loss", "copy_elbos", "dgpo_token_weights", "dmpo_baseline", "dmpo_real_weights", "dmpo_trust_region_gate",
    "dmpo_weights", "accumulated_loss", "soft_overlong_penalty", "wddo_deltas", "effective_sample_size",
    "elbo_from_masked_logp", "gcpo_token_weights", "gcpo_weights_from_scores", "group_advantages",
    "hellinger_entropy", "k3_kl", "policy_loss", "rank_power_alpha", "rank_power_weights", "softmax_weights",
    "surrogate_loss", "token_distribution_stats", "wdce_loss", "wddo_loss",
]
