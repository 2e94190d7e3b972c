"""Every name -> object registry of mmrl's engine, in one place (docs/design.md, "Registries").

`Registry` is a `dict` whose lookups of an unknown name and whose registrations of an existing name raise errors
that list the valid names. No plugin discovery and no registration by import side effect in the engine: the
built-in entries are registered by the modules that define them, which the engine imports, and an application
(the tiny world, `mmrl.tiny_world.register()`) registers its own entries explicitly.

The leaf-function registries of the algorithm core (advantages, token weights, aggregations, ...) live beside
their functions in `mmrl.algorithms.registry`.
"""
from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownNameError(KeyError, ValueError):
    """An unknown registry name. A `KeyError` (dict semantics) and a `ValueError` (bad user input)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Registry(dict):
    """A dict of named objects of one kind (`kind` is used in error messages; `hint` is added to the error of an
    unknown name, e.g. where further names come from)."""

    def __init__(self, kind: str, hint: str = ""):
        super().__init__()
        self.kind, self.hint = kind, hint

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that adds an object under `name`; registering a taken name raises `ValueError`."""

        def deco(fn: F) -> F:
            if name in self:
                owner = getattr(self[name], "__module__", "?") + "." + getattr(self[name], "__qualname__", repr(self[name]))
                raise ValueError(f"{self.kind} {name!r} is already registered (by {owner}); choose another name. "
                                 f"Registered: {sorted(self)}")
            self[name] = fn
            return fn

        return deco

    def __missing__(self, name):
        raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {sorted(self)}" + (f" ({self.hint})" if self.hint else ""))


_TINY_WORLD = "the tiny world's entries are added by mmrl.tiny_world.register(), which the mmrl command calls"

METHODS = Registry("method")
"""name -> `mmrl.methods.Method` subclass (filled by the modules of `mmrl.methods`)."""
REWARDS = Registry("reward", hint=_TINY_WORLD)
"""name -> reward function `fn(prompts, completions, **kwargs) -> list[float | None]` (filled by mmrl.rewards)."""
TASKS = Registry("task", hint=_TINY_WORLD)
"""name -> loader(dataset_path: str | None, seed: int) -> `mmrl.data.tasks.Task` (filled by mmrl.data.tasks)."""
MODEL_SOURCES = Registry("model source", hint=_TINY_WORLD)
"""prefix -> loader(name: str, family: str) -> policy adapter, for `model_name_or_path = "<prefix>:<name>"`."""
OPTIMIZER_STATES = Registry("optimizer-state source", hint=_TINY_WORLD)
"""prefix -> lookup(name: str) -> Path of the pre-training AdamW state file of model `<prefix>:<name>`
(`mmrl.checkpointing.optimizer_state`, `init_optimizer_from_base`); raises FileNotFoundError when it has none."""
