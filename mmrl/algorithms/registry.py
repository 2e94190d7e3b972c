"""Name -> function registries for the leaf functions of mmrl (ALGORITHMS.md section 7).

Plain dicts, nothing more: `Registry` is a `dict` whose lookups of an unknown name and whose registrations of
an existing name raise errors that list the valid names. No plugin discovery, no factories.
"""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name. A `KeyError` (dict semantics) and a `ValueError` (bad user input)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Registry(dict):
    """A dict of named functions of one kind (`kind` is used in error messages)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that adds a function under `name`; registering a taken name raises `ValueError`."""

        def deco(fn: F) -> F:
            if name in self:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered (by {self[name].__module__}.{self[name].__qualname__}); "
                    f"choose another name. Registered: {sorted(self)}"
                )
            self[name] = fn
            return fn

        return deco

    def __missing__(self, name):
        raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {sorted(self)}")


ADVANTAGES = Registry("advantage estimator")
"""`scale` name -> fn(rewards [N], group_size, eps) -> advantages [N]."""
TOKEN_WEIGHTS = Registry("token-weight normalization")
"""name -> fn(scores [N,T], mask [N,T], **options) -> weights [N,T] (no grad, 0 on padding)."""
GCPO_DIVERGENCES = Registry("GCPO divergence")
"""name -> fn(logp_pos [N,T], logp_neg [N,T]) -> per-token contrast score [N,T]."""
POLICY_LOSSES = Registry("policy loss")
"""name -> fn(logp, old_logp, advantages, mask, **options) -> (per_token_loss [N,T], metrics)."""
AGGREGATIONS = Registry("loss aggregation")
"""mode -> fn(per_token_loss [N,T], mask [N,T], **options) -> scalar."""
DMPO_BASELINES = Registry("DMPO weight baseline")
"""kind -> fn(rewards, log_ref_minus_v, group_size, alpha, coeff, log_theta_minus_v) -> w_base [N]."""
REWARDS = Registry("reward")
"""name -> reward function `fn(prompts, completions, **kwargs) -> list[float | None]` (filled by mmrl.rewards)."""
