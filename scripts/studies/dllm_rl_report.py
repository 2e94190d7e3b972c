"""Study (docs/RESULTS.md, "dllm-countdown3 at 30 rollout batches"): every saved RL run of a `dllm-countdown3` output
folder, read straight from `runs/<arm>-seed<k>/` (result.json and metrics.jsonl) with the base row of `base.json`, so
arms with different numbers of finished seeds can be set side by side: each arm's gains over the base (greedy,
sampled, held-out shortcut share) on the seeds it has, and each pair's difference on the seeds both have (paired
bootstrap over test rows and seeds, `mmrl.tiny_world.stats`), with the training diagnostics (reward per step, KL to
the base, masked CE, negative-weight fraction, entropy) and the validation curves (mean over seeds per evaluation).

    python scripts/studies/dllm_rl_report.py OUT/dllm-countdown3 [REPORT.json] [--copy-runs DIR] [--plots DIR]

`--copy-runs DIR` copies every run's result.json and metrics.jsonl to DIR/<run>/ (the record in docs/results);
`--plots DIR` draws every arm's validation, training-reward and KL curves (mean over seeds, min..max shaded) there;
the base's validation figure (greedy, and sampled with 4 answers per row, the first 256 validation rows: the curves'
step 0) is computed once into OUT/dllm-countdown3/base_validation.json and drawn as a dashed line.
"""
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world.reasoning_rl import (COMPARISONS, DMPO_CORRECT_ONLY, DMPO_CORRECT_ONLY_NO_KL,
                                          DMPO_CORRECT_ONLY_REFERENCE, run_slug)
from mmrl.tiny_world.stats import difference_interval, gain_interval, ratio_difference_interval

PAIRS = [(DMPO_CORRECT_ONLY, "diffu-GRPO"), (DMPO_CORRECT_ONLY_NO_KL, DMPO_CORRECT_ONLY),
         (DMPO_CORRECT_ONLY_REFERENCE, DMPO_CORRECT_ONLY_NO_KL), (DMPO_CORRECT_ONLY_REFERENCE, DMPO_CORRECT_ONLY),
         (DMPO_CORRECT_ONLY_NO_KL, "diffu-GRPO"), (DMPO_CORRECT_ONLY_REFERENCE, "diffu-GRPO")]
"""(a, b) pairs reported as a - b when both arms have runs."""

SCORES = ("greedy", "sampled", "shortcut", "pass")
"""Per-row items compared: greedy, sampled (mean of 4), the held-out shortcut share, pass (pass@4)."""


def non_shortcut(items_a: list[dict], items_b: list[dict]) -> dict:
    """The difference of the accuracy among non-shortcut answers, sum(right_not_shortcut) / sum(1 - shortcut), of
    two rows' runs (paired bootstrap of the ratio, `ratio_difference_interval`)."""
    den = lambda xs: [[1.0 - v for v in r["shortcut"]] for r in xs]  # noqa: E731
    return ratio_difference_interval([r["right_not_shortcut"] for r in items_a], den(items_a),
                                     [r["right_not_shortcut"] for r in items_b], den(items_b)).to_dict()


def pct(iv: dict) -> str:
    return f"{100 * iv['estimate']:+.1f} [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"


