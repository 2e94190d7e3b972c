"""Diagnostics of a `mmrl replicate sudoku-rewards` run (issue 24 item 5), from its saved files only.

    python scripts/studies/sudoku_rewards_diag.py OUT/sudoku-rewards

Per arm (mean over seeds, min-max in brackets where useful): the training reward first / last 5 steps (each arm's
own reward), the share of groups with zero reward variance (no learning signal: `frac_reward_zero_std`), the KL to
the base at the last step, the gradient norm before clipping, DMPO's masked cross-entropy of its rollouts first /
last step, and on the test puzzles the fully-solved share (items with cell accuracy 1) against the base's.
Prints a markdown table.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from statistics import mean


def _metrics(path: Path) -> list[dict]:
    """The training records (those with a reward) of one run's metrics.jsonl."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward" in r]


def main(root: str) -> None:
    root = Path(root)
    res = json.loads((root / "results.json").read_text())
    base_solved = mean(x == 1.0 for x in res["base_items"])
    out = ["| arm | train reward first / last 5 (%) | zero-variance groups (%) | KL at the last step | grad norm (mean) "
           f"| DMPO masked CE first -> last | test fully solved (%) (base {100 * base_solved:.1f}) |",
           "|---|---|---|---|---|---|---|"]
    for arm, runs in {**res["arms"], **res.get("incomplete", {})}.items():
        slug = re.sub(r"[^a-z0-9]+", "_", arm.lower()).strip("_")
        recs = [_metrics(root / "runs" / f"{slug}-seed{r['seed']}" / "metrics.jsonl") for r in runs]
        first = mean(mean(x["reward"] for x in rec[:5]) for rec in recs)
        last = mean(mean(x["reward"] for x in rec[-5:]) for rec in recs)
        zero = mean(mean(x.get("frac_reward_zero_std", float("nan")) for x in rec) for rec in recs)
        kls = [rec[-1].get("kl", float("nan")) for rec in recs]
        gn = mean(mean(x.get("grad_norm", float("nan")) for x in rec) for rec in recs)
        ce = ([rec[0].get("dmpo/masked_ce") for rec in recs], [rec[-1].get("dmpo/masked_ce") for rec in recs])
        ce_cell = (f"{mean(ce[0]):.2f} -> {mean(ce[1]):.2f}" if None not in ce[0] + ce[1] else "-")
        solved = mean(mean(x == 1.0 for x in r["items"]) for r in runs)
        tag = "" if arm in res["arms"] else f" (incomplete: {len(runs)} seeds)"
        out.append(f"| {arm}{tag} | {100 * first:.1f} / {100 * last:.1f} | {100 * zero:.0f} | {mean(kls):.3f} "
                   f"[{min(kls):.3f}, {max(kls):.3f}] | {gn:.2f} | {ce_cell} | {100 * solved:.1f} |")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: sudoku_rewards_diag.py OUT/sudoku-rewards")
    main(sys.argv[1])
