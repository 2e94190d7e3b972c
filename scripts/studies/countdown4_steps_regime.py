"""Study (docs/RESULTS.md, issue 25 item 2): the regime criterion of `dgpo-countdown4-steps`, per run, from a report
folder ROOT (`mmrl replicate dgpo-countdown4-steps --out ROOT`, after its report): pass@16 - base with its paired
95% interval over the problems (test, every run; validation at the last curve point, runs with validation items), the
rollout entropy of steps 1-5 and of the last 5 steps and their ratio, the last step's KL to the base, DGPO's
`dgpo/tokens_for_half` at the first and last step, and the answers sampled. The regime is reached by a run whose
validation pass@16 falls below the base's with its interval excluding 0, or whose entropy falls below half its start.
Runs imported from a stored report (`STORED_FROM`) have test items only. First, the test table's gains over the base
and the differences in RESULTS.md's orientation (`PAIRS`), from the report's per-problem scores.

    python scripts/studies/countdown4_steps_regime.py ROOT
"""
import json
import logging
import sys
from pathlib import Path

from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world.reasoning_rl import STORED_FROM, run_slug
from mmrl.tiny_world.report import curve
from mmrl.tiny_world.stats import difference_interval, gain_interval

ENTROPY_WINDOW = 5
"""Steps averaged at each end of the entropy curve (the first 5 and the last 5)."""

PAIRS = (("DGPO", "GRPO"), ("DGPO", "DAPO"), ("DAPO", "GRPO"))
"""The differences reported (a - b), arms by their short names (`short`)."""
SCORES = ("greedy", "sampled", "pass@4", "pass")
"""The per-problem scores of the test table (sampled: pass@1 over 16 samples; pass: pass@16)."""


def short(arm: str) -> str:
    """An arm's short name: "DAPO" for DAPO's recipe arm, else the arm's label."""
    return "DAPO" if arm.startswith("DAPO") else arm


logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("countdown4_steps_regime")
root = Path(sys.argv[1]) / "dgpo-countdown4-steps"
res = json.loads((root / "results.json").read_text())
base_val = root / "base_validation_items.jsonl"
base_vi = json.loads(base_val.read_text().splitlines()[-1])["items"] if base_val.exists() else None
log.info("base weights %s, seeds %s", (res.get("base_weights_sha256") or "unknown")[:12], res["seeds_used"])
items = {short(a): [r["items"] for r in runs] for a, runs in res["arms"].items()}
log.info("test, points: " + " | ".join(SCORES))
for a, runs in items.items():
    log.info(f"{a} - base: " + " | ".join(gain_interval([r[x] for r in runs], res["before_items"][x]).fmt(signed=True) for x in SCORES))
for a, b in (p for p in PAIRS if p[0] in items and p[1] in items):
    log.info(f"{a} - {b}: " + " | ".join(difference_interval([r[x] for r in items[a]], [r[x] for r in items[b]]).fmt(signed=True)
                                         for x in SCORES))
for arm, runs in res["arms"].items():
    for r in runs:
        run = root / "runs" / run_slug(arm, r["seed"])
        test = gain_interval([r["items"]["pass"]], res["before_items"]["pass"])
        cells = [f"{arm} seed {r['seed']}", f"test pass@16 {test.fmt(signed=True)}", f"answers {r['rollouts']:,}"]
        vfile, reached = run / "validation_items.jsonl", False
        if base_vi is not None and vfile.exists():
            last = json.loads(vfile.read_text().splitlines()[-1])
            val = gain_interval([last["items"]["pass"]], base_vi["pass"])
            reached |= val.excludes_zero and val.estimate < 0
            cells.append(f"validation step {last['step']} pass@16 {val.fmt(signed=True)}")
        recs = read_metrics(run)
        ent = [y for _, y in curve(recs, "entropy")]
        if ent:
            a, b = (sum(x) / len(x) for x in (ent[:ENTROPY_WINDOW], ent[-ENTROPY_WINDOW:]))
            reached |= b < a / 2
            kl = [y for _, y in curve(recs, "diag/kl_k3")]
            cells.append(f"entropy {a:.3f} -> {b:.3f} (x{b / a:.2f}), min {min(ent):.3f}, KL last {kl[-1] if kl else float('nan'):.3f}")
            half = [y for _, y in curve(recs, "dgpo/tokens_for_half")]
            if half:
                cells.append(f"tokens_for_half {half[0]:.3f} -> {half[-1]:.3f}")
        verdict = "stored: test only" if r.get(STORED_FROM) else ("regime reached" if reached else "regime not reached")
        log.info("  ".join(cells + [verdict]))
