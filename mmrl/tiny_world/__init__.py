"""The tiny world: tasks with exact rewards, tiny base models pre-trained by mmrl itself, the quickstart and the
toy-scale replications of the three papers. Everything runs on 2 CPU cores without downloads (docs/design.md,
"The tiny world").

It is an application on top of the engine: the engine never imports it. `register()` adds its tasks and rewards
(`mmrl.core.registry.TASKS`, `REWARDS`: sudoku4, countdown3, shapes, ...) and the `tiny-world:NAME` model source
(`mmrl.core.registry.MODEL_SOURCES`). The `mmrl` command calls `register(build_missing=True)`; in Python:

    import mmrl.tiny_world
    mmrl.tiny_world.register()          # then Trainer(load_config(..., task="sudoku4", model_name_or_path="tiny-world:sudoku4"))
"""
from __future__ import annotations


def register(*, build_missing: bool = False) -> None:
    """Register the tiny world's tasks, rewards and base models with the engine (idempotent).

    `build_missing`: a `tiny-world:NAME` model that is not in the cache is pre-trained on first use (about a
    minute on 2 cores) instead of raising. Once asked for, it stays on for the process."""
    from mmrl.tiny_world.sources import register_sources

    import mmrl.tiny_world.tasks  # noqa: F401  (defines and registers the tasks and rewards, once per process)
    import mmrl.tiny_world.countdown_steps  # noqa: F401  (countdown4_steps; it imports tasks, so not from there)

    register_sources(build_missing=build_missing)
    from mmrl.geneval.detectors import register_detector
    from mmrl.tiny_world.shapes import ShapesDetector

    register_detector("shapes", lambda grid=None, **_: ShapesDetector(grid))
