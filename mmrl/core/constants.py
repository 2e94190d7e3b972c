"""Constants shared by the configuration and the adapters, defined once (light: no torch import)."""

DEFAULT_NEGATIVE_INSTRUCTION = "Note: Intentionally generate an incorrect answer."
"""GCPO's negative condition for text, VLM and diffusion-LM reasoning (authors' `math_format_perception_wrong_answer`,
docs/sources.md "Negative conditions")."""
