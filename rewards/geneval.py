"""GenEval rewards for image models, on top of the GenEval scoring code and any detector backend.

- `geneval`: the official per-image rule (1.0 correct / 0.0);
- `geneval_strict`: Flow-GRPO's `strict_correct` (exact counts, exact colour counts);
- `geneval_partial`: Flow-GRPO's partial credit, with its position quirk fixed and its count term clamped at 0
  (`mmrl.geneval.rules.partial_score` documents both); `flow_grpo_exact=True` (reward_kwargs) keeps both quirks;
- `geneval_flow_grpo`: exactly the partial credit of Flow-GRPO's and GCPO's `evaluate_reward` (yifan123/flow_grpo
  reward server; jacklishufan/gcpo `t2i/src/grpo/src/utils/reward_geneval.py`), i.e. `geneval_partial` with
  `flow_grpo_exact=True`;

each returning `{"score": ..., "correct", "strict", "partial"}` so all three are logged. The GenEval metadata record of
each sample comes from the `metadata` column (dicts or JSON strings). The detector (default: the shapes world's exact
detector) and the optional CLIP colour classifier load lazily, once per process and configuration.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from mmrl.core.registry import REWARDS
from mmrl.core.lazy import load_once

VARIANTS = ("correct", "strict", "partial")


class GenEvalReward:
    """A GenEval reward (`variant` in "correct", "strict", "partial").

    Args:
        detector: backend name ("shapes", "hf", "mmdet"; see `mmrl.geneval.detectors`).
        options: GenEval options by official name (threshold, counting_threshold, max_objects, ...).
        clip_model, clip_weights: the CLIP colour classifier for detectors without colours (local weights).
        device: where detector and classifier run.
        metadata_key: the column that holds each sample's metadata record.
        detector_config: passed to the backend (e.g. grid=12 for shapes, model_path=... for hf).
        flow_grpo_exact: the partial score exactly as Flow-GRPO's (count term unclamped, position quirk kept).
    """

    in_process = True
    """Runs in the trainer's process under `reward_timeout` (`mmrl.rewards.isolation`): it holds a model or sockets."""

    variant = "partial"
    flow_grpo_exact = False

    def __init__(self, detector: str = "shapes", *, options: Mapping[str, Any] | None = None, clip_model: str | None = None,
                 clip_weights: str | None = None, device: str = "cpu", metadata_key: str = "metadata",
                 variant: str | None = None, flow_grpo_exact: bool | None = None, **detector_config: Any):
        from mmrl.geneval.detectors import detector_names
        from mmrl.geneval.rules import Options

        self.variant = variant or self.variant
        if flow_grpo_exact is not None:
            if not isinstance(flow_grpo_exact, bool):
                raise ValueError(f"flow_grpo_exact must be true or false, got {flow_grpo_exact!r}")
            self.flow_grpo_exact = flow_grpo_exact
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown GenEval reward variant {self.variant!r}; valid: {list(VARIANTS)}")
        if detector not in detector_names() or detector == "precomputed":
            raise ValueError(f"GenEval rewards detect on the fly: detector must be one of "
                             f"{[d for d in detector_names() if d != 'precomputed']}, got {detector!r}")
        self.options = Options.parse(dict(options or {}))
        self.detector_name, self.detector_config, self.device = detector, dict(detector_config), device
        self.clip_model = clip_model or self.options.clip_model
        self.clip_weights, self.metadata_key = clip_weights, metadata_key
        self.__name__ = "geneval" if self.variant == "correct" else f"geneval_{self.variant}"
        if self.flow_grpo_exact and self.variant == "partial":
            self.__name__ = "geneval_flow_grpo"

    def detector(self):
        from mmrl.geneval.detectors import build_detector

        key = ("geneval-detector", self.detector_name, self.device, json.dumps(self.detector_config, sort_keys=True, default=str))
        return load_once(key, lambda: build_detector(self.detector_name, device=self.device, **self.detector_config))

    def classifier(self):
        if self.clip_weights is None:
            return None
        from mmrl.geneval.colors import ClipColorClassifier

        key = ("geneval-colors", self.clip_model, self.clip_weights, self.options.bgcolor, self.options.crop, self.device)
        return load_once(key, lambda: ClipColorClassifier(self.clip_model, self.clip_weights, bgcolor=self.options.bgcolor,
                                                          crop=self.options.crop, device=self.device))

    def __call__(self, prompts, completions, **kwargs) -> list[dict]:
        from PIL import Image

        from mmrl.geneval.rules import validate_metadata
        from mmrl.geneval.scoring import score_image

        records = kwargs.get(self.metadata_key)
        if records is None:
            raise ValueError(f"GenEval rewards need each sample's metadata record in the {self.metadata_key!r} column")
        records = [json.loads(r) if isinstance(r, str) else r for r in records]
        for i, r in enumerate(records):
            validate_metadata(r, f"{self.metadata_key}[{i}]")
        images = list(completions)
        for i, im in enumerate(images):
            if not isinstance(im, Image.Image):
                raise TypeError(f"GenEval rewards need PIL images as completions, got {type(im).__name__} at {i}")
        detections = self.detector().detect(images)
        classify = self.classifier()
        out = []
        for im, record, dets in zip(images, records, detections):
            s = score_image(im, record, dets, self.options, classify, variants=True, flow_grpo_exact=self.flow_grpo_exact)
            values = {"correct": float(s["correct"]), "strict": float(s["strict"]), "partial": float(s["partial"])}
            out.append({"score": values[self.variant], **values})
        return out


@REWARDS.register("geneval")
class GenEvalCorrect(GenEvalReward):
    """The official GenEval rule as a 1 / 0 reward."""

    variant = "correct"


@REWARDS.register("geneval_strict")
class GenEvalStrict(GenEvalReward):
    """Flow-GRPO's strict GenEval reward (exact counts)."""

    variant = "strict"


@REWARDS.register("geneval_partial")
class GenEvalPartial(GenEvalReward):
    """Flow-GRPO's partial-credit GenEval reward (fixed: position quirk, count term clamped at 0)."""

    variant = "partial"


@REWARDS.register("geneval_flow_grpo")
class GenEvalFlowGRPO(GenEvalReward):
    """The partial-credit GenEval reward exactly as Flow-GRPO and GCPO's T2I branch train on (both quirks kept)."""

    variant = "partial"
    flow_grpo_exact = True
