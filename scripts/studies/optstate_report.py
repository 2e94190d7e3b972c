"""Study (docs/RESULTS.md, "Keeping the pre-training optimizer state"): the `dllm-countdown3` arms that start AdamW
from the base's pre-training state, each set beside its fresh-optimizer twin of the 30-batch table
(`docs/results/dllm/rl30/results.json`, same base build, seeds and test rows): every arm's gain over the base
(greedy, sampled, pass@4), with-state - fresh per method on the seeds both have (paired bootstrap over test rows and
seeds, `mmrl.tiny_world.stats`), and the diagnostics: training reward, KL to the base (k3), and the update size
(`diag/update_abs_mean` / the step's lr) per step, with the fresh twins' first steps from the update-size
diagnostic (`optstate_update_size.py`); and the step-size control, fresh-AdamW DMPO at lr 2e-4 (`dllm-countdown3-lr`,
run into OUT/../dllm-countdown3-lr), against the with-state DMPO arm and the fresh 5e-4 twin, where it has runs.

    python scripts/studies/optstate_report.py OUT/dllm-countdown3 docs/results/dllm/rl30 UPDATE_SIZE.json DEST

writes DEST/results.json (per-item scores of the new runs; the twins' are in the rl30 results.json), DEST/table.md,
and the plots DEST/reward.png, DEST/kl.png, DEST/validation.png, DEST/update_size.png; prints every figure.
"""
import json
import sys
from pathlib import Path

import numpy as np

from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world.reasoning_rl import (DIFFU_GRPO_BASE_STATE, DMPO_CORRECT_ONLY, DMPO_CORRECT_ONLY_BASE_STATE,
                                          lr_label, run_slug)
from mmrl.tiny_world.report import markdown_table, plot_curves
from mmrl.tiny_world.stats import Interval, difference_interval, gain_interval

TWINS = {DIFFU_GRPO_BASE_STATE: "diffu-GRPO", DMPO_CORRECT_ONLY_BASE_STATE: DMPO_CORRECT_ONLY}
"""with-state arm -> its fresh-optimizer twin in the 30-batch table."""

CONTROL_LR = 2e-4
"""The step-size control's lr: fresh-AdamW DMPO at `dllm-countdown3-lr`'s arm of this lr (OUT/dllm-countdown3-lr)."""

SCORES = ("greedy", "sampled", "pass")
"""Per-row items compared (pass: pass@4 of the 4 sampled answers)."""

REWARD = "rewards/countdown3_accuracy/mean"


def iv(d: dict) -> Interval:
    return Interval(**{k: v for k, v in d.items() if k != "excludes_zero"})


def pct(x: Interval) -> str:
    return x.fmt(signed=True) + (" (claimed)" if x.excludes_zero else "")


def series(records: list[dict], key: str) -> list[float]:
    return [r[key] for r in records if key in r]


def update_over_lr(records: list[dict], lr0: float = 0.0) -> list[float | None]:
    """Per step: `diag/update_abs_mean` / the lr the step used (the logged lr is the next step's; step 1's is `lr0`)."""
    used = [lr0] + [r["learning_rate"] for r in records[:-1]]
    return [r["diag/update_abs_mean"] / lr if lr > 0 else None for r, lr in zip(records, used)]


