"""Text-to-image RL on a masked image-token generator: DMPO vs GRPO on the tiny aMUSEd
(`mmrl replicate dmpo-vs-grpo-masked`).

Both arms start from the cached `shapes-masked` base (`mmrl pretrain-tiny shapes-masked`), train on the shapes
training prompts with the same rollouts per step (16 prompts x 8 images, the MaskGIT sampler at temperature 1, CFG
2, log-probs of the conditional logits as the Janus recipe), seeds, learning rate and schedule, and are scored on the held-out prompts by the GenEval rule through the
exact `shapes` detector, per task (`mmrl.tiny_world.shapes_eval`, sampled at the rollouts' CFG 2), with the runner of the Janus comparison
(`mmrl.tiny_world.shapes_rl.run_shapes_rl`). The arms differ in the method:

- GRPO: the clipped surrogate on group advantages with the per-step likelihood estimator (`logprob_estimator:
  per_step`, each image token scored at the sampler step that revealed it: the token draws of the trajectory, in
  the spirit of diffu-GRPO's one-step estimate) and a k3 KL (beta 0.1), the shapes recipe of the Janus comparison;
- DMPO, weight on right images only: WDCE on masked image tokens (R = 4 antithetic masked copies per image),
  importance weights of the reward-tilted target from the behaviour policy (`dmpo_target: behaviour`, DMPO App.
  B.2), the DMPO quickstart's alpha, one optimizer step per rollout batch (F = 1), and `dmpo_baseline:
  correct_only` (weights >= 0, none on images the GenEval rule scores 0): the one DMPO variant that gained on
  masked-diffusion Countdown (docs/RESULTS.md, "`dllm-countdown3` at 30 rollout batches"), where the group
  baseline's negative weights damaged the shared denoising conditionals;
- DMPO, group baseline: the same with the paper's group baseline (eq. 13), the arm of the old-protocol table.

Under the evaluation protocol (`run_shapes_rl`): validation curves, the compositional test prompts scored once
per run, per-prompt scores, paired-bootstrap intervals; the first difference reported is DMPO (right images only)
- GRPO. Beside the arms (`baselines`, the default): the same model pre-trained on correct captions at the same
compute (`CLEAN_REFERENCE`), best-of-n from the base, and rejection-sampling fine-tuning at the arms' rollouts
(RFT: the base's own images that the arms' reward scores 1, fitted with MaskGIT's pre-training loss, one step per
rollout batch; `mmrl.tiny_world.rft.masked_image_nll`). DMPO with weight on right images only is the RL arm closest
to RFT: both fit only the images the reward accepts, DMPO with importance weights on its current policy's rollouts
and the WDCE loss, RFT uniformly on the base's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

MASKED_RL: dict[str, Any] = {
    "family": "masked_image",
    "task": "shapes",
    "model_name_or_path": "tiny-world:shapes-masked",
    "reward_funcs": ["geneval_strict"],
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 2,
    "max_steps": 40,
    "cfg_scale": 2.0,  # the base follows colour words only with guidance (held-out 0.22 at CFG 1, 0.46 at CFG 2)
    "temperature": 1.0,
    "learning_rate": 5e-4,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "dynamic_sampling": False,
    "loss_type": "dapo",
    "eval_steps": 10,
    "eval_limit": None,
    "save_steps": 40,
    "credit_steps": 20,
}
"""Settings shared by both arms: 16 prompts x 8 images per optimizer step."""

DMPO_ARM: dict[str, Any] = {"method": "dmpo", "dmpo_target": "behaviour", "dmpo_alpha": 0.04, "dmpo_num_copies": 4,
                            # one optimizer step per rollout batch like GRPO (DMPO's default reuse F = 8 samples 8x
                            # fewer rollouts and collapses without a bound: docs/RESULTS.md, "Reasoning RL that learns")
                            "num_iterations": 1}
"""The DMPO settings both DMPO arms share."""

ARMS: dict[str, dict[str, Any]] = {
    "GRPO (per-step)": {"method": "grpo", "logprob_estimator": "per_step", "beta": 0.1, "epsilon_high": 0.28,
                        "dual_clip": 3.0},
    "DMPO, right images only": {**DMPO_ARM, "dmpo_baseline": "correct_only"},
    "DMPO, group baseline": {**DMPO_ARM, "dmpo_baseline": "group"},
}
"""arm label -> its overrides of `MASKED_RL`, in priority order (the report's difference is the second minus the
first)."""

CLEAN_REFERENCE = "shapes-masked-clean"
"""The base pre-trained on correct captions at the same compute (`mmrl pretrain-tiny shapes-masked-clean`)."""

STEPS = 20
"""Optimizer steps (= rollout batches, F = 1) per run under the protocol's budget (docs/RESULTS.md, "Masked image
tokens under the protocol"): 20 x 128 images."""


def run_dmpo_vs_grpo_masked(out: str | Path = "runs/replicate", *, seeds: int = 5, smoke: bool = False,
                            steps: int | None = None, progress: bool = True, n_samples: int | None = None,
                            arms: list[str] | None = None, cutoff: str | None = None,
                            baselines: bool = True) -> dict[str, Any]:
    """Run `arms` (default every arm of `ARMS`) over `seeds` for `steps` (default `STEPS`) rollout batches each,
    with the baseline rows unless `baselines` is False; returns the results dict also written to
    `<out>/dmpo-vs-grpo-masked/results.json`. `cutoff` ("HH:MM" UTC): no run starts after it, the report keeps the
    seeds every arm finished."""
    from mmrl.tiny_world.shapes_rl import run_shapes_rl

    steps = steps if steps is not None or smoke else STEPS
    return run_shapes_rl(Path(out) / "dmpo-vs-grpo-masked", list(arms or ARMS), seeds=seeds, smoke=smoke, steps=steps,
                         progress=progress, n_samples=n_samples, name="dmpo-vs-grpo-masked", base="shapes-masked",
                         recipe=MASKED_RL, arm_table=ARMS, eval_generation={"cfg_scale": MASKED_RL["cfg_scale"]},
                         cutoff=cutoff, baselines=baselines, clean_reference=CLEAN_REFERENCE,
                         rft_reward=MASKED_RL["reward_funcs"][0])
