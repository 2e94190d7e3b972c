"""Moving the reference model towards the policy (TRL `GRPOConfig.sync_ref_model`).

Source: Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good Alignment" (TR-DPO), eq. 5, soft update
`theta_ref <- alpha * theta + (1 - alpha) * theta_ref`; TRL's `SyncRefModelCallback` applies it every
`ref_model_sync_steps` optimizer steps with `alpha = ref_model_mixup_alpha`.
"""
from __future__ import annotations

import torch


@torch.no_grad()
def mix_into_reference(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float) -> None:
    """In place: every reference parameter becomes `alpha * policy + (1 - alpha) * ref` (matched by name; the two
    models have one architecture). alpha in (0, 1]; 1 copies the policy."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    theirs = dict(policy.named_parameters())
    for name, p in ref.named_parameters():
        if name not in theirs:
            raise ValueError(f"the reference has parameter {name!r}, which the policy has not")
        p.mul_(1 - alpha).add_(theirs[name].detach().to(p.device, p.dtype), alpha=alpha)
