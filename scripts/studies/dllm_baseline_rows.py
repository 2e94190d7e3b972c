"""Study (docs/RESULTS.md, "`dllm-countdown3` baseline rows"): the baseline rows of a `dllm-countdown3` output folder
read straight from `runs/<row>-seed<k>/result.json`, `base.json` and `best_of_n.json` (so they can be reported before
the RL job builds the comparison's table with `report_only`): each row's mean and gain over the base (greedy,
sampled, held-out shortcut share) with paired-bootstrap 95% intervals over test rows and seeds, RFT - continued SFT,
and best-of-n against the base.

    python scripts/studies/dllm_baseline_rows.py OUT/dllm-countdown3 [REPORT.json]
"""
import json
import sys
from pathlib import Path

from mmrl.tiny_world.reasoning_rl import CONTINUED_SFT_ARM, RFT_ARM, non_shortcut_ratio, run_slug
from mmrl.tiny_world.stats import difference_interval, gain_interval, mean_interval


def main(root: Path, report: Path | None) -> None:
    base = json.loads((root / "base.json").read_text())
    bi = base["before_items"]
    best = json.loads((root / "best_of_n.json").read_text())
    out: dict = {"base": base["before"], "best_of_n": {"n": best["n"],
                 "mean": mean_interval([best["items"]["best"]]).to_dict(),
                 "minus_base_sampled": difference_interval([best["items"]["best"]], [bi["sampled"]]).to_dict(),
                 "minus_base_greedy": difference_interval([best["items"]["best"]], [bi["greedy"]]).to_dict()}}
    print(f"best-of-{best['n']} from the base: {mean_interval([best['items']['best']]).fmt()}, minus the base's sampled "
          f"{difference_interval([best['items']['best']], [bi['sampled']]).fmt(signed=True)}")
    runs = {}
    for arm in (RFT_ARM, CONTINUED_SFT_ARM):
        seeds = sorted(int(p.name.rsplit("seed", 1)[1]) for p in (root / "runs").glob(run_slug(arm, 0)[:-1] + "*")
                       if (p / "result.json").exists())
        rs = runs[arm] = [json.loads((root / "runs" / run_slug(arm, s) / "result.json").read_text()) for s in seeds]
        row = {"seeds": seeds, "pass@4": [r["after"]["pass@4"] for r in rs], "trained_sequences": [r["trained_sequences"] for r in rs],
               "seconds": [r["seconds"] for r in rs], "non_shortcut_accuracy": non_shortcut_ratio(
                   sum((r["items"]["right_not_shortcut"] for r in rs), []), sum((r["items"]["shortcut"] for r in rs), []))}
        for sc in ("greedy", "sampled", "shortcut"):
            xs = [r["items"][sc] for r in rs]
            row[sc] = {"mean": mean_interval(xs).to_dict(), "gain": gain_interval(xs, bi[sc]).to_dict(),
                       "per_seed": [r["after"][sc] for r in rs]}
            print(f"{arm} ({len(rs)} seeds) {sc}: {mean_interval(xs).fmt()}, gain {gain_interval(xs, bi[sc]).fmt(signed=True)}")
        out[arm] = row
    for sc in ("greedy", "sampled", "shortcut"):
        iv = difference_interval([r["items"][sc] for r in runs[RFT_ARM]], [r["items"][sc] for r in runs[CONTINUED_SFT_ARM]])
        out.setdefault("rft_minus_sft", {})[sc] = iv.to_dict()
        print(f"RFT - {CONTINUED_SFT_ARM}, {sc}: {iv.fmt(signed=True)}")
    for arm, rs in runs.items():
        iv = difference_interval([r["items"]["sampled"] for r in rs], [best["items"]["best"]])
        out[arm]["sampled_minus_best_of_n"] = iv.to_dict()
        print(f"{arm} sampled - best-of-{best['n']}: {iv.fmt(signed=True)}; accuracy among non-shortcut answers "
              f"{100 * out[arm]['non_shortcut_accuracy']:.1f}")
    if report is not None:
        report.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