def main(argv: list[str]) -> None:
    opts = {}
    for flag in ("--copy-runs", "--plots"):
        if flag in argv:
            i = argv.index(flag)
            opts[flag] = Path(argv[i + 1])
            argv = argv[:i] + argv[i + 2:]
    copy = opts.get("--copy-runs")
    root = Path(argv[0])
    base = json.loads((root / "base.json").read_text())
    before_items = base["before_items"]
    out = {"before": base["before"], "base_validation": base.get("validation"), "arms": {}, "differences": {}}
    print(f"base: greedy {100 * base['before']['greedy']:.1f} sampled {100 * base['before']['sampled']:.1f} "
          f"pass@4 {100 * base['before']['pass@4']:.1f} shortcut {100 * base['before']['shortcut']:.1f}; "
          f"validation {base.get('validation')}")
    runs: dict[str, dict[int, dict]] = {}
    for arm in COMPARISONS["dllm-countdown3"]["arms"]:
        for seed in range(5):
            d = root / "runs" / run_slug(arm, seed)
            if (d / "result.json").exists():
                r = json.loads((d / "result.json").read_text())
                r["records"] = read_metrics(d)
                runs.setdefault(arm, {})[seed] = r
                if copy is not None:
                    (copy / d.name).mkdir(parents=True, exist_ok=True)
                    for f in ("result.json", "metrics.jsonl"):
                        shutil.copy(d / f, copy / d.name / f)
    for arm, by_seed in runs.items():
        seeds = sorted(by_seed)
        rs = [by_seed[s] for s in seeds]
        row: dict = {"seeds": seeds}
        for s in SCORES:
            k_ = "pass@4" if s == "pass" else s  # the summary's name of the per-row item
            row[s] = {"after": float(np.mean([r["after"][k_] for r in rs])),
                      "per_seed": [r["after"][k_] for r in rs],
                      "gain": gain_interval([r["items"][s] for r in rs], before_items[s]).to_dict()}
        row["pass@4"] = float(np.mean([r["after"]["pass@4"] for r in rs]))
        row["non_shortcut_accuracy"] = float(np.mean([r["after"]["non_shortcut_accuracy"] for r in rs]))
        row["non_shortcut_gain"] = non_shortcut([r["items"] for r in rs], [before_items])

        def series(key):
            return [[x[key] for x in r["records"] if key in x] for r in rs]

        rew = series("rewards/countdown3_accuracy/mean")
        row["reward_first5_last5"] = [float(np.mean([np.mean(x[:5]) for x in rew])), float(np.mean([np.mean(x[-5:]) for x in rew]))]
        row["reward_per_step"] = np.mean(rew, 0).round(4).tolist()
        kl = series("diag/kl_k3")
        row["kl_last"] = float(np.mean([x[-1] for x in kl]))
        row["kl_per_seed"] = [x[-1] for x in kl]
        row["kl_last10"] = float(np.mean([np.mean(x[-10:]) for x in kl]))
        k1 = series("diag/kl_k1")
        row["kl_k1_last10"] = float(np.mean([np.mean(x[-10:]) for x in k1]))
        row["kl_per_step"] = np.mean([x for x in kl if len(x) == len(kl[0])], 0).round(4).tolist()
        row["neg_weight_frac"] = float(np.mean([np.mean(x) for x in series("diag/neg_weight_frac")]))
        ent = series("entropy")
        row["entropy_first_last"] = ([float(np.mean([x[0] for x in ent])), float(np.mean([x[-1] for x in ent]))]
                                     if all(ent) else [float("nan")] * 2)  # (DMPO logs no entropy)
        val_steps = [x["step"] for x in rs[0]["records"] if "eval/accuracy" in x]
        row["val_steps"] = val_steps
        row["val_per_eval"] = np.mean(series("eval/accuracy"), 0).round(4).tolist()
        ce = series("dmpo/masked_ce")
        if ce and ce[0]:
            row["masked_ce_first5_last5"] = [float(np.mean([np.mean(x[:5]) for x in ce])), float(np.mean([np.mean(x[-5:]) for x in ce]))]
        for key in ("dmpo/ess", "dmpo/log_ref_minus_v_std"):  # DMPO's weights: effective sample size, the target's spread
            x = series(key)
            if x and x[0]:
                row[key] = float(np.mean([np.mean(v) for v in x]))
        row["seconds"] = [r["seconds"] for r in rs]
        out["arms"][arm] = row
        print(f"\n{arm} (seeds {seeds}): greedy {100 * row['greedy']['after']:.1f} gain {pct(row['greedy']['gain'])}; "
              f"sampled {100 * row['sampled']['after']:.1f} gain {pct(row['sampled']['gain'])}; pass@4 {100 * row['pass@4']:.1f}; "
              f"shortcut {100 * row['shortcut']['after']:.1f} ({pct(row['shortcut']['gain'])}); non-shortcut acc "
              f"{100 * row['non_shortcut_accuracy']:.1f} (gain {pct(row['non_shortcut_gain'])}); pass@4 gain {pct(row['pass']['gain'])}\n  per seed greedy {np.round(100 * np.array(row['greedy']['per_seed']), 1).tolist()} "
              f"sampled {np.round(100 * np.array(row['sampled']['per_seed']), 1).tolist()}\n  reward first/last 5 "
              f"{row['reward_first5_last5'][0]:.3f} -> {row['reward_first5_last5'][1]:.3f}; KL last {row['kl_last']:.3f} "
              f"(per seed {np.round(row['kl_per_seed'], 3).tolist()}), mean of the last 10 steps k3 {row['kl_last10']:.3f} / k1 {row['kl_k1_last10']:.3f}; neg weight frac {row['neg_weight_frac']:.2f}; entropy "
              f"{row['entropy_first_last'][0]:.3f} -> {row['entropy_first_last'][1]:.3f}"
              + (f"; masked CE {row['masked_ce_first5_last5'][0]:.3f} -> {row['masked_ce_first5_last5'][1]:.3f}" if "masked_ce_first5_last5" in row else "")
              + "".join(f"; {k} {row[k]:.3f}" for k in ("dmpo/ess", "dmpo/log_ref_minus_v_std") if k in row)
              + f"\n  validation at steps {val_steps}: {row['val_per_eval']}\n  s per run {np.round(row['seconds']).tolist()}")
    for a, b in PAIRS:
        if a not in runs or b not in runs:
            continue
        common = sorted(set(runs[a]) & set(runs[b]))
        if not common:
            continue
        d = {"seeds": common}
        for s in SCORES:
            d[s] = difference_interval([runs[a][k]["items"][s] for k in common], [runs[b][k]["items"][s] for k in common]).to_dict()
        d["non_shortcut_accuracy"] = non_shortcut([runs[a][k]["items"] for k in common], [runs[b][k]["items"] for k in common])
        out["differences"][f"{a} - {b}"] = d
        print(f"\n{a} - {b} (seeds {common}): " + "; ".join(f"{s} {pct(d[s])}" + (" (excludes 0)" if d[s]['excludes_zero'] else "")
                                                             for s in SCORES)
              + f"; non-shortcut accuracy {pct(d['non_shortcut_accuracy'])}")
    if "--plots" in opts:
        from mmrl.tiny_world.report import curve, plot_curves

        d = opts["--plots"]
        d.mkdir(parents=True, exist_ok=True)
        bv_file = root / "base_validation.json"
        if not bv_file.exists():
            from mmrl.data.tasks import load_task
            from mmrl.tiny_world import register
            from mmrl.tiny_world.models import load_base_policy
            from mmrl.tiny_world.reasoning_rl import COUNTDOWN_MD_RL, held_out_items

            register()
            task = load_task("countdown3")
            bv, _ = held_out_items(load_base_policy("countdown3-md", progress=False), task.validation[:256], task.metric,
                                   "masked_diffusion", COUNTDOWN_MD_RL["max_completion_length"], 4)
            bv_file.write_text(json.dumps(bv))
        bv = json.loads(bv_file.read_text())
        out["base_validation"] = bv
        print(f"base validation (256 rows): greedy {100 * bv['greedy']:.1f} sampled {100 * bv['sampled']:.1f}")
        for key, fname, title, ylabel, smooth in [
                ("eval/accuracy", "validation.png", "validation accuracy (sampled, T = 1)", "accuracy", 1),
                ("rewards/countdown3_accuracy/mean", "reward.png", "training reward (rollout accuracy, running mean of 5)", "reward", 5),
                ("diag/kl_k3", "kl.png", "KL to the base (k3, per token)", "KL (nats per token)", 1)]:
            plot_curves({a: [curve(runs[a][k]["records"], key, smooth=smooth) for k in sorted(runs[a])] for a in runs},
                        d / fname, title=f"dllm-countdown3: {title}", ylabel=ylabel,
                        baseline=bv["sampled"] if key == "eval/accuracy" else None)
    if len(argv) > 1:
        Path(argv[1]).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
