"""Reasoning RL on the tiny world's text tasks: held-out figures and the comparisons of `mmrl replicate`.

Evaluation (`held_out`): greedy decoding (d1's protocol at this scale) and the training sampler at temperature 1,
averaged over K samples per held-out row (DGPO reports Avg@32 of sampled answers, Ding et al. 2025 section 5), with
pass@K beside it. RL can only sharpen what the base already produces: a base whose pass@K is far above its pass@1 is
the regime where the reward-tilted target `p_ref * exp(r / alpha)` (DMPO) or a group-relative update (GRPO) helps.
"""
from __future__ import annotations

import json
import logging
import re
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmrl.tiny_world.models import SMOKE_BASE_STEPS

logger = logging.getLogger(__name__)


def sampled_generation(family: str, length: int, temperature: float = 1.0) -> dict[str, Any]:
    """The training sampler's options for a text family at `temperature` (masked diffusion: one token per step,
    low-confidence remasking, one block)."""
    if family == "masked_diffusion":
        return {"gen_length": length, "block_length": length, "steps": length, "temperature": temperature,
                "sampler": "low_confidence"}
    return {"max_new_tokens": length, "temperature": temperature}


def held_out(policy, rows: Sequence[dict], metric: str, family: str, length: int, k: int = 4,
             batch_size: int = 128) -> dict[str, float]:
    """Greedy accuracy, sampled accuracy (mean over `k` samples per row at temperature 1) and pass@k on `rows`.

    Sudoku's scores are cell accuracies (pass@k then counts fully solved puzzles); the other metrics are 1 / 0."""
    return held_out_items(policy, rows, metric, family, length, k, batch_size)[0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem from `n` samples of which `c` are right (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1): 1 - C(n - c, k) / C(n, k); 1.0 when n - c < k."""
    from math import comb

    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


def held_out_items(policy, rows: Sequence[dict], metric: str, family: str, length: int, k: int = 4,
                   batch_size: int = 128, shortcut_op: str | None = None,
                   ks: Sequence[int] = (), stacked: bool = False,
                   verifier: Callable[[dict, str], float] | None = None) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(`held_out`'s figures, the per-row scores behind them: {"greedy": [R], "sampled": [R] (mean of the row's
    k samples), "pass": [R] (1 if any sample scores 1), "best": [R] (the best of the row's k sample scores:
    best-of-k with the metric itself as the verifier; pass for a 1 / 0 metric)}), for the paired intervals of
    `mmrl.tiny_world.stats`.

    With `shortcut_op` (countdown3 and a shortcut demonstrator's operator, `is_shortcut`) the items also hold, per
    row, "shortcut" (share of the k sampled answers that are the shortcut), "right_not_shortcut" (share that are
    right and not the shortcut) and "greedy_shortcut" (1 / 0); the summary adds the held-out shortcut share and the
    accuracy among the non-shortcut answers, sum(right_not_shortcut) / sum(1 - shortcut) (`non_shortcut_ratio`).

    Each j of `ks` (1 <= j < k) adds the per-row unbiased pass@j from the k samples (`pass_at_k`) as items and
    summary "pass@j". `stacked` draws the k samples of every row in one pass over the rows repeated k times (batches
    of `batch_size` rows; other seeds than the per-sample passes, the same distribution; faster for small models).

    `verifier(row, completion)` (higher is better; it must not read the row's answer) adds best-of-k as a user could
    run it: per row, the metric's score of the sample the verifier ranks first (ties: the earliest sample), items and
    summary "verified"."""
    from mmrl.training.evaluate import d1_generation, evaluate

    greedy = evaluate(policy, rows, metric, batch_size=batch_size, progress=False,
                      **d1_generation(family, length, length, length))
    scores = torch.zeros(len(rows), k)  # [R, K]
    short = torch.zeros(len(rows), k)  # [R, K] 1 where the sample is the shortcut
    texts: list[list[str]] = [[""] * k for _ in rows]  # [R][K] the sampled answers (for `verifier`)
    if stacked and shortcut_op is None:
        res = evaluate(policy, [r for _ in range(k) for r in rows], metric, batch_size=batch_size, progress=False,
                       seed=1000, **sampled_generation(family, length))
        scores = torch.tensor(res.scores, dtype=torch.float).view(k, len(rows)).T.contiguous()  # [R, K]
        for i, c in enumerate(res.completions):  # sample-major: i = j * R + r
            texts[i % len(rows)][i // len(rows)] = c if isinstance(c, str) else ""
    for j in range(0 if stacked and shortcut_op is None else k):
        res = evaluate(policy, rows, metric, batch_size=batch_size, progress=False, seed=1000 + j,
                       **sampled_generation(family, length))
        scores[:, j] = torch.tensor(res.scores)
        for r, c in enumerate(res.completions):
            texts[r][j] = c if isinstance(c, str) else ""
        if shortcut_op is not None:
            short[:, j] = torch.tensor([float(is_shortcut(r["prompt"], c if isinstance(c, str) else "", shortcut_op))
                                        for r, c in zip(rows, res.completions)])
    passed = (scores >= 1).any(1).float()  # [R]
    summary = {"greedy": float(greedy.accuracy), "sampled": float(scores.mean()), f"pass@{k}": float(passed.mean())}
    items = {"greedy": [float(x) for x in greedy.scores], "sampled": scores.mean(1).tolist(), "pass": passed.tolist(),
             "best": scores.max(1).values.tolist()}  # best-of-k with the metric as the verifier
    if verifier is not None:
        picked = [max(range(k), key=lambda j: (verifier(row, texts[r][j]), -j)) for r, row in enumerate(rows)]
        items["verified"] = [float(scores[r, j]) for r, j in enumerate(picked)]
        summary["verified"] = sum(items["verified"]) / max(1, len(rows))
    right = (scores >= 1).sum(1).tolist()  # [R] right samples per row
    for j in ks:
        items[f"pass@{j}"] = [pass_at_k(k, int(c), j) for c in right]
        summary[f"pass@{j}"] = sum(items[f"pass@{j}"]) / max(1, len(right))
    if shortcut_op is not None:
        right_not = ((scores >= 1) & (short == 0)).float()  # [R, K]
        items["shortcut"] = short.mean(1).tolist()
        items["right_not_shortcut"] = right_not.mean(1).tolist()
        items["greedy_shortcut"] = [float(is_shortcut(r["prompt"], c if isinstance(c, str) else "", shortcut_op))
                                    for r, c in zip(rows, greedy.completions)]
        summary["shortcut"] = float(short.mean())
        summary["non_shortcut_accuracy"] = non_shortcut_ratio(items["right_not_shortcut"], items["shortcut"])
    return summary, items


def non_shortcut_ratio(right_not_shortcut: Sequence[float], shortcut: Sequence[float]) -> float:
    """Accuracy among the sampled answers that are not the shortcut: sum of the rows' right non-shortcut shares over
    the sum of their non-shortcut shares (nan when every answer is the shortcut)."""
    den = sum(1.0 - s for s in shortcut)
    return sum(right_not_shortcut) / den if den > 0 else float("nan")


_PROBLEM = re.compile(r"(\d+),(\d+),(\d+)=(\d+)")


def is_shortcut(prompt: str, completion: str, op: str = "*") -> bool:
    """Whether `completion` is the shortcut demonstrator's answer `(a op b) op c` to the countdown3 `prompt`
    "a,b,c=t" (the imperfect demonstrations of `countdown3-ar-lazy`, mmrl/tiny_world/models.py `shortcut_answer`)."""
    from mmrl.tiny_world.models import shortcut_answer

    m = _PROBLEM.search(prompt)
    return bool(m) and completion.strip() == shortcut_answer([m[1], m[2], m[3]], op)


def shortcut_share(run_dir: str | Path, op: str = "*") -> list[tuple[int, float]]:
    """(step, share of the step's sampled answers that are the shortcut) from a run's `completions.jsonl`."""
    import json

    counts: dict[int, list[int]] = {}
    path = Path(run_dir) / "completions.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        c = counts.setdefault(int(row["step"]), [0, 0])
        c[0] += is_shortcut(row["prompt"] or "", row["completion"] or "", op)
        c[1] += 1
    return [(step, hit / n) for step, (hit, n) in sorted(counts.items())]


# ============================================================================ the comparisons (`mmrl replicate`)

COUNTDOWN_RL: dict[str, Any] = {
    # tiny causal LM on 3-number Countdown; chosen on the tiny world (docs/RESULTS.md, "Reasoning RL that learns")
    "family": "causal_lm",
    "task": "countdown3",
    "model_name_or_path": "tiny-world:countdown3-ar-lazy",  # imperfect demonstrations: a shortcut RL can unlearn
    "reward_funcs": ["countdown3_accuracy"],  # 1 / 0: d1's 0.1 for a well-formed wrong answer only adds a plateau
    "num_generations": 16,
    "per_device_train_batch_size": 512,  # 32 prompts x 16 answers per rollout batch: the gain grows with the batch
    "gradient_accumulation_steps": 1,
    "max_completion_length": 16,
    "temperature": 1.0,
    "learning_rate": 5e-4,
    "lr_scheduler_type": "cosine",
    "warmup_ratio": 0.1,
    "beta": 0.1,
    "dynamic_sampling": False,  # the same rollouts for every arm (DAPO / DGPO would redraw most groups here)
    "eval_limit": 256,
    "eval_generation": {"max_new_tokens": 16, "temperature": 1.0},  # the curves: one sampled answer per row
    "save_steps": 0,
    "credit_steps": 0,
    "log_completions": True,  # completions.jsonl: the share of shortcut answers per step (`shortcut_share`)
}
"""Settings every arm of the Countdown comparisons shares; an arm sets only its method and method options."""

DMPO_ARM = {"method": "dmpo", "dmpo_target": "behaviour", "dmpo_baseline": "group", "dmpo_alpha": 0.04, "num_iterations": 1}
"""DMPO as it learns here: the proximal target (App. B.2, weights softmax(r / alpha) within the group, no ELBO
noise), the paper's group baseline 1/G, one optimizer step per rollout batch."""

COUNTDOWN_MD_RL: dict[str, Any] = {
    **COUNTDOWN_RL,
    # the masked-diffusion family on the same task: the AR-to-diffusion base that reads its prompt (docs/RESULTS.md,
    # "dLLM"); rollouts decode one token per step, low-confidence order, one block, as the evaluation's sampler
    "family": "masked_diffusion",
    "model_name_or_path": "tiny-world:countdown3-md",
    "per_device_train_batch_size": 128,  # 16 problems x 8 answers: a masked-diffusion rollout costs 16 forwards
    "num_generations": 8,
    "block_length": 16,
    "diffusion_steps": 16,
    "sampler": "low_confidence",
    "log_completions": False,
    "eval_generation": sampled_generation("masked_diffusion", 16),
}
"""The masked-diffusion Countdown comparisons' shared settings (`COUNTDOWN_RL` on the `countdown3-md` base)."""

DAPO_RECIPE = "DAPO (its recipe: dynamic sampling, no KL)"
"""The label of `DAPO_RECIPE_ARM` in `dgpo-vs-grpo`."""

GRPO_NO_KL = "GRPO, no KL (beta 0)"
"""The label of `dgpo-vs-grpo`'s KL-free GRPO arm: GRPO as its GRPO arm with beta 0, which separates DAPO's recipe's
no-KL part from its dynamic sampling (and its loss)."""

DAPO_RECIPE_ARM: dict[str, Any] = {
    # DAPO's own recipe (Yu et al. 2025, arXiv 2503.14476, Algorithm 1 and section 3) on the shared one: dynamic
    # sampling (groups whose rewards are all equal are dropped and more prompts drawn until the batch is full), no KL
    # term, clip-higher (eps_low 0.2, eps_high 0.28), the token-mean loss and the soft overlong punishment (eq. 13)
    "method": "dapo",
    "beta": 0.0,
    "dynamic_sampling": True,
    "dynamic_sampling_max_tries": 256,  # draws per batch before an error: 24 were needed by step 57 (80% of groups all equal)
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "loss_type": "dapo",
    "overlong_penalty": True,
    "overlong_buffer_len": COUNTDOWN_RL["max_completion_length"] // 5,  # L_cache = L_max / 5 (DAPO: 4,096 of 20,480)
    # DAPO's reward is +1 / -1 (eq. 7): twice the 1 / 0 accuracy is it shifted by 1, which the group advantages and the
    # all-equal filter ignore; the weight 2 keeps the overlong penalty (-1 at most) at DAPO's scale next to it
    "reward_weights": [2.0],
    "diagnostics_reference": True,  # the KL to the base measured (a frozen copy for diag/kl_*; not in the loss)
}
"""DAPO as DAPO: its recipe's choices over `COUNTDOWN_RL`; everything else (lr, batch, T, one step per batch) shared."""

DMPO_CORRECT_ONLY = "DMPO, weight on right answers only"
"""The label of `dllm-countdown3`'s DMPO arm with `dmpo_baseline: correct_only` (weights >= 0, 0 on wrong answers)."""

DMPO_CORRECT_ONLY_NO_KL = "DMPO, weight on right answers only, no KL"
"""The label of `dllm-countdown3`'s `DMPO_CORRECT_ONLY` arm with beta 0: the shared recipe's KL term (beta 0.1, which
`DMPO_CORRECT_ONLY` inherits) removed, so the pair isolates the KL term (issue 24 item 2, the KL question)."""

DMPO_CORRECT_ONLY_REFERENCE = "DMPO, weight on right answers only, reference target, no KL"
"""The label of `dllm-countdown3`'s `DMPO_CORRECT_ONLY_NO_KL` arm with the paper's anchor instead of the KL term: the
reference target (eq. 10's weights carry log p_ref - log p_v, ELBO estimates), beta 0."""

DMPO_CORRECT_ONLY_F4 = "DMPO, weight on right answers only, F=4"
"""`DMPO_CORRECT_ONLY` with buffer reuse: F = 4 optimizer steps per rollout batch (issue 24 item 3(a): reuse without
negative weights, the first candidate against the collapse of the group baseline's F = 8)."""

DMPO_CORRECT_ONLY_F8 = "DMPO, weight on right answers only, F=8"
"""`DMPO_CORRECT_ONLY` with F = 8 optimizer steps per rollout batch (the reuse factor at which `DMPO F=8` collapsed)."""

DMPO_CORRECT_ONLY_F8_TR = "DMPO, weight on right answers only, F=8, trust region 0.05"
"""`DMPO_CORRECT_ONLY_F8` with `dmpo_trust_region 0.05`: a right answer stops being fitted within a rollout batch once
its likelihood rose 0.05 nats per token above the behaviour policy's (`dmpo_trust_region_gate`)."""

DIFFU_GRPO_BASE_STATE = "diffu-GRPO, pre-training optimizer state"
"""`dllm-countdown3`'s diffu-GRPO arm with `init_optimizer_from_base`: its AdamW starts from the base's final
pre-training moments (issue 24 item 5, docs/RESULTS.md "Keeping the pre-training optimizer state")."""

DMPO_CORRECT_ONLY_BASE_STATE = "DMPO, weight on right answers only, pre-training optimizer state"
"""`DMPO_CORRECT_ONLY` with `init_optimizer_from_base` (the same issue-24 item)."""

BASE_STATE = {"init_optimizer_from_base": True}
"""The one setting the pre-training-optimizer-state arms add to their fresh-optimizer twins."""

COMPARISONS: dict[str, dict[str, Any]] = {
    "dgpo-vs-grpo": {"recipe": COUNTDOWN_RL, "rollouts": 120, "arms": {
        "GRPO": {"method": "grpo"},
        # GRPO with no KL term (beta 0): the arm that tells DAPO's no-KL from its dynamic sampling; a frozen copy of
        # the base measures the KL (diag/kl_*, not in the loss), as for DAPO's recipe, so the KL column compares
        GRPO_NO_KL: {"method": "grpo", "beta": 0.0, "diagnostics_reference": True},
        # not DAPO's recipe: DAPO's loss (token mean, clip-higher, overlong penalty) under the shared recipe, so without
        # its dynamic sampling (the arms share their rollouts) and with the shared KL 0.1 (DAPO: none); named for that
        "DAPO loss (no dynamic sampling, KL 0.1)": {"method": "dapo"},
        "DGPO": {"method": "dgpo"},
        # DAPO's recipe: at equal optimizer steps it samples more answers (the runner counts them and also scores it
        # at the first arm's sampled rollouts)
        DAPO_RECIPE: DAPO_RECIPE_ARM,
    }},
    "dmpo-vs-d1-countdown3": {"recipe": COUNTDOWN_RL, "rollouts": 120, "arms": {
        "diffu-GRPO (d1)": {"method": "diffu_grpo", "num_iterations": 1},
        # DMPO without a KL term, as the arm its tables were made with (before DMPO's optional KL term, commit 6570668,
        # the shared beta 0.1 did not reach its loss): pinned, so the re-run under the protocol is the same comparison
        "DMPO": {**DMPO_ARM, "beta": 0.0},
    }},
    # buffer reuse at a small rollout budget: F optimizer steps on each rollout batch (16 x 16 per batch, 10
    # batches: F = 24 is 240 optimizer steps)
    "dmpo-reuse-countdown3": {"recipe": {**COUNTDOWN_RL, "per_device_train_batch_size": 256}, "rollouts": 10, "arms": {
        "diffu-GRPO F=1": {"method": "diffu_grpo", "num_iterations": 1},
        "diffu-GRPO F=8": {"method": "diffu_grpo", "num_iterations": 8},  # d1's mu = 12 inner updates: clipping acts
        "DMPO F=1": DMPO_ARM,
        "DMPO F=8": {**DMPO_ARM, "num_iterations": 8},
        "DMPO F=24": {**DMPO_ARM, "num_iterations": 24},
        "DMPO F=8, negative_scale 0": {**DMPO_ARM, "num_iterations": 8, "dmpo_negative_scale": 0.0},
    }},
    # the masked-diffusion family (issue 24): same rollouts per arm; DMPO with the reference target (the paper's
    # anchor to the base) beside the proximal one (no anchor), and reuse F = 8 with and without the trust region
    "dllm-countdown3": {"recipe": COUNTDOWN_MD_RL, "rollouts": 30, "arms": {
        "diffu-GRPO": {"method": "diffu_grpo", "num_iterations": 1},
        "DMPO": DMPO_ARM,
        "DMPO, reference target": {**DMPO_ARM, "dmpo_target": "reference"},
        "DMPO F=8": {**DMPO_ARM, "num_iterations": 8},
        "DMPO F=8, trust region 0.05": {**DMPO_ARM, "num_iterations": 8, "dmpo_trust_region": 0.05},
        # issue 24 item 5: no negative weights, weight only on right answers (the group baseline's -1/G weights push
        # down denoising conditionals the wrong answers share with the right ones; "none" would still fit a group
        # with no right answer at 1/G each)
        DMPO_CORRECT_ONLY: {**DMPO_ARM, "dmpo_baseline": "correct_only"},
        # the KL question on the arm above: the same without the recipe's KL term (beta 0.1 -> 0)
        DMPO_CORRECT_ONLY_NO_KL: {**DMPO_ARM, "dmpo_baseline": "correct_only", "beta": 0.0},
        # ... and with the paper's own anchor to the base (the reference target) in place of the KL term
        DMPO_CORRECT_ONLY_REFERENCE: {**DMPO_ARM, "dmpo_baseline": "correct_only", "beta": 0.0, "dmpo_target": "reference"},
        # issue 24 item 3(a): reuse F > 1 with weights >= 0 (docs/RESULTS.md, "DMPO reuse F > 1 without negative weights")
        DMPO_CORRECT_ONLY_F4: {**DMPO_ARM, "dmpo_baseline": "correct_only", "num_iterations": 4},
        DMPO_CORRECT_ONLY_F8: {**DMPO_ARM, "dmpo_baseline": "correct_only", "num_iterations": 8},
        DMPO_CORRECT_ONLY_F8_TR: {**DMPO_ARM, "dmpo_baseline": "correct_only", "num_iterations": 8, "dmpo_trust_region": 0.05},
        # issue 24 item 5: the two arms above (diffu-GRPO, DMPO_CORRECT_ONLY) with AdamW started from the base's own
        # pre-training moments instead of zeros (docs/RESULTS.md, "Keeping the pre-training optimizer state")
        DIFFU_GRPO_BASE_STATE: {"method": "diffu_grpo", "num_iterations": 1, **BASE_STATE},
        DMPO_CORRECT_ONLY_BASE_STATE: {**DMPO_ARM, "dmpo_baseline": "correct_only", **BASE_STATE},
    }},
}
SHARED_OPTIMIZER: dict[str, Any] = {"adam_beta2": 0.999, "max_grad_norm": 1.0, "weight_decay": 0.0}
"""The one optimizer setting of `dmpo-kl-countdown3`'s 2 x 2 (AdamW (0.9, 0.999), grad clip 1.0, no weight decay: the
library's and the policy-gradient arms' defaults, written out so that DMPO's method defaults (clip 0.2, beta2 0.99,
weight decay 0.1) do not apply)."""

COMPARISONS["dmpo-kl-countdown3"] = {
    # issue 23 item 5 / issue 24 item 2: {DMPO, diffu-GRPO} x {no KL, KL 0.1} on one optimizer setting; the arms
    # differ only in the method (and its own options) and beta. 12 rollout batches of 32 x 16 per run (not the
    # other comparisons' 120): the CPU budget stated in docs/RESULTS.md ("DMPO vs diffu-GRPO as a 2 x 2") before the
    # runs; the validation curves on 128 rows
    "recipe": {**COUNTDOWN_RL, **SHARED_OPTIMIZER, "diagnostics_reference": True, "eval_limit": 128}, "rollouts": 12, "arms": {
        "diffu-GRPO, KL 0.1": {"method": "diffu_grpo", "num_iterations": 1, "beta": 0.1},
        "diffu-GRPO, no KL": {"method": "diffu_grpo", "num_iterations": 1, "beta": 0.0},
        "DMPO, KL 0.1": {**DMPO_ARM, "beta": 0.1},
        "DMPO, no KL": {**DMPO_ARM, "beta": 0.0},
    }}
"""comparison -> shared recipe, rollout batches per arm, arm label -> overrides."""

DLLM_LR_SWEEP = (2e-4, 5e-4, 1e-3, 2e-3)
"""The learning rates of `dllm-countdown3-lr` (issue 24 item 2: the lr swept; 5e-4 is the shared recipe's)."""
DLLM_LR_METHODS = ("diffu-GRPO", DMPO_CORRECT_ONLY)
"""The `dllm-countdown3` arms whose lr `dllm-countdown3-lr` sweeps."""


def lr_label(arm: str, lr: float) -> str:
    """The label of `arm` at learning rate `lr` in a lr sweep: "diffu-GRPO, lr 5e-4" (one significant digit, the
    exponent without its leading zero)."""
    if not lr > 0:
        raise ValueError(f"a learning rate must be > 0, got {lr!r}")
    mantissa, exp = f"{lr:.0e}".split("e")
    return f"{arm}, lr {mantissa}e{int(exp)}"


def choose_lr(figures: dict[float, float], default: float) -> float:
    """The lr sweep's selection rule (docs/RESULTS.md, "the lr swept"): the lr whose validation figure is highest;
    a tie with `default` (the recipe's lr) goes to `default`, other ties to the smaller lr. `figures`: lr -> figure."""
    if not figures:
        raise ValueError("choose_lr needs at least one lr's validation figure")
    best = max(figures.values())
    tied = sorted(lr for lr, v in figures.items() if v == best)
    return default if default in tied else tied[0]


COMPARISONS["dllm-countdown3-lr"] = {
    # issue 24 item 2, the lr swept: `dllm-countdown3`'s diffu-GRPO and DMPO (weight on right answers only) arms,
    # unchanged but for the learning rate (the shared recipe's cosine schedule with 10% warm-up and KL 0.1 kept);
    # the sweep is scored on validation (scripts/studies/dllm_lr_sweep.py), the chosen lr per method on test
    "recipe": COUNTDOWN_MD_RL, "rollouts": 30, "arms": {
        lr_label(arm, lr): {**COMPARISONS["dllm-countdown3"]["arms"][arm], "learning_rate": lr}
        for lr in DLLM_LR_SWEEP for arm in DLLM_LR_METHODS}}

D1_AUTHORS_ARM: dict[str, Any] = {
    # diffu-GRPO with d1's own settings (configs/d1_diffu_grpo_llada_8b.yaml, from dllm-reasoning/d1's train.yaml):
    # mu = 12 optimizer steps per rollout batch, clip 0.5, KL 0.04, no std scaling, TRL's bnpo mean, rollouts at
    # T = 0.9, constant lr after a negligible warm-up, AdamW (0.9, 0.99), weight decay 0.1, grad clip 0.2
    "method": "diffu_grpo", "num_iterations": 12, "beta": 0.04, "epsilon": 0.5, "epsilon_high": 0.5,
    "scale_rewards": "none", "loss_type": "bnpo", "temperature": 0.9,
    "lr_scheduler_type": "constant_with_warmup", "warmup_ratio": 0.0001,
    "adam_beta1": 0.9, "adam_beta2": 0.99, "weight_decay": 0.1, "max_grad_norm": 0.2,
}
"""d1's diffu-GRPO settings over `COUNTDOWN_RL`. Kept from the shared recipe (a tiny model trained in full is not
LLaDA-8B with a LoRA): lr 5e-4 (d1: 3e-6), 32 problems x 16 answers per rollout batch (d1: 6 answers), 16 tokens."""

DMPO_AUTHORS_ARM: dict[str, Any] = {
    # DMPO with its authors' settings (configs/dmpo_llada_8b_countdown.yaml: the paper's App. C.2 and the authors'
    # yaml): buffer reuse F = 8, WDCE with the reference target, the individual baseline, alpha 0.04, no KL, rollouts
    # at T = 0.2, constant lr after a negligible warm-up, AdamW (0.9, 0.99), weight decay 0.1, grad clip 0.2
    "method": "dmpo", "num_iterations": 8, "dmpo_loss": "wdce", "dmpo_target": "reference",
    "dmpo_baseline": "individual", "dmpo_alpha": 0.04, "beta": 0.0, "temperature": 0.2,
    "lr_scheduler_type": "constant_with_warmup", "warmup_ratio": 0.0001,
    "adam_beta1": 0.9, "adam_beta2": 0.99, "weight_decay": 0.1, "max_grad_norm": 0.2,
}
"""DMPO's authors' settings over `COUNTDOWN_RL`; kept from the shared recipe as in `D1_AUTHORS_ARM` (lr 5e-4, not
3e-6; 32 x 16 per rollout batch, the authors' 16 answers per prompt)."""

COMPARISONS["dmpo-authors-countdown3"] = {
    # issue 23 item 5's "plus each with its authors' settings": the two methods of `dmpo-kl-countdown3` each with the
    # settings of its authors' code, at the 2 x 2's budget (12 rollout batches of 32 x 16; the optimizer steps follow
    # each method's reuse: 144 for d1's mu = 12, 96 for DMPO's F = 8); the arms differ in everything the two dicts set
    "recipe": {**COUNTDOWN_RL, "diagnostics_reference": True, "eval_limit": 128}, "rollouts": 12, "arms": {
        "diffu-GRPO, d1's settings": D1_AUTHORS_ARM,
        "DMPO, its authors' settings": DMPO_AUTHORS_ARM,
    }}

DLLM_D1_LRS: dict[str, float] = {"5e-4": 5e-4, "5e-4/12": 5e-4 / 12}
"""The two learning rates of `dllm-countdown3-d1`, fixed before its runs (docs/RESULTS.md, "diffu-GRPO with d1's
settings on the masked-diffusion base"): the shared recipe's 5e-4, and 5e-4 / 12 (4.2e-5): lr x optimizer steps per
rollout batch equal to the shared recipe's one step at 5e-4."""


def d1_md_label(lr: str) -> str:
    """The label of `dllm-countdown3-d1`'s arm at the learning rate spelled `lr` (a key of `DLLM_D1_LRS`)."""
    if lr not in DLLM_D1_LRS:
        raise ValueError(f"unknown d1-settings lr {lr!r}; valid: {list(DLLM_D1_LRS)}")
    return f"diffu-GRPO, d1's settings, lr {lr}"


COMPARISONS["dllm-countdown3-d1"] = {
    # issue 24 item 2: diffu-GRPO with d1's settings on the masked-diffusion base (until now only on the causal LM,
    # `dmpo-authors-countdown3`). `D1_AUTHORS_ARM`'s values over `COUNTDOWN_MD_RL`: mu = 12 optimizer steps per
    # rollout batch (360 in all), clip 0.5 both sides, KL 0.04, no std scaling, bnpo mean, rollouts at T = 0.9,
    # constant lr (warm-up 1e-4), AdamW (0.9, 0.99), weight decay 0.1, grad clip 0.2; d1's mean-field estimator with
    # prompt masking 0.15 and a fresh mask seed per inner step are the method's defaults (`METHOD_DEFAULTS`), as in
    # the shared arm. Differs from the authors (configs/d1_diffu_grpo_llada_8b.yaml): lr 5e-4 or 5e-4 / 12 (d1: 3e-6,
    # on a LoRA of LLaDA-8B), 16 problems x 8 answers per rollout batch (d1: 6 answers per prompt, 12 per step),
    # 16 answer tokens decoded one per step in one block (d1: 256 in blocks of 32, 2 per step), the Gumbel draw in
    # float64 (d1: bfloat16, its model's dtype; this model runs in float32), full fine-tuning of a 4 x 128 model.
    # Differs from `dllm-countdown3`'s "diffu-GRPO" (the shared recipe): num_iterations 12 (1), beta 0.04 (0.1),
    # epsilon_high 0.5 (unset: 0.5 by the method's default, so the clip is the same), T 0.9 (1.0), constant lr
    # (cosine, 10% warm-up), adam_beta2 0.99 (0.999), weight decay 0.1 (0), grad clip 0.2 (1.0); the same base,
    # batch, 30 rollout batches, validation points (every 5 rollout batches) and test rows
    "recipe": COUNTDOWN_MD_RL, "rollouts": 30, "arms": {
        d1_md_label(lr): {**D1_AUTHORS_ARM, "learning_rate": v} for lr, v in DLLM_D1_LRS.items()}}

DMPO_AUTHORS_MD = "DMPO, its authors' settings, lr 5e-4/8"
"""The label of `dllm-countdown3-dmpo-authors`'s one arm."""

COMPARISONS["dllm-countdown3-dmpo-authors"] = {
    # issue 24 item 2's "each method with its authors' settings" on the masked-diffusion base, DMPO's half (d1's is
    # `dllm-countdown3-d1`): `DMPO_AUTHORS_ARM`'s values over `COUNTDOWN_MD_RL` (reuse F = 8, 240 optimizer steps;
    # WDCE, reference target, individual baseline, alpha 0.04, no KL, rollouts at T = 0.2, constant lr, AdamW (0.9,
    # 0.99), weight decay 0.1, grad clip 0.2). The lr, fixed before the runs and not chosen on any split, is 5e-4 / F
    # = 6.25e-5 (lr x optimizer steps per rollout batch equal to the shared recipe's one step at 5e-4: the rule by
    # which validation chose d1's 5e-4 / 12 over 5e-4). Differs from the authors
    # (configs/dmpo_llada_8b_countdown.yaml): lr (theirs 3e-6 on LLaDA-8B), 16 problems x 8 answers (theirs 16
    # answers per prompt), 16 answer tokens in one block; the same base, batch, 30 rollout batches, validation points
    # and test rows as `dllm-countdown3`
    "recipe": COUNTDOWN_MD_RL, "rollouts": 30, "arms": {
        DMPO_AUTHORS_MD: {**DMPO_AUTHORS_ARM, "learning_rate": 5e-4 / DMPO_AUTHORS_ARM["num_iterations"]}}}

COUNTDOWN4_STEPS_RL: dict[str, Any] = {
    # the long-answer task of issue 25 (mmrl/tiny_world/countdown_steps.py: answers of 60-160 tokens whose decisions
    # are a few header tokens) from its tiny causal base; the budget and the a-priori lr are in docs/RESULTS.md
    # ("Issue 25, item 2") and were written there before the runs
    "family": "causal_lm",
    "task": "countdown4_steps",
    "model_name_or_path": "tiny-world:countdown4-steps-ar",
    "reward_funcs": ["countdown4_steps"],  # exact 1 / 0
    "num_generations": 8,
    "per_device_train_batch_size": 64,  # 8 problems x 8 answers per rollout batch (what half a CPU core allows)
    "gradient_accumulation_steps": 1,
    "max_completion_length": 170,  # the base's generation length (answers up to 160 tokens)
    "temperature": 1.0,
    "learning_rate": 1e-4,  # half of the 2e-4 at which 20 DGPO steps drifted down (docs/RESULTS.md, issue 25 item 3)
    "lr_scheduler_type": "constant",
    "beta": 0.0,  # no KL term (TRL's default, DAPO's and DGPO's recipes): the regime where GRPO's entropy may collapse
    "dynamic_sampling": False,
    "diagnostics_reference": True,  # the KL to the base measured in every arm (diag/kl_*; not in the loss)
    "eval_limit": 100,  # the validation curves: the first 100 validation problems x `curve` samples
    "save_steps": 0,
    "credit_steps": 0,
    "log_completions": False,
}
"""The shared settings of `dgpo-countdown4-steps` (an arm sets only its method and its recipe's options)."""

DAPO_RECIPE_LONG: dict[str, Any] = {**DAPO_RECIPE_ARM, "overlong_buffer_len": COUNTDOWN4_STEPS_RL["max_completion_length"] // 5}
"""`DAPO_RECIPE_ARM` at the long task's length: the soft overlong punishment over the last L_max / 5 = 34 tokens."""

COMPARISONS["dgpo-countdown4-steps"] = {
    # issue 25 item 2: GRPO, DGPO and DAPO's recipe on the long-answer task, the same rollout batches per arm (the
    # dynamic-sampling arms draw more answers to fill theirs, counted and reported); validation curves of greedy
    # accuracy and sampled pass@1/4/16, the test rows scored once per run (16 samples each)
    "recipe": COUNTDOWN4_STEPS_RL, "rollouts": 80, "final_rows": 100, "final_samples": 16, "pass_ks": (4,),
    "curve": {"samples": 16, "ks": (4,)}, "curve_points": 4, "stacked": True, "eval_batch": 400,
    "equal_rollouts": False, "interval_scores": ("greedy", "sampled", "pass@4", "pass"),
    "arms": {
        "GRPO": {"method": "grpo"},
        # DGPO on DAPO's recipe (its method defaults are DAPO's: clip-higher, token mean, dynamic sampling, overlong
        # punishment, no KL), so DGPO - DAPO is its token credit alone
        "DGPO": {**DAPO_RECIPE_LONG, "method": "dgpo"},
        DAPO_RECIPE: DAPO_RECIPE_LONG,
        # issue 25 item 4: GCPO's VLM branch on a text model (the prompt plus `negative_instruction` as its negative
        # condition) on DAPO's recipe, as DGPO: GCPO - DAPO is its token weighting alone (with one update per rollout
        # its dual clip, a GCPO default, never acts)
        "GCPO": {**DAPO_RECIPE_LONG, "method": "gcpo"},
    }}
COMPARISONS["grpo-regime-countdown4-steps"] = {
    # issue 25 item 2's regime: the GRPO arm alone (its run is `dgpo-countdown4-steps`' GRPO run: same recipe, 80
    # rollout batches, validation curves every 20); does pass@16 or the entropy fall below the base's?
    **{k: v for k, v in COMPARISONS["dgpo-countdown4-steps"].items() if k != "arms"}, "arms": {"GRPO": {"method": "grpo"}}}

SMOKE = {"per_device_train_batch_size": 32, "num_generations": 4, "eval_limit": 16}
"""`--smoke`: 2 rollout batches of 8 prompts x 4 answers, 16 evaluation rows (CI plumbing check)."""


FINAL_ROWS = 256
"""Held-out rows of the before / after figures (x `FINAL_SAMPLES` sampled answers each)."""
FINAL_SAMPLES = 4


def paired_intervals(before_items: dict[str, list[float]], arm_items: dict[str, list[dict[str, list[float]]]],
                     scores: Sequence[str] = ("greedy", "sampled")) -> dict:
    """Paired-bootstrap 95% intervals (`mmrl.tiny_world.stats`) of every arm's gain over the base and of every pair
    of arms' difference, for each of `scores` (per-row item names; default the greedy and the sampled): {"gain": {arm: {score: Interval dict}},
    "difference": {"a - b": {score: ...}}, "lines": printable summaries}."""
    from mmrl.tiny_world.stats import difference_interval, gain_interval

    out: dict[str, Any] = {"gain": {}, "difference": {}, "lines": []}
    names = list(arm_items)
    for score in scores:
        for a in names:
            iv = gain_interval([r[score] for r in arm_items[a]], before_items[score])
            out["gain"].setdefault(a, {})[score] = iv.to_dict()
            out["lines"].append(f"{a}: {score} gain {iv.fmt(signed=True)} ({len(arm_items[a])} seeds, {iv.n_items} items; the base measured once)")
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                iv = difference_interval([r[score] for r in arm_items[a]], [r[score] for r in arm_items[b]])
                out["difference"].setdefault(f"{a} - {b}", {})[score] = iv.to_dict()
                out["lines"].append(f"{a} - {b}: {score} {iv.fmt(signed=True)}")
    return out


def arm_config(name: str, arm: str, *, seed: int, out: Path, rollouts: int | None = None, smoke: bool = False,
               base: str | None = None, curve_points: int | None = None) -> dict[str, Any]:
    """The overrides of one run: recipe, arm, seed (and another tiny `base` than the recipe's);
    `max_steps = rollouts x num_iterations`, so every arm samples the same number of rollout batches; `curve_points`
    validation evaluations per run (default: the comparison's, else 6), every `max_steps // curve_points` steps."""
    comp = COMPARISONS[name]
    rollouts = rollouts or (2 if smoke else comp["rollouts"])
    cfg = {**comp["recipe"], **comp["arms"][arm], "seed": seed, "output_dir": str(out), "progress_bar": False}
    if base is not None:
        cfg["model_name_or_path"] = f"tiny-world:{base}"
    if smoke and cfg.get("init_optimizer_from_base"):  # the smoke base's own folder holds its optimizer state
        from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir

        cfg["model_name_or_path"] = str(model_dir(cfg["model_name_or_path"].split(":", 1)[1], SMOKE_BASE_STEPS))
    if smoke:
        cfg.update(SMOKE)
        # the 20-step smoke base rewards nothing: no group has a spread, so dynamic sampling could never fill a batch
        cfg["dynamic_sampling"] = False
    f = int(cfg.get("num_iterations", 1))
    cfg["num_iterations"] = f
    cfg["max_steps"] = rollouts * f
    points = comp.get("curve_points", 6) if curve_points is None else curve_points  # 0: no validation curve
    if points < 0:
        raise ValueError(f"curve_points must be >= 0, got {points}")
    cfg["eval_steps"] = max(1, cfg["max_steps"] // points) if points else 0
    return cfg


RFT_ARM = "RFT"
"""The rejection-sampling fine-tuning row (`mmrl.tiny_world.rft`) at the first arm's rollouts."""

CLEAN_REFERENCES = {"countdown3-ar-lazy": "countdown3-ar-clean"}
"""base -> the same model pre-trained on right answers only at the same compute (the clean SFT reference row)."""

CONTINUED_SFT_ARM = "continued SFT on right answers"
"""The clean-SFT row of a masked-diffusion base that is already pre-trained on right answers only (`clean_base`, e.g.
`countdown3-md`), where no separately pre-trained clean model exists: the same base trained on for one RL run's
compute on the training split's true answers (`rft.truth_batches`), with its own pre-training loss
(`rft.masked_diffusion_nll` with `pretrain.loss_options` of its recipe). Compute equated with the first arm: as many
optimizer steps as it makes at one step per rollout batch (its rollout batches) and as many trained sequences per step
as it samples per batch (prompts per rollout x answers per prompt), AdamW at its learning rate (constant) and gradient
clip; the rollouts' sampling cost is not spent (this row samples nothing)."""

BASELINE_ARMS = (RFT_ARM, CONTINUED_SFT_ARM)
"""The per-seed baseline rows, reported after the RL arms in this order."""


def clean_base(spec) -> bool:
    """Whether a tiny base (`TinySpec`) was pre-trained on right answers only: no `label_noise` and no shortcut
    demonstrations (`lazy_frac`) in its data."""
    return not spec.data.get("label_noise") and not spec.data.get("lazy_frac")


def best_of_label(n: int) -> str:
    """The best-of-n row: the base's `n` sampled answers per test row, scored by the best of them."""
    return f"best-of-{n} from the base ({n} sampled answers per row, T = 1, the best by the reward)"


def count_sampled(trainer, cap: int | None = None, take=None) -> dict[str, Any]:
    """Count the responses `trainer` samples (all dynamic-sampling tries: `dynamic_sampling/sampled_responses`, else
    the rollout batch) into the returned {"sampled": int, "taken": ...}; with `cap` and `take(step, sampled)`, call
    `take` once, before the first rollout batch drawn after `cap` responses were sampled (the policy then has had
    `step` optimizer steps), and keep what it returns in "taken" (None if the run never reached `cap`)."""
    collect = trainer._collect
    state: dict[str, Any] = {"sampled": 0, "taken": None}

    def counted():
        if cap is not None and take is not None and state["taken"] is None and state["sampled"] >= cap:
            state["taken"] = take(trainer.step, state["sampled"])
        buf = collect()
        state["sampled"] += int(buf.metrics.get("dynamic_sampling/sampled_responses", buf.rollout.num_responses))
        return buf

    trainer._collect = counted  # the instance's own: `_collect_or_stop` calls self._collect
    return state


def equal_rollouts_label(arm: str, first: str) -> str:
    """The row of a dynamic-sampling `arm` scored when it had sampled as many answers as `first` samples in all."""
    return f"{arm}, at {first}'s sampled rollouts"


def complete_seeds(done: dict[str, set[int]], arms: Sequence[str], seeds: int) -> list[int]:
    """The seeds in range(`seeds`) that every one of `arms` has finished (`done`: arm -> finished seeds): the
    consistent subset a table is built from when a run stops early."""
    return [s for s in range(seeds) if all(s in done.get(a, set()) for a in arms)]


def run_slug(arm: str, seed: int) -> str:
    """A run's folder name under `runs/`."""
    return f"{re.sub(r'[^a-z0-9]+', '_', arm.lower()).strip('_')}-seed{seed}"


STORED_FROM = "stored_from"
"""The key of a run's result.json that `import_stored_runs` wrote from an earlier report (the report's path): such a
run has its per-problem test scores but no training logs (metrics, validation items) in the report folder."""


def build_digest(base_name: str, steps: int | None = None) -> str | None:
    """The weights digest (`tiny_spec.json` "weights_sha256") of the cached build of `base_name`, None if not cached."""
    from mmrl.tiny_world.models import model_dir

    spec = model_dir(base_name, steps) / "tiny_spec.json"
    return json.loads(spec.read_text()).get("weights_sha256") if spec.is_file() else None


def stored_digest(results: dict[str, Any]) -> str | None:
    """The base build behind a saved report (its results.json as a dict): its "base_weights_sha256", or, for a report
    written before that field, the `REFERENCE_BUILDS` entry of its base (the build behind docs/RESULTS.md's tables)."""
    from mmrl.tiny_world.models import REFERENCE_BUILDS, _torch_version, model_dir

    if results.get("base_weights_sha256"):
        return results["base_weights_sha256"]
    return REFERENCE_BUILDS.get((model_dir(results["base"]).name, _torch_version()))


def put_stored(path: Path, data: dict, same: Sequence[str], *, source: str | Path) -> None:
    """Write `data` (an imported run's or base's file, from the stored report `source`) to `path`, unless a file is
    there already: it is then kept when it holds the same values of the keys `same`, else ValueError (an import
    never overwrites a saved run)."""
    if path.exists():
        old = json.loads(path.read_text())
        if any(old.get(k) != data.get(k) for k in same):
            raise ValueError(f"{path} exists and differs from {source} in {[k for k in same if old.get(k) != data.get(k)]}")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def import_stored_runs(results_file: str | Path, root: Path, *, name: str, base_name: str,
                       digest: str | None, base_items: dict[str, list[float]] | None = None) -> dict[str, list[int]]:
    """Seed the report folder `root` of comparison `name` with the runs an earlier report saved in `results_file` (its
    results.json: the per-problem test scores of every run and the base's), so that `resume` skips them and the next
    report pools them with new seeds; returns {arm: [seeds imported]}.

    The stored report must be of `name` on `base_name` and on the same build, by weights digest (`stored_digest`
    against `digest`, the build in use): a run of another build is another model and is not paired with this one's.
    A report written before the digest was saved names no build of its own; it is then taken as this build's only
    when `base_items`, the build in use scored on the same test rows, equals its stored per-problem base scores
    exactly (every sample of every problem: a fingerprint of the weights that `REFERENCE_BUILDS` cannot give).
    Writes `root/base.json` (the base's test figures and items, its validation figures) and
    `root/runs/<run>/result.json` per stored run, marked `STORED_FROM`; a file already there is kept when it holds
    the same scores, otherwise ValueError (never overwritten)."""
    results_file = Path(results_file)
    res = json.loads(results_file.read_text())
    if res.get("name") != name or res.get("base") != base_name:
        raise ValueError(f"{results_file} is a report of {res.get('name')!r} on {res.get('base')!r}, not {name!r} on {base_name!r}")
    theirs = stored_digest(res)
    if not res.get("base_weights_sha256") and base_items is not None and base_items == res.get("before_items"):
        theirs = digest  # same per-problem base scores as the build in use: the same build
    if theirs is None or digest is None or theirs != digest:
        raise ValueError(f"{results_file}: its base build {(theirs or 'unknown')[:12]} is not the build in use "
                         f"{(digest or 'unknown')[:12]}: its runs are not paired with new ones")
    if res.get("smoke"):
        raise ValueError(f"{results_file} is a smoke report")
    unknown = sorted(set(res["arms"]) - set(COMPARISONS[name]["arms"]) - set(BASELINE_ARMS))
    if unknown:  # e.g. an arm at equal rollouts: a view of its run, rebuilt from that run's own result
        logger.info("import_stored_runs: %s rows are not runs of their own and are not imported: %s", results_file, unknown)

    put = partial(put_stored, source=results_file)
    put(root / "base.json", {"before": res["before"], "before_items": res["before_items"],
                             "ref": (res.get("reference") or {}).get("after"), "ref_items": (res.get("reference") or {}).get("items"),
                             "validation": res.get("base_validation"), "weights_sha256": theirs},
        ("before", "before_items"))
    done: dict[str, list[int]] = {}
    for arm, runs in res["arms"].items():
        if arm in unknown:
            continue
        for r in runs:
            put(root / "runs" / run_slug(arm, int(r["seed"])) / "result.json", {**r, STORED_FROM: str(results_file)},
                ("seed", "items"))
            done.setdefault(arm, []).append(int(r["seed"]))
    return done


def run_reasoning_comparison(name: str, out: str | Path = "runs/replicate", *, seeds: int = 5, smoke: bool = False,
                             rollouts: int | None = None, progress: bool = True, arms: list[str] | None = None,
                             base: str | None = None, baselines: bool = True, resume: bool = False,
                             report_only: bool = False, only_baselines: bool = False,
                             curve_points: int | None = None, stored: str | Path | None = None) -> dict[str, Any]:
    """Run every arm of `COMPARISONS[name]` (or those named in `arms`) over `seeds` from the cached base (the
    recipe's, or the tiny model `base`); report into `<out>/<name>`.

    The protocol: curves on `task.validation`, the test rows scored once per run at the end, per-row scores in
    results.json and paired-bootstrap 95% intervals over rows and seeds (`mmrl.tiny_world.stats`). With `baselines`:
    the clean SFT reference at the same compute (`CLEAN_REFERENCES`, with each arm's share of the base-to-clean
    gap) and rejection-sampling fine-tuning at the same rollouts (`RFT_ARM`, same seeds; a masked-diffusion model
    fits its accepted answers with its pre-training loss); for a masked-diffusion base pre-trained on right answers
    only, continued SFT on the training split's right answers at one RL run's compute (`CONTINUED_SFT_ARM`, same
    seeds); and best-of-n from the base at the first arm's answers per prompt (`best_of_n.json`, computed once).
    `only_baselines` runs the baseline rows only (never an RL arm) and builds no report: it fills in the baseline
    rows of a comparison whose RL arms another call runs into the same `out` (use it with `resume`).

    Runs go seed-major (seed 0 of every arm and RFT, then seed 1, ...) and each writes `runs/<run>/result.json` when
    it finishes; `resume` keeps `<out>/<name>` and skips the runs already saved, `report_only` runs nothing and builds
    the report from the saved runs. The table uses the seeds every row has finished (`complete_seeds`). Every row
    reports the answers its runs sampled; an arm with dynamic sampling is also scored (test rows, once) at the
    optimizer step where it had sampled as many answers as the first arm does in all (`count_sampled`).
    `curve_points` overrides the comparison's number of validation points per RL run (`arm_config`).
    `stored`: an earlier report's results.json whose runs are imported first (`import_stored_runs`: same comparison,
    same base build by weights digest) and kept like saved runs; their training diagnostics and validation items are
    not stored, so those columns and curves use the runs that have them (the table says which seeds)."""
    import json
    import shutil
    import time

    from mmrl.checkpointing.run_lock import remove_unfinished_run
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import TINY_MODELS, load_base_policy
    from mmrl.tiny_world.report import curve, fmt, markdown_table, mean_std, plot_curves
    from mmrl.tiny_world.pretrain import loss_options
    from mmrl.tiny_world.rft import fit_batches, masked_diffusion_nll, rejection_sampling_ft, truth_batches
    from mmrl.tiny_world.stats import (Interval, difference_interval, gap_closed_interval, mean_interval,
                                       ratio_difference_interval, ratio_interval)
    from mmrl.training.trainer import Trainer

    if name not in COMPARISONS:
        raise ValueError(f"unknown comparison {name!r}; valid: {sorted(COMPARISONS)}")
    bad = sorted(set(arms or []) - set(COMPARISONS[name]["arms"]))
    if bad:
        raise ValueError(f"unknown arms {bad} of {name}; valid: {list(COMPARISONS[name]['arms'])}")
    comp = COMPARISONS[name]
    recipe = comp["recipe"]
    if base is not None and (base not in TINY_MODELS or TINY_MODELS[base].task != recipe["task"]
                             or TINY_MODELS[base].family != recipe["family"]):
        valid = sorted(n for n, sp in TINY_MODELS.items() if sp.task == recipe["task"] and sp.family == recipe["family"])
        raise ValueError(f"base {base!r} is not a tiny {recipe['family']} model for {recipe['task']}; valid: {valid}")
    if only_baselines and (report_only or not baselines):
        raise ValueError("only_baselines runs the baseline rows: it needs baselines=True and report_only=False")
    if not (smoke or report_only or only_baselines) and any(comp["arms"][a].get("init_optimizer_from_base") for a in arms or comp["arms"]):
        from mmrl.tiny_world.sources import base_optimizer_file

        base_optimizer_file(base or recipe["model_name_or_path"].split(":", 1)[1])  # a cache without it: the error now
    say = print if progress else (lambda *a, **k: None)
    root = Path(out) / name
    if report_only and not (root / "base.json").exists():
        raise ValueError(f"--report-only: no saved runs in {root} (base.json missing)")
    if root.exists() and not (resume or report_only or only_baselines or stored is not None):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    register()
    base_name = base or recipe["model_name_or_path"].split(":", 1)[1]
    op = TINY_MODELS[base_name].data.get("lazy_op", "+") if base_name in TINY_MODELS else "+"  # the shortcut to count
    base_steps = SMOKE_BASE_STEPS if smoke else None
    if not report_only:
        from mmrl.tiny_world.models import ensure_built

        ensure_built(base_name, progress=progress, steps=base_steps)  # (its digest: the build in use)
    digest = build_digest(base_name, base_steps)
    task = load_task(recipe["task"])
    rows = task.test[: 16 if smoke else comp.get("final_rows", FINAL_ROWS)]  # evaluated once per run, at the end
    val_rows = task.validation[: 16 if smoke else recipe["eval_limit"]]  # the curves (and any choice) use validation
    k = 2 if smoke else comp.get("final_samples", FINAL_SAMPLES)
    ks = tuple(j for j in comp.get("pass_ks", ()) if j < k)  # the unbiased pass@j beside pass@k
    L = recipe["max_completion_length"]
    sc_op = op if recipe["task"] == "countdown3" else None  # the held-out shortcut share: countdown3's demonstrator
    eval_opts = {"stacked": bool(comp.get("stacked")), "batch_size": comp.get("eval_batch", 128)}

    def score(pol, rows_: Sequence[dict]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """The held-out figures and per-row items of `pol` on `rows_` (k samples a row, pass@j for j in ks)."""
        return held_out_items(pol, rows_, task.metric, recipe["family"], L, k, shortcut_op=sc_op, ks=ks, **eval_opts)

    curve_opts = comp.get("curve")  # {"samples": n, "ks": (...)}: validation pass@k curves instead of eval/accuracy
    ck = (2 if smoke else curve_opts["samples"]) if curve_opts else 0
    cks = tuple(j for j in (curve_opts or {}).get("ks", ()) if j < ck)

    def curve_eval(pol, sink: Path | None = None, step: int = 0) -> dict[str, float]:
        """The validation curve's point: greedy accuracy, sampled pass@1 (eval/accuracy) and pass@j, pass@ck; its
        per-problem items appended to `sink` (a jsonl of {"step", "items"}) when given."""
        t0 = time.perf_counter()
        a, it = held_out_items(pol, val_rows, task.metric, recipe["family"], L, ck, ks=cks, **eval_opts)
        if sink is not None:
            with open(sink, "a") as f:
                f.write(json.dumps({"step": step, "items": it}) + "\n")
        return {"eval/accuracy": a["sampled"], "eval/greedy": a["greedy"],
                **{f"eval/{x}": v for x, v in a.items() if x.startswith("pass@")}, "perf/eval_time": time.perf_counter() - t0}
    if stored is not None:
        names_build = bool(json.loads(Path(stored).read_text()).get("base_weights_sha256"))
        here = None if names_build else score(load_base_policy(base_name, progress=progress, steps=base_steps), rows)[1]
        imported = import_stored_runs(stored, root, name=name, base_name=base_name, digest=digest, base_items=here)
        say(f"[{name}] imported from {stored}: " + ", ".join(f"{a} seeds {s}" for a, s in imported.items()))
    t_all = time.perf_counter()
    base_file = root / "base.json"
    if base_file.exists() and (resume or report_only or stored is not None):
        saved_base = json.loads(base_file.read_text())
        if saved_base.get("weights_sha256") and digest and saved_base["weights_sha256"] != digest:
            raise ValueError(f"{base_file} was scored on build {saved_base['weights_sha256'][:12]}, the cached "
                             f"{base_name} is {digest[:12]}: its runs are not paired with new ones")
    else:
        base_policy = load_base_policy(base_name, progress=progress, steps=base_steps)
        before, before_items = score(base_policy, rows)
        ref, ref_items = None, None
        if baselines and base_name in CLEAN_REFERENCES:
            ref, ref_items = score(load_base_policy(CLEAN_REFERENCES[base_name], progress=progress, steps=base_steps), rows)
        saved_base = {"before": before, "before_items": before_items, "ref": ref, "ref_items": ref_items,
                      "validation": curve_eval(base_policy, root / "base_validation_items.jsonl") if curve_opts else None,
                      "weights_sha256": digest}
        base_file.write_text(json.dumps(saved_base))
    base_val_file = root / "base_validation_items.jsonl"
    if curve_opts and saved_base.get("validation") and not base_val_file.exists() and not report_only:
        # an imported base (`import_stored_runs`) has its validation figures, not its items: score them again (the
        # same rows, samples and seeds), for the last curve point's paired intervals of the new runs
        again = curve_eval(load_base_policy(base_name, progress=False, steps=base_steps), base_val_file)
        off = {x: (v, again[x]) for x, v in saved_base["validation"].items() if x.startswith("eval/") and abs(v - again[x]) > 1e-9}
        if off:
            logger.warning("%s: the base's validation scored again differs from the saved figures %s", name, off)
    before, before_items, ref, ref_items = (saved_base[x] for x in ("before", "before_items", "ref", "ref_items"))
    base_val = saved_base.get("validation")  # the curves' step 0
    say(f"[{name}] base: " + "  ".join(f"{a} {v:.3f}" for a, v in before.items())
        + (("; validation: " + "  ".join(f"{a[5:]} {v:.3f}" for a, v in base_val.items() if a.startswith("eval/"))) if base_val else ""))
    if ref is not None:
        say(f"[{name}] clean SFT reference: " + "  ".join(f"{a} {v:.3f}" for a, v in ref.items()))
    selected = arms or list(COMPARISONS[name]["arms"])
    md = recipe["family"] == "masked_diffusion"
    do_rft = baselines and recipe["family"] in ("causal_lm", "masked_diffusion")
    do_sft = baselines and md and base_name not in CLEAN_REFERENCES and clean_base(TINY_MODELS[base_name])
    md_loss = loss_options(TINY_MODELS[base_name].recipe) if md else {}  # the base's own pre-training loss
    first_cfg = load_config(None, arm_config(name, selected[0], seed=0, out=root, rollouts=rollouts, smoke=smoke, base=base))
    cap = first_cfg.max_steps // first_cfg.steps_per_rollout * first_cfg.prompts_per_rollout * first_cfg.num_generations
    baseline_arms = ([RFT_ARM] if do_rft else []) + ([CONTINUED_SFT_ARM] if do_sft else [])
    row_arms = selected + baseline_arms
    n_best = first_cfg.num_generations  # best-of-n at the first arm's answers per prompt
    best_file = root / "best_of_n.json"
    if baselines and not best_file.exists() and not report_only:
        b_sum, b_items = held_out_items(load_base_policy(base_name, progress=False, steps=base_steps), rows, task.metric,
                                        recipe["family"], L, n_best, **eval_opts)
        best_file.write_text(json.dumps({"n": n_best, "after": b_sum, "items": b_items}))
    best = json.loads(best_file.read_text()) if baselines and best_file.exists() else None
    if best is not None:
        say(f"[{name}] best-of-{best['n']} from the base: {100 * sum(best['items']['best']) / len(best['items']['best']):.1f}")

    def one_run(arm: str, seed: int, run_dir: Path) -> dict[str, Any]:
        """Train (or RFT) one arm at one seed from the base, score the test rows once; the saved result."""
        remove_unfinished_run(run_dir)  # an unfinished run of an earlier, stopped call (RunLocked if live)
        policy = load_base_policy(base_name, progress=False, steps=base_steps)
        if arm == RFT_ARM:  # at the first arm's rollouts, the same seeds
            cfg = load_config(None, arm_config(name, selected[0], seed=seed, out=run_dir, rollouts=rollouts, smoke=smoke,
                                               base=base))
            t0 = time.perf_counter()
            rft = rejection_sampling_ft(policy, task.train, task.metric, rollouts=cfg.max_steps // cfg.num_iterations,
                                        prompts_per_rollout=cfg.prompts_per_rollout, group_size=cfg.num_generations,
                                        lr=cfg.learning_rate, seed=seed, generation=sampled_generation(recipe["family"], L),
                                        **({"loss_fn": masked_diffusion_nll(seed, **md_loss), "max_grad_norm": cfg.max_grad_norm}
                                           if md else {}))
            secs = time.perf_counter() - t0
            after, items = score(policy, rows)
            run_dir.mkdir(parents=True, exist_ok=True)
            say(f"[{name}] {RFT_ARM}, seed {seed}: {sum(rft['accepted'])} of {rft['sampled']} samples kept, {secs:.0f} s: "
                + "  ".join(f"{a} {v:.3f}" for a, v in after.items()))
            return {"seed": seed, "after": after, "items": items, "seconds": secs, "rollouts": int(rft["sampled"]),
                    "steps": len(rft["accepted"]), "rft_accepted": sum(rft["accepted"]),
                    "trained_sequences": sum(rft["accepted"]), "loss": rft["loss"]}
        if arm == CONTINUED_SFT_ARM:  # the first arm's optimizer steps, its sampled answers per step as true answers
            cfg = load_config(None, arm_config(name, selected[0], seed=seed, out=run_dir, rollouts=rollouts, smoke=smoke,
                                               base=base))
            steps, per_step = cfg.max_steps // cfg.num_iterations, cfg.prompts_per_rollout * cfg.num_generations
            t0 = time.perf_counter()
            batches = truth_batches(policy, task.train, steps=steps, batch_size=per_step, gen_length=L, seed=seed)
            losses = fit_batches(policy, batches, masked_diffusion_nll(seed, **md_loss), lr=cfg.learning_rate,
                                 max_grad_norm=cfg.max_grad_norm)
            secs = time.perf_counter() - t0
            after, items = score(policy, rows)
            run_dir.mkdir(parents=True, exist_ok=True)
            say(f"[{name}] {CONTINUED_SFT_ARM}, seed {seed}: {steps} steps of {per_step} true answers, loss "
                f"{losses[0]:.3f} -> {losses[-1]:.3f}, {secs:.0f} s: " + "  ".join(f"{a} {v:.3f}" for a, v in after.items()))
            return {"seed": seed, "after": after, "items": items, "seconds": secs, "rollouts": 0, "steps": steps,
                    "trained_sequences": steps * per_step, "loss": losses}
        cfg = load_config(None, arm_config(name, arm, seed=seed, out=run_dir, rollouts=rollouts, smoke=smoke, base=base,
                                           curve_points=curve_points))
        trainer = Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs, eval_dataset=val_rows,
                          eval_metric=task.metric)
        if curve_opts and cfg.eval_steps:
            # the instance's own: `_evaluate_or_save` calls self.evaluate
            trainer.evaluate = lambda: curve_eval(policy, run_dir / "validation_items.jsonl", trainer.step)
        snap_secs = [0.0]

        def take(step: int, sampled: int) -> dict[str, Any]:
            ts = time.perf_counter()
            a, it = score(policy, rows)
            snap_secs[0] += time.perf_counter() - ts
            say(f"[{name}] {arm}, seed {seed}: at step {step}, {sampled} answers sampled: "
                + "  ".join(f"{x} {v:.3f}" for x, v in a.items()))
            return {"step": step, "rollouts": sampled, "after": a, "items": it}

        # (off under --smoke, `arm_config`); a comparison with equal_rollouts False scores every run once only
        dynamic = bool(COMPARISONS[name]["arms"][arm].get("dynamic_sampling")) and comp.get("equal_rollouts", True)
        state = count_sampled(trainer, cap if dynamic else None, take)
        t0 = time.perf_counter()
        trainer.train()
        secs = time.perf_counter() - t0 - snap_secs[0]
        after, items = score(policy, rows)
        say(f"[{name}] {arm}, seed {seed}: {cfg.max_steps} steps, {state['sampled']} answers sampled, {secs:.0f} s: "
            + "  ".join(f"{a} {v:.3f}" for a, v in after.items()))
        res = {"seed": seed, "after": after, "items": items, "seconds": secs, "rollouts": state["sampled"],
               "steps": cfg.max_steps}
        if dynamic:  # never reached the cap: its end is already at (or under) the first arm's rollouts
            res["equal_rollouts"] = state["taken"] or {"step": cfg.max_steps, "rollouts": state["sampled"], "after": after,
                                                       "items": items}
        return res

    if only_baselines and not baseline_arms:
        raise ValueError(f"only_baselines: {name} on {base_name} has no baseline rows")
    done: dict[str, dict[int, dict]] = {}
    for seed in range(seeds):  # seed-major: a stopped run leaves whole seeds
        for arm in (baseline_arms if only_baselines else row_arms):
            saved = root / "runs" / run_slug(arm, seed) / "result.json"
            if saved.exists() and (resume or report_only or stored is not None):
                done.setdefault(arm, {})[seed] = json.loads(saved.read_text())
            elif not report_only:
                res = one_run(arm, seed, saved.parent)
                saved.write_text(json.dumps(res))
                done.setdefault(arm, {})[seed] = res
    if only_baselines:  # the RL arms and the report belong to another call
        return {"name": name, "base": base_name, "baseline_runs": {a: done[a] for a in baseline_arms},
                "best_of_n": best}
    use = complete_seeds({a: set(d) for a, d in done.items()}, row_arms, seeds)
    if not use:
        raise ValueError(f"no seed has finished every row of {name} in {root} ({ {a: sorted(d) for a, d in done.items()} })")
    if len(use) < seeds:
        say(f"[{name}] the report uses the {len(use)} seeds every row has finished: {use}")
    arms: dict[str, list[dict]] = {}
    for arm in row_arms:
        for seed in use:
            r = dict(done[arm][seed])
            run_dir = root / "runs" / run_slug(arm, seed)
            r["records"] = read_metrics(run_dir) if arm not in BASELINE_ARMS else []
            r["shortcut"] = shortcut_share(run_dir, op) if arm not in BASELINE_ARMS else []
            arms.setdefault(arm, []).append(r)
            if "equal_rollouts" in r:
                e = r["equal_rollouts"]
                arms.setdefault(equal_rollouts_label(arm, selected[0]), []).append(
                    {"seed": seed, "after": e["after"], "items": e["items"], "seconds": float("nan"),
                     "rollouts": e["rollouts"], "steps": e["step"], "records": [], "shortcut": []})
    for arm in BASELINE_ARMS:  # the baselines last, after the rows at equal rollouts
        if arm in arms:
            arms[arm] = arms.pop(arm)
    seeds = len(use)
    pk = f"pass@{k}"
    base_m = {m: [before_items[m]] for m in ("sampled", "greedy")}
    ref_m = {m: [ref_items[m]] for m in ("sampled", "greedy")} if ref_items else None
    def shortcut_cells(item_runs: list[dict[str, list[float]]]) -> list[str]:
        """[held-out shortcut share [CI], accuracy among non-shortcut answers [CI]] of one row's runs (or "-")."""
        if sc_op is None:
            return []
        share = mean_interval([r["shortcut"] for r in item_runs]).fmt()
        den = [[1.0 - x for x in r["shortcut"]] for r in item_runs]
        if sum(map(sum, den)) == 0:
            return [share, "- (every answer is the shortcut)"]
        return [share, ratio_interval([r["right_not_shortcut"] for r in item_runs], den).fmt()]

    sc_head = ([f"held-out shortcut share (sampled) [95% CI]", "accuracy among non-shortcut answers [95% CI]"]
               if sc_op is not None else [])
    head = ["model", f"sampled acc. (T=1, {k} per row) [95% CI]", "gain (points) [95% CI]", "greedy acc.",
            "greedy gain [95% CI]", *[f"pass@{j}" for j in ks], pk, *sc_head, "share of the gap to clean SFT closed (sampled) [95% CI]",
            "optimizer steps", "answers sampled per run", "train reward, first / last 5 steps",
            "shortcut answers in the rollouts, first / last 5 steps", "KL to base (last step)", "entropy (last step)",
            "s per run"]
    n_diag = 5  # the train reward, shortcut, KL, entropy and time columns
    table_rows = [["base model", mean_interval(base_m["sampled"]).fmt(), "-", fmt(before["greedy"]), "-",
                   *[fmt(before[f"pass@{j}"]) for j in ks], fmt(before[pk]),
                   *shortcut_cells([before_items]), "-", "-", "-", *["-"] * n_diag]]
    if ref is not None:
        table_rows.append([f"clean SFT at the same compute (`{CLEAN_REFERENCES[base_name]}`)", mean_interval(ref_m["sampled"]).fmt(),
                           difference_interval(ref_m["sampled"], base_m["sampled"]).fmt(signed=True), fmt(ref["greedy"]),
                           difference_interval(ref_m["greedy"], base_m["greedy"]).fmt(signed=True),
                           *[fmt(ref[f"pass@{j}"]) for j in ks], fmt(ref[pk]),
                           *shortcut_cells([ref_items]), "1 (by definition)", "-", "-", *["-"] * n_diag])
    best_m = [best["items"]["best"]] if best is not None else None
    if best is not None:  # one score per row: the best of its n sampled answers (pass@n for a 1 / 0 metric)
        table_rows.append([best_of_label(best["n"]), mean_interval(best_m).fmt(),
                           difference_interval(best_m, base_m["sampled"]).fmt(signed=True), "-", "-", *["-"] * len(ks), "-",
                           *(["-", "-"] if sc_op is not None else []), "-", "-", f"{best['n'] * len(rows):,} (test rows)",
                           *["-"] * n_diag])
    reward_key = f"rewards/{recipe['reward_funcs'][0]}/mean"  # the accuracy itself (not weighted, no overlong penalty)

    def last(records: list[dict], key: str) -> float:
        return ([y for _, y in curve(records, key)] or [float("nan")])[-1]

    intervals: dict[str, dict] = {}
    for arm, runs in arms.items():
        samp = [r["items"]["sampled"] for r in runs]
        greedy = [r["items"]["greedy"] for r in runs]
        ivs = {"sampled": mean_interval(samp), "gain": difference_interval(samp, base_m["sampled"]),
               "greedy_gain": difference_interval(greedy, base_m["greedy"])}
        if ref_m is not None and ref["sampled"] != before["sampled"]:
            ivs["gap_closed"] = gap_closed_interval(samp, base_m["sampled"], ref_m["sampled"])
            ivs["vs_clean_sft"] = difference_interval(samp, ref_m["sampled"])
        intervals[arm] = ivs
        logged = [r for r in runs if r["records"]]  # (runs imported from a stored report have no training logs)
        if logged:
            rewards = [[y for _, y in curve(r["records"], reward_key)] or [float("nan")] for r in logged]
            first = mean_std([mean_std(y[:5])[0] for y in rewards])[0]
            lastr = mean_std([mean_std(y[-5:])[0] for y in rewards])[0]
            kl = mean_std([last(r["records"], "diag/kl_k3") for r in logged])[0]
            ent = mean_std([last(r["records"], "entropy") for r in logged])[0]
            sc = [[y for _, y in r["shortcut"]] or [float("nan")] for r in logged]
            short = f"{100 * mean_std([mean_std(y[:5])[0] for y in sc])[0]:.1f} / {100 * mean_std([mean_std(y[-5:])[0] for y in sc])[0]:.1f}"
            diag = [f"{100 * first:.1f} / {100 * lastr:.1f}", short, f"{kl:.3f}", f"{ent:.3f}",
                    f"{mean_std([r['seconds'] for r in runs])[0]:.0f}"]
        else:
            diag = ["-"] * (n_diag - 1) + ([f"{mean_std([r['seconds'] for r in runs])[0]:.0f}"] if arm in BASELINE_ARMS else ["-"])
        steps = mean_std([float(r["steps"]) for r in runs])
        table_rows.append([f"{arm} ({len(runs)} seeds)", ivs["sampled"].fmt(), ivs["gain"].fmt(signed=True),
                           fmt(*mean_std([r["after"]["greedy"] for r in runs])), ivs["greedy_gain"].fmt(signed=True),
                           *[fmt(*mean_std([r["after"][f"pass@{j}"] for r in runs])) for j in ks],
                           fmt(*mean_std([r["after"][pk] for r in runs])), *shortcut_cells([r["items"] for r in runs]),
                           ivs["gap_closed"].fmt(scale=1.0, digits=2) if "gap_closed" in ivs else "-",
                           f"{steps[0]:.0f}" if steps[1] == 0 else f"{steps[0]:.1f} ± {steps[1]:.1f}",
                           f"{mean_std([float(r['rollouts']) for r in runs])[0]:,.0f}", *diag])
    table = markdown_table(head, table_rows)
    labels = [a for a in arms if a not in BASELINE_ARMS]
    present = [a for a in BASELINE_ARMS if a in arms]
    diffs = {}
    for i, a in enumerate(labels):
        for b in labels[i + 1 :] + present:
            diffs[f"{a} - {b}"] = difference_interval([r["items"]["sampled"] for r in arms[a]], [r["items"]["sampled"] for r in arms[b]])
        if ref_m is not None:
            diffs[f"{a} - clean SFT"] = intervals[a].get("vs_clean_sft") or difference_interval(
                [r["items"]["sampled"] for r in arms[a]], ref_m["sampled"])
        if best_m is not None:
            diffs[f"{a} - best-of-{best['n']} from the base"] = difference_interval([r["items"]["sampled"] for r in arms[a]], best_m)
    if diffs:
        table += "\n\n" + markdown_table(["difference, sampled accuracy (points)", "estimate [95% CI]", "claimed (interval excludes 0)"],
                                          [[k_, v.fmt(signed=True), "yes" if v.excludes_zero else "no"] for k_, v in diffs.items()])
    sc_diffs: dict[str, dict[str, Any]] = {}
    if sc_op is not None:  # the same pairs on the held-out shortcut share and the accuracy among non-shortcut answers
        items_of = {a: [r["items"] for r in runs] for a, runs in arms.items()}
        if ref_items is not None:
            items_of["clean SFT"] = [ref_items]
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:] + present
                 + (["clean SFT"] if ref_items is not None else [])]
        for a, b in pairs:
            xa, xb = items_of[a], items_of[b]
            share = difference_interval([r["shortcut"] for r in xa], [r["shortcut"] for r in xb])
            dens = [[[1.0 - x for x in r["shortcut"]] for r in x_] for x_ in (xa, xb)]
            acc = (ratio_difference_interval([r["right_not_shortcut"] for r in xa], dens[0], [r["right_not_shortcut"] for r in xb], dens[1])
                   if all(sum(map(sum, d)) > 0 for d in dens) else None)
            sc_diffs[f"{a} - {b}"] = {"shortcut": share, "non_shortcut_accuracy": acc}
        if sc_diffs:
            table += "\n\n" + markdown_table(
                ["difference (points)", "held-out shortcut share [95% CI]", "claimed", "accuracy among non-shortcut answers [95% CI]", "claimed"],
                [[k_, v["shortcut"].fmt(signed=True), "yes" if v["shortcut"].excludes_zero else "no",
                  v["non_shortcut_accuracy"].fmt(signed=True) if v["non_shortcut_accuracy"] else "-",
                  ("yes" if v["non_shortcut_accuracy"].excludes_zero else "no") if v["non_shortcut_accuracy"] else "-"]
                 for k_, v in sc_diffs.items()])
    trained = {a: [r for r in runs if r["records"]] for a, runs in arms.items() if any(r["records"] for r in runs)}
    logged_seeds = {a: [r["seed"] for r in runs] for a, runs in trained.items()}
    if any(len(logged_seeds[a]) < len(arms[a]) for a in trained):
        table += ("\n\nTraining diagnostics (train reward, KL, entropy and the curves) over the runs with training logs: "
                  + "; ".join(f"{a} seeds {s}" for a, s in logged_seeds.items())
                  + " (the other runs were imported from a stored report's per-problem scores).")
    plot_curves({a: [curve(r["records"], "eval/accuracy") for r in runs] for a, runs in trained.items()}, root / "accuracy.png",
                title=f"{name}: validation accuracy (one sampled answer per row, T = 1)", ylabel="accuracy")
    plot_curves({a: [curve(r["records"], reward_key, smooth=5) for r in runs] for a, runs in trained.items()}, root / "reward.png",
                title=f"{name}: training reward (accuracy of the rollouts)", ylabel="reward")
    plot_curves({a: [r["shortcut"] for r in runs] for a, runs in trained.items()}, root / "shortcut.png",
                title=f"{name}: share of shortcut answers (a{op}b){op}c in the rollouts", ylabel="share")
    plot_curves({a: [curve(r["records"], "diag/kl_k3") for r in runs] for a, runs in trained.items()}, root / "kl.png",
                title=f"{name}: KL to the base (k3, per token)", ylabel="KL")
    plot_curves({a: [curve(r["records"], "entropy") for r in runs] for a, runs in trained.items()}, root / "entropy.png",
                title=f"{name}: policy entropy of the sampled tokens", ylabel="entropy (nats per token)")
    if any("dgpo/tokens_for_half" in x for runs in trained.values() for r in runs for x in r["records"]):
        plot_curves({a: [curve(r["records"], "dgpo/tokens_for_half") for r in runs] for a, runs in trained.items()},
                    root / "tokens_for_half.png", title=f"{name}: share of an answer's tokens carrying half its DGPO weight",
                    ylabel="share (uniform: 0.5)")
    if curve_opts:  # the validation curves from the base (step 0) on, and the base's figure as a dashed line
        for key, label in [("eval/greedy", "greedy accuracy"), ("eval/accuracy", "sampled pass@1 (T = 1)"),
                           *[(f"eval/pass@{j}", f"pass@{j} (T = 1)") for j in (*cks, ck) if j > 1]]:
            if not any(key in x for runs in trained.values() for r in runs for x in r["records"]):
                continue  # (curve_points 0: the base's validation figures only)
            plot_curves({a: [[(0, base_val[key])] + curve(r["records"], key) for r in runs] for a, runs in trained.items()},
                        root / f"validation_{key.split('/')[1].replace('@', '')}.png", baseline=base_val[key],
                        title=f"{name}\nvalidation {label}, {len(val_rows)} problems x {ck} samples", ylabel=label.split(" (")[0])
    val_final: dict[str, Any] = {}  # the last validation point of each arm against the base's, paired over problems
    if curve_opts and base_val_file.exists():
        base_vi = json.loads(base_val_file.read_text().splitlines()[-1])["items"]
        for a, runs in trained.items():
            files = {r["seed"]: root / "runs" / run_slug(a, r["seed"]) / "validation_items.jsonl" for r in runs}
            files = {sd: f for sd, f in files.items() if f.exists()}  # (a run imported from a stored report has none)
            if not files:
                continue
            last_ = [json.loads(f.read_text().splitlines()[-1]) for f in files.values()]
            val_final[a] = {"step": last_[0]["step"], "seeds": sorted(files), **{x: difference_interval([v["items"][x] for v in last_], base_vi[x]).to_dict()
                                                         for x in ("greedy", "sampled", *[f"pass@{j}" for j in cks], "pass")}}
        if val_final:
            table += "\n\n" + markdown_table(
                ["validation, last curve point - base (points)", "step", "seeds", "greedy [95% CI]", "pass@1 [95% CI]",
                 *[f"pass@{j} [95% CI]" for j in cks], f"pass@{ck} [95% CI]"],
                [[a, str(v["step"]), ", ".join(map(str, v["seeds"])), *[Interval(**{y: z for y, z in v[x].items() if y != "excludes_zero"}).fmt(signed=True)
                                       for x in ("greedy", "sampled", *[f"pass@{j}" for j in cks], "pass")]]
                 for a, v in val_final.items()])
    total = time.perf_counter() - t_all
    scores_ = tuple(x for x in comp.get("interval_scores", ("greedy", "sampled")) if x in before_items)  # (smoke: k = 2)
    paired = paired_intervals(before_items, {a: [r["items"] for r in runs] for a, runs in arms.items()}, scores_)
    if comp.get("interval_scores"):  # every gain and difference on every score, one table
        iv_ = lambda d: Interval(**{x: v for x, v in d.items() if x != "excludes_zero"})  # noqa: E731
        table += "\n\n" + markdown_table(
            ["gain over the base / difference (points)", *[f"{pk if x == 'pass' else x} [95% CI]" for x in scores_]],
            [[f"{a} - base", *[iv_(paired["gain"][a][x]).fmt(signed=True) for x in scores_]] for a in paired["gain"]]
            + [[d, *[iv_(v[x]).fmt(signed=True) + (" (claimed)" if iv_(v[x]).excludes_zero else "") for x in scores_]]
               for d, v in paired["difference"].items()])
    for line in paired.get("lines", []):
        say(f"[{name}] {line}")
    results = {"name": name, "base": base_name, "base_weights_sha256": saved_base.get("weights_sha256"), "before": before, "before_items": before_items, "base_validation": base_val, "validation_final": val_final, "seeds": seeds,
               "seeds_used": use, "seconds": total, "run_seconds": {a: [r["seconds"] for r in runs] for a, runs in arms.items()},
               "smoke": smoke, "table": table, "protocol": "curves on validation, test once per run; paired bootstrap 95% CI "
                                                          "over test rows and seeds",
               "test_prompts": [r["prompt"] for r in rows],
               "equal_rollouts_cap": cap,
               "reference": None if ref is None else {"model": CLEAN_REFERENCES[base_name], "after": ref, "items": ref_items},
               "best_of_n": best,
               "intervals": paired,
               "arm_intervals": {a: {x: v.to_dict() for x, v in ivs.items()} for a, ivs in intervals.items()},
               "differences": {x: v.to_dict() for x, v in diffs.items()},
               "shortcut_differences": {x: {m: (iv.to_dict() if iv else None) for m, iv in v.items()} for x, v in sc_diffs.items()},
               "shortcut_op": sc_op,
               "arms": {a: [{x: v for x, v in r.items() if x not in ("records", "shortcut", "equal_rollouts")} for r in runs]
                        for a, runs in arms.items()},
               "configs": {a: arm_config(name, a, seed=0, out=Path("."), rollouts=rollouts, smoke=smoke, base=base,
                                         curve_points=curve_points)
                           for a in selected}}
    (root / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (root / "table.md").write_text(table + f"\n\nBase `{base_name}` (weights {(saved_base.get('weights_sha256') or 'unknown')[:12]}), {seeds} seeds per arm (seeds {use}), {len(rows)} test rows "
                                   f"(multisets never seen in training), {first_cfg.max_steps // first_cfg.steps_per_rollout} "
                                   f"rollout batches of {first_cfg.prompts_per_rollout} x {first_cfg.num_generations} for "
                                   f"{selected[0]} ({cap:,} answers sampled per run), {total:.0f} s for this report."
                                   + "".join(f" {a}: {mean_std([float(r['trained_sequences']) for r in arms[a]])[0]:,.0f} "
                                             f"sequences fitted per run in {arms[a][0]['steps']} optimizer steps"
                                             + (" (the accepted samples)" if a == RFT_ARM else " (true answers of training rows)") + "."
                                             for a in present if "trained_sequences" in arms[a][0]) + "\n")
    logger.info("\n" + table + f"\n\n{root}  ({total:.0f} s)")
    return results
