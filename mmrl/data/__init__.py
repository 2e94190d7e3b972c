"""Prompt datasets and synthetic worlds (installed as `mmrl.data`): `shapes` is the tiny text-to-image world."""
