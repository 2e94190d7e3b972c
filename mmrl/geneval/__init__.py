"""GenEval (Ghosh et al., NeurIPS 2023 D&B), faithful and installable: the official prompt metadata and generator,
the per-image rule, pluggable detectors (mmdet, transformers, the shapes world, precomputed JSONL), the summary, and
the `mmrl geneval` command. See `rules.py` for the rule and its sources.
"""
from mmrl.geneval.rules import (
    GENEVAL_COLORS,
    RELATIONS,
    TASKS,
    Detection,
    Options,
    Verdict,
    judge,
    judge_strict,
    partial_score,
    relative_position,
    select_detections,
    validate_metadata,
)

__all__ = [
    "GENEVAL_COLORS", "RELATIONS", "TASKS", "Detection", "Options", "Verdict", "judge", "judge_strict",
    "partial_score", "relative_position", "select_detections", "validate_metadata",
]