def main(argv: list[str]) -> None:
    root, rl30, size_file, dest = Path(argv[0]), Path(argv[1]), Path(argv[2]), Path(argv[3])
    dest.mkdir(parents=True, exist_ok=True)
    base = json.loads((root / "base.json").read_text())
    fresh = json.loads((rl30 / "results.json").read_text())
    fresh_report = json.loads((rl30 / "report.json").read_text())
    same_base = base["before_items"]["greedy"] == fresh["before_items"]["greedy"] and base["before"] == fresh["before"]
    print(f"base (this build): {base['before']}; the 30-batch table's base row is {'the same' if same_base else 'DIFFERENT'}")
    before = base["before_items"]
    sizes = json.loads(size_file.read_text()) if size_file.exists() else {}
    out: dict = {"base": "countdown3-md", "weights_sha256_12": "580b2788de99", "before": base["before"], "before_items": before,
                 "same_base_row_as_rl30": same_base, "arms": {}, "fresh_twins": {}, "differences": {}, "update_size_first_steps": sizes}
    rows, diff_rows = [], []
    curves_reward, curves_kl, curves_size, curves_val = {}, {}, {}, {}
    for arm, twin in TWINS.items():
        runs = {}
        for seed in range(5):
            d = root / "runs" / run_slug(arm, seed)
            if (d / "result.json").exists():
                r = json.loads((d / "result.json").read_text())
                r["records"] = read_metrics(d)
                runs[seed] = r
        twin_runs = {r["seed"]: r for r in fresh["arms"][twin]}
        if not runs:
            print(f"{arm}: no finished run")
            continue
        seeds = sorted(runs)
        for name, by_seed, recs in [(arm, runs, True), (twin, {s: twin_runs[s] for s in seeds}, False)]:
            rs = [by_seed[s] for s in seeds]
            gains = {s: gain_interval([r["items"][s] for r in rs], before[s]) for s in SCORES}
            row = {"seeds": seeds, "after": {s: float(np.mean([r["after"]["pass@4" if s == "pass" else s] for r in rs])) for s in SCORES},
                   "per_seed": {s: [r["after"]["pass@4" if s == "pass" else s] for r in rs] for s in SCORES},
                   "gain": {s: g.to_dict() for s, g in gains.items()}}
            if recs:
                rew = [series(r["records"], REWARD) for r in rs]
                kl = [series(r["records"], "diag/kl_k3") for r in rs]
                size = [update_over_lr(r["records"]) for r in rs]
                row.update(reward_first5_last5=[float(np.mean([np.mean(x[:5]) for x in rew])), float(np.mean([np.mean(x[-5:]) for x in rew]))],
                           reward_per_step=np.mean(rew, 0).round(4).tolist(), kl_last=float(np.mean([x[-1] for x in kl])),
                           kl_per_step=np.mean(kl, 0).round(4).tolist(),
                           update_over_lr_per_step=[None if any(v[i] is None for v in size) else round(float(np.mean([v[i] for v in size])), 4)
                                                    for i in range(len(size[0]))],
                           grad_norm_mean=float(np.mean([np.mean(series(r["records"], "grad_norm")) for r in rs])),
                           seconds=[r["seconds"] for r in rs],
                           items=[{"seed": s, **by_seed[s]["items"]} for s in seeds])
                curves_reward[name] = [[(x["step"], x[REWARD]) for x in r["records"] if REWARD in x] for r in rs]
                curves_kl[name] = [[(x["step"], x["diag/kl_k3"]) for x in r["records"] if "diag/kl_k3" in x] for r in rs]
                curves_size[name] = [[(x["step"], v) for x, v in zip(r["records"], update_over_lr(r["records"])) if v is not None] for r in rs]
                curves_val[name] = [[(x["step"], x["eval/accuracy"]) for x in r["records"] if "eval/accuracy" in x] for r in rs]
                row["val_per_eval"] = np.mean([series(r["records"], "eval/accuracy") for r in rs], 0).round(4).tolist()
                out["arms"][name] = row
            else:
                fr = fresh_report["arms"][twin]
                row.update(reward_first5_last5=fr["reward_first5_last5"], reward_per_step=fr["reward_per_step"],
                           kl_last=fr["kl_last"], kl_per_step=fr["kl_per_step"], note="all 5 seeds' diagnostics (rl30 report.json)")
                label = f"{name} (rl30, mean of its 5 seeds)"
                curves_reward[label] = [list(zip(range(1, 31), fr["reward_per_step"]))]
                curves_kl[label] = [list(zip(range(1, 31), fr["kl_per_step"]))]
                curves_val[label] = [list(zip(fr["val_steps"], fr["val_per_eval"]))]
                row["val_per_eval"] = fr["val_per_eval"]
                first = sizes.get(f"{twin} | seed 0")
                if first:
                    curves_size[f"{name} (seed 0, first steps)"] = [[(x["step"], x["update_over_lr"]) for x in first if x["update_over_lr"] is not None]]
                out["fresh_twins"][name] = row
            size_cell = "-"
            if recs:
                u = row["update_over_lr_per_step"]
                size_cell = f"{np.mean([x for x in u[1:6] if x is not None]):.3f} / {np.mean([x for x in u[-5:] if x is not None]):.3f}"
            elif sizes.get(f"{twin} | seed 0"):
                u = [x["update_over_lr"] for x in sizes[f"{twin} | seed 0"] if x["update_over_lr"] is not None]
                size_cell = f"{np.mean(u[:5]):.3f} (seed 0) / -"
            rows.append([f"{name} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})", f"{100 * row['after']['greedy']:.1f}", pct(gains["greedy"]),
                         f"{100 * row['after']['sampled']:.1f}", pct(gains["sampled"]), f"{100 * row['after']['pass']:.1f}",
                         pct(gains["pass"]), f"{100 * row['reward_first5_last5'][0]:.1f} / {100 * row['reward_first5_last5'][1]:.1f}",
                         f"{row['kl_last']:.3f}", size_cell])
            print(f"{name} (seeds {seeds}): " + "; ".join(f"{s} {100 * row['after'][s]:.1f} gain {pct(gains[s])}" for s in SCORES)
                  + f"; reward first/last 5 {row['reward_first5_last5'][0]:.3f} -> {row['reward_first5_last5'][1]:.3f}; KL last {row['kl_last']:.3f}"
                  + (f"; |dw|/lr steps 2-6 / last 5: {size_cell}" if size_cell != "-" else "")
                  + f"; validation (mean over seeds, steps 5..30) {row['val_per_eval']}")
        d = {"seeds": seeds}
        for s in SCORES:
            x = difference_interval([runs[k]["items"][s] for k in seeds], [twin_runs[k]["items"][s] for k in seeds])
            d[s] = x.to_dict()
        out["differences"][f"{arm} - {twin}"] = d
        diff_rows.append([f"{arm} - {twin} (seeds {seeds})", *[pct(iv(d[s])) for s in SCORES]])
        print(f"{arm} - {twin} (seeds {seeds}): " + "; ".join(f"{s} {pct(iv(d[s]))}" for s in SCORES))
    ctrl_arm = lr_label(DMPO_CORRECT_ONLY, CONTROL_LR)
    ctrl = {}
    for seed in range(5):
        d = root.parent / "dllm-countdown3-lr" / "runs" / run_slug(ctrl_arm, seed)
        if (d / "result.json").exists():
            r = json.loads((d / "result.json").read_text())
            r["records"] = read_metrics(d)
            ctrl[seed] = r
    if ctrl:  # the step-size control: fresh DMPO at the smaller lr, against the with-state arm and the fresh 5e-4 twin
        seeds = sorted(ctrl)
        rs = [ctrl[k] for k in seeds]
        gains = {x: gain_interval([r["items"][x] for r in rs], before[x]) for x in SCORES}
        rew = [series(r["records"], REWARD) for r in rs]
        kl = [series(r["records"], "diag/kl_k3") for r in rs]
        size = [update_over_lr(r["records"]) for r in rs]
        u = [float(np.mean([v[i] for v in size])) for i in range(1, len(size[0]))]
        row = {"seeds": seeds, "after": {x: float(np.mean([r["after"]["pass@4" if x == "pass" else x] for r in rs])) for x in SCORES},
               "gain": {x: g.to_dict() for x, g in gains.items()},
               "reward_first5_last5": [float(np.mean([np.mean(x[:5]) for x in rew])), float(np.mean([np.mean(x[-5:]) for x in rew]))],
               "kl_last": float(np.mean([x[-1] for x in kl])), "kl_per_step": np.mean(kl, 0).round(4).tolist(),
               "update_over_lr_per_step": [None] + [round(x, 4) for x in u], "seconds": [r["seconds"] for r in rs],
               "items": [{"seed": k, **ctrl[k]["items"]} for k in seeds]}
        out["control"] = {ctrl_arm: row}
        curves_reward[ctrl_arm] = [[(x["step"], x[REWARD]) for x in r["records"] if REWARD in x] for r in rs]
        curves_kl[ctrl_arm] = [[(x["step"], x["diag/kl_k3"]) for x in r["records"] if "diag/kl_k3" in x] for r in rs]
        curves_val[ctrl_arm] = [[(x["step"], x["eval/accuracy"]) for x in r["records"] if "eval/accuracy" in x] for r in rs]
        curves_size[ctrl_arm] = [[(x["step"], v * CONTROL_LR / 5e-4) for x, v in zip(r["records"], update_over_lr(r["records"]))
                                  if v is not None] for r in rs]  # on the 5e-4 arms' scale: |delta w| / 5e-4
        size_cell = f"{np.mean(u[:5]):.3f} / {np.mean(u[-5:]):.3f} (x lr 2e-4)"
        rows.append([f"{ctrl_arm} (fresh AdamW; {len(seeds)} seed{'s' if len(seeds) > 1 else ''})",
                     f"{100 * row['after']['greedy']:.1f}", pct(gains["greedy"]), f"{100 * row['after']['sampled']:.1f}",
                     pct(gains["sampled"]), f"{100 * row['after']['pass']:.1f}", pct(gains["pass"]),
                     f"{100 * row['reward_first5_last5'][0]:.1f} / {100 * row['reward_first5_last5'][1]:.1f}", f"{row['kl_last']:.3f}", size_cell])
        print(f"{ctrl_arm} (seeds {seeds}): " + "; ".join(f"{x} {100 * row['after'][x]:.1f} gain {pct(gains[x])}" for x in SCORES)
              + f"; reward first/last 5 {row['reward_first5_last5'][0]:.3f} -> {row['reward_first5_last5'][1]:.3f}; KL last "
              f"{row['kl_last']:.3f}; |dw|/lr steps 2-6 / last 5: {size_cell}")
        state_runs = {}
        for k in seeds:
            d = root / "runs" / run_slug(DMPO_CORRECT_ONLY_BASE_STATE, k)
            if (d / "result.json").exists():
                state_runs[k] = json.loads((d / "result.json").read_text())
        twin_runs = {r["seed"]: r for r in fresh["arms"][DMPO_CORRECT_ONLY]}
        for label, other in [(f"{DMPO_CORRECT_ONLY_BASE_STATE} - {ctrl_arm}", state_runs), (f"{ctrl_arm} - {DMPO_CORRECT_ONLY}", twin_runs)]:
            common = [k for k in seeds if k in other]
            if not common:
                continue
            pair = [(ctrl, other)] if label.startswith(ctrl_arm) else [(other, ctrl)]
            a, b = pair[0]
            d = {"seeds": common, **{x: difference_interval([a[k]["items"][x] for k in common], [b[k]["items"][x] for k in common]).to_dict()
                                     for x in SCORES}}
            out["differences"][label] = d
            diff_rows.append([f"{label} (seeds {common})", *[pct(iv(d[x])) for x in SCORES]])
            print(f"{label} (seeds {common}): " + "; ".join(f"{x} {pct(iv(d[x]))}" for x in SCORES))
    head = ["arm", "greedy", "greedy gain [95% CI]", "sampled (4 per row)", "sampled gain [95% CI]", "pass@4", "pass@4 gain [95% CI]",
            "train reward, first / last 5 steps", "KL to base (k3, last step)", "mean abs update / lr, steps 2-6 / last 5"]
    table = (markdown_table(head, [["base model", f"{100 * base['before']['greedy']:.1f}", "-", f"{100 * base['before']['sampled']:.1f}", "-",
                                    f"{100 * base['before']['pass@4']:.1f}", "-", "-", "-", "-"]] + rows)
             + "\n\n" + markdown_table(["with the pre-training state - fresh AdamW (points)", "greedy [95% CI]", "sampled [95% CI]",
                                        "pass@4 [95% CI]"], diff_rows)
             + "\n\nBase `countdown3-md`, weights digest `580b2788de99...` (the reference build; the fresh rows are the 30-batch "
               "table's runs, docs/results/dllm/rl30), 256 test rows, 30 rollout batches of 16 x 8 per run; intervals: paired "
               "bootstrap over test rows and seeds. Update size: mean |delta w| per weight / the step's lr (step 1 has lr 0).\n")
    (dest / "table.md").write_text(table)
    (dest / "results.json").write_text(json.dumps(out, indent=1))
    plot_curves(curves_reward, dest / "reward.png", title="dllm-countdown3: training reward, pre-training AdamW state vs fresh",
                ylabel="reward (rollout accuracy)")
    plot_curves(curves_kl, dest / "kl.png", title="dllm-countdown3: KL to the base (k3, per token)", ylabel="KL (nats per token)")
    plot_curves(curves_val, dest / "validation.png", title="dllm-countdown3: validation accuracy (1 sampled answer per row)",
                ylabel="accuracy", baseline=json.loads((rl30 / "base_validation.json").read_text())["sampled"])  # the base, 4 per row
    plot_curves(curves_size, dest / "update_size.png", title="dllm-countdown3: mean |delta w| per step / the 5e-4 schedule's lr", ylabel="|delta w| / lr(5e-4 schedule)")
    print("\n" + table)


if __name__ == "__main__":
    main(sys.argv[1:])
