"""Checkpoints: atomic writes, manifests, sharded saves, resuming a run, the run lock."""
