"""The tiny world: tasks with exact rewards, tiny base models pre-trained by mmrl itself, the quickstart and the
toy-scale replications of the three papers. Everything runs on 2 CPU cores without downloads (DESIGN.md)."""
