"""Study (docs/RESULTS.md, "dllm-countdown3 at 5 seeds"): the diagnostics and the paired intervals of the
5-seed diffu-GRPO vs DMPO (correct_only) runs, from the saved runs of `run_reasoning_comparison` (call it first
with `report_only=True`, which writes results.json from the seeds every arm finished).

    python scripts/studies/dllm_5seeds_report.py OUT/dllm-countdown3 [OUT.json]
"""
import json
import sys
from pathlib import Path

import numpy as np

from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world.reasoning_rl import run_slug
from mmrl.tiny_world.stats import difference_interval, gain_interval

root = Path(sys.argv[1])
res = json.loads((root / "results.json").read_text())
base = res["before_items"]
arms = list(res["arms"])
print(f"seeds used {res['seeds_used']}; base greedy {100 * res['before']['greedy']:.1f} sampled "
      f"{100 * res['before']['sampled']:.1f} pass@4 {100 * res['before']['pass@4']:.1f}")
out = {"seeds_used": res["seeds_used"], "before": res["before"], "arms": {}}
for arm in arms:
    runs = res["arms"][arm]
    row = {s: {"after": float(np.mean([r["after"][s] for r in runs])),
               "gain": gain_interval([r["items"][s] for r in runs], base[s]).to_dict()} for s in ("greedy", "sampled")}
    row["pass@4"] = float(np.mean([r["after"]["pass@4"] for r in runs]))
    recs = [read_metrics(root / "runs" / run_slug(arm, s)) for s in res["seeds_used"]]

    def series(key):
        return [[r[key] for r in rs if key in r] for rs in recs]

    rew = series("rewards/countdown3_accuracy/mean")
    row["reward_first_last"] = [float(np.mean([x[0] for x in rew])), float(np.mean([x[-1] for x in rew]))]
    row["reward_per_step"] = np.mean([x for x in rew], 0).tolist()
    row["kl_last"] = float(np.mean([x[-1] for x in series("diag/kl_k3")]))
    row["neg_weight_frac"] = float(np.mean([np.mean(x) for x in series("diag/neg_weight_frac")]))
    row["val_per_eval"] = np.mean(series("eval/accuracy"), 0).tolist()
    ce = series("dmpo/masked_ce")
    if ce and ce[0]:
        row["masked_ce_first_last"] = [float(np.mean([x[0] for x in ce])), float(np.mean([x[-1] for x in ce]))]
    out["arms"][arm] = row
    print(f"{arm} ({len(runs)} seeds): greedy {100 * row['greedy']['after']:.1f} gain "
          f"{row['greedy']['gain']['estimate'] * 100:+.1f} [{row['greedy']['gain']['low'] * 100:+.1f}, {row['greedy']['gain']['high'] * 100:+.1f}]; "
          f"sampled {100 * row['sampled']['after']:.1f} gain {row['sampled']['gain']['estimate'] * 100:+.1f} "
          f"[{row['sampled']['gain']['low'] * 100:+.1f}, {row['sampled']['gain']['high'] * 100:+.1f}]; pass@4 {100 * row['pass@4']:.1f}; "
          f"reward {row['reward_first_last'][0]:.3f} -> {row['reward_first_last'][1]:.3f} (per step {np.round(row['reward_per_step'], 3).tolist()}); "
          f"KL {row['kl_last']:.3f}; neg weight frac {row['neg_weight_frac']:.3f}; validation {np.round(row['val_per_eval'], 3).tolist()}"
          + (f"; masked CE {row['masked_ce_first_last'][0]:.3f} -> {row['masked_ce_first_last'][1]:.3f}" if "masked_ce_first_last" in row else ""))
a, b = arms[1], arms[0]
out["difference"] = {}
for s in ("greedy", "sampled"):
    iv = difference_interval([r["items"][s] for r in res["arms"][a]], [r["items"][s] for r in res["arms"][b]])
    out["difference"][s] = iv.to_dict()
    print(f"{a} - {b}: {s} {iv.fmt(signed=True)} (excludes 0: {iv.excludes_zero})")
if len(sys.argv) > 2:
    Path(sys.argv[2]).write_text(json.dumps(out, indent=2))
