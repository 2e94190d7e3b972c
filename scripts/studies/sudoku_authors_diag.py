"""Diagnostics of a `mmrl replicate sudoku-authors` run (issue 24 item 2 on Sudoku), from its saved files only.

    python scripts/studies/sudoku_authors_diag.py OUT/sudoku-authors DEST

Per RL arm, over the seeds of the report (`results.json` "arms"), each run's `runs/<run>/metrics.jsonl` grouped by
rollout batch (batch b holds optimizer steps b*F+1 .. (b+1)*F, F = the arm's reuse / mu): the training reward of the
first 5 and last 5 rollout batches (the batch's reward, logged at every inner step), the KL to the base
(`diag/kl_k3`, per token, on the batch's rollouts, before the step's update) of the last 2 batches and its maximum
over the run, the share of groups with no reward spread (`frac_reward_zero_std`), the clip fraction
(`clip_ratio/region_mean`, diffu-GRPO's arms; mean of every step, and per inner step), DMPO's negative weight share
(`diag/neg_weight_frac`), the gradient norm before clipping (median) and the share of steps it exceeds the arm's
`max_grad_norm`, and the validation curve (`eval/accuracy`). Writes DEST/diagnostics.json, DEST/diagnostics.md and
the curves against rollout batches DEST/reward.png, DEST/kl.png (and DEST/clip.png by inner step).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import mean, median

from mmrl.tiny_world.report import markdown_table, plot_curves


def _slug(arm: str, seed: int) -> str:
    return f"{re.sub(r'[^a-z0-9]+', '_', arm.lower()).strip('_')}-seed{seed}"


def _batches(recs: list[dict], f: int, key: str) -> list[tuple[int, float]]:
    """(rollout batch 1.., mean of `key` over the batch's inner steps) from training records."""
    by: dict[int, list[float]] = {}
    for r in recs:
        if r.get(key) is not None:
            by.setdefault((int(r["step"]) - 1) // f + 1, []).append(float(r[key]))
    return [(b, mean(v)) for b, v in sorted(by.items())]


def run_diag(recs: list[dict], f: int, clip: float) -> dict:
    train = [r for r in recs if "reward" in r]
    rew = [y for _, y in _batches(train, f, "reward")]
    kl = [y for _, y in _batches(train, f, "diag/kl_k3")]
    zero = [y for _, y in _batches(train, f, "frac_reward_zero_std")]
    out = {"reward_first5": mean(rew[:5]), "reward_last5": mean(rew[-5:]),
           "kl_last2": mean(kl[-2:]) if kl else None, "kl_max": max(kl) if kl else None,
           "zero_std_first": zero[0] if zero else None, "zero_std_mean": mean(zero) if zero else None,
           "validation": [(int(r["step"]), float(r["eval/accuracy"])) for r in recs if "eval/accuracy" in r]}
    gn = [float(r["grad_norm"]) for r in train if r.get("grad_norm") is not None]
    if gn:
        out["grad_norm_median"], out["grad_clipped_share"] = median(gn), mean(g > clip for g in gn)
    cr = [float(r["clip_ratio/region_mean"]) for r in train if r.get("clip_ratio/region_mean") is not None]
    if cr:
        out["clip_mean"] = mean(cr)
        inner: dict[int, list[float]] = {}
        for r in train:
            if r.get("clip_ratio/region_mean") is not None:
                inner.setdefault((int(r["step"]) - 1) % f + 1, []).append(float(r["clip_ratio/region_mean"]))
        out["clip_by_inner_step"] = {i: mean(v) for i, v in sorted(inner.items())}
    nw = [float(r["diag/neg_weight_frac"]) for r in train if r.get("diag/neg_weight_frac") is not None]
    if nw:
        out["neg_weight_frac"] = mean(nw)
    out["curves"] = {"reward": _batches(train, f, "reward"), "kl": _batches(train, f, "diag/kl_k3")}
    return out


def main(root: str, dest: str) -> None:
    root, dest = Path(root), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    res = json.loads((root / "results.json").read_text())
    diag: dict[str, list[dict]] = {}
    for arm, cfg in res["configs"].items():
        f, clip = int(cfg.get("num_iterations", 1)), float(cfg.get("max_grad_norm", 1.0))
        diag[arm] = [run_diag([json.loads(line) for line in (root / "runs" / _slug(arm, r["seed"]) / "metrics.jsonl")
                               .read_text().splitlines() if line.strip()], f, clip) | {"seed": r["seed"]}
                     for r in res["arms"][arm]]

    def cell(runs: list[dict], key: str, k: float = 100.0, d: int = 1) -> str:
        vs = [r[key] for r in runs if r.get(key) is not None]
        return f"{k * mean(vs):.{d}f}" if len(vs) == len(runs) and vs else "-"

    rows = []
    for arm, runs in diag.items():
        val = [mean(y for _, y in r["validation"][-1:]) for r in runs if r["validation"]]
        rows.append([f"{arm} ({len(runs)} seeds)", f"{cell(runs, 'reward_first5')} -> {cell(runs, 'reward_last5')}",
                     f"{cell(runs, 'kl_last2', 1, 3)} (max {cell(runs, 'kl_max', 1, 2)})",
                     f"{cell(runs, 'zero_std_first')} / {cell(runs, 'zero_std_mean')}", cell(runs, "clip_mean", 100, 2),
                     cell(runs, "neg_weight_frac"), cell(runs, "grad_norm_median", 1, 2), cell(runs, "grad_clipped_share", 100, 0),
                     f"{100 * mean(val):.1f}" if val else "-"])
    table = markdown_table(["arm", "train reward, first 5 -> last 5 rollout batches (%)",
                            "KL to base (k3/token), last 2 batches (max)", "groups without reward spread, first batch / mean (%)",
                            "clip fraction, all steps (%)", "negative weight share (%)", "grad norm (median)",
                            "steps with grad clipped (%)", "validation, last point (%)"], rows)
    (dest / "diagnostics.md").write_text(table + "\n\nMeans over the report's seeds; from each run's metrics.jsonl "
                                         "(scripts/studies/sudoku_authors_diag.py).\n")
    (dest / "diagnostics.json").write_text(json.dumps(diag, indent=1))
    for key, ylabel in (("reward", "training reward"), ("kl", "KL to the base (k3 per token)")):
        plot_curves({a: [r["curves"][key] for r in runs] for a, runs in diag.items()}, dest / f"{key}.png",
                    title=f"sudoku-authors: {ylabel}", ylabel=ylabel, xlabel="rollout batch")
    clip = {a: [list(r["clip_by_inner_step"].items()) for r in runs] for a, runs in diag.items()
            if all("clip_by_inner_step" in r for r in runs)}
    if clip:
        plot_curves(clip, dest / "clip.png", title="sudoku-authors: clip fraction by inner step",
                    ylabel="share of tokens clipped", xlabel="inner step within a rollout batch")
    print(table)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
