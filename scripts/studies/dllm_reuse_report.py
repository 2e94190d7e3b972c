"""Study (docs/RESULTS.md, "DMPO reuse F > 1 without negative weights, and rollouts-to-target against diffu-GRPO"):
the table of issue 24 item 3(a) from saved runs, nothing trained.

    MMRL_CACHE=/work/cache python scripts/studies/dllm_reuse_report.py [--arm DMPO_CORRECT_ONLY_F4]
        [--reuse /work/runs/reuse/OUT/dllm-countdown3] [--rl30 /work/runs/rl30-a4aa/OUT/dllm-countdown3]
        [--screen /work/runs/reuse/screen] [--out docs/results/dllm/reuse]

Reads the reuse arm's runs (`--reuse`, `runs/<arm>-seed<k>/result.json` and `metrics.jsonl`, its `base.json`), the
30-batch diffu-GRPO and `DMPO_CORRECT_ONLY` (F = 1) runs on the same build (`--rl30`), the validation screen
(`--screen`, `screen.jsonl`) and the old collapsing `DMPO F=8` (`docs/results/dllm/rl/dmpo_f8_metrics.jsonl`). The
base's step-0 validation point per seed (the trainer's evaluation with that seed's per-row sampling seeds) is computed
once into `<out>/base_validation_step0.json` (needs the cached base). Writes `<out>/report.json`, `<out>/table.md`,
copies every run's result.json and metrics.jsonl to `<out>/runs/<run>/` (from there on the script can be pointed at
`--reuse <out> --rl30 <out>`), and draws `<out>/validation.png` and `<out>/collapse.png`.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

from mmrl.reporting.metrics_log import read_metrics
from mmrl.tiny_world import reasoning_rl as rr
from mmrl.tiny_world.stats import difference_interval, gain_interval, mean_interval
from mmrl.tiny_world.targets import batches_curve, mean_curve, rollouts_to_target

NAME = "dllm-countdown3"
DIFFU = "diffu-GRPO"
SCORES = ("greedy", "sampled", "pass", "shortcut")
ACC = "rewards/countdown3_accuracy/mean"


def pct(iv: dict) -> str:
    return f"{100 * iv['estimate']:+.1f} [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"


def load_runs(root: Path, arm: str, copy: Path | None) -> dict[int, dict]:
    """seed -> result.json with its metrics records, for every finished run of `arm` under `root/runs`."""
    out = {}
    for seed in range(5):
        d = root / "runs" / rr.run_slug(arm, seed)
        if not (d / "result.json").exists():
            continue
        r = json.loads((d / "result.json").read_text())
        r["records"] = read_metrics(d)
        out[seed] = r
        if copy is not None and copy.resolve() != d.resolve():
            (copy / d.name).mkdir(parents=True, exist_ok=True)
            for f in ("result.json", "metrics.jsonl"):
                shutil.copy(d / f, copy / d.name / f)
    return out


def per_batch(records: list[dict], key: str, f: int) -> list[tuple[int, float]]:
    """[(rollout batch, value)] of `key` at each batch's first optimizer step (where the KL and the reward of the
    batch are logged)."""
    return [((r["step"] - 1) // f + 1, float(r[key])) for r in records if key in r and (r["step"] - 1) % f == 0]


def step0_validation(seeds: list[int], cache: Path) -> dict[int, float]:
    """The base's validation accuracy at step 0 per seed: the trainer's evaluation (one sampled answer per row, the
    seed's per-row sampling seeds, the recipe's validation rows), computed once and cached in `cache`."""
    have = {int(k): v for k, v in json.loads(cache.read_text()).items()} if cache.exists() else {}
    todo = [s for s in seeds if s not in have]
    if todo:
        from types import SimpleNamespace

        from mmrl.config.train_config import load_config
        from mmrl.data.tasks import load_task
        from mmrl.tiny_world import register
        from mmrl.tiny_world.models import load_base_policy
        from mmrl.training.evaluate import evaluate_during_training

        register()
        recipe = rr.COMPARISONS[NAME]["recipe"]
        task = load_task(recipe["task"])
        rows = task.validation[: recipe["eval_limit"]]
        policy = load_base_policy(recipe["model_name_or_path"].split(":", 1)[1], progress=False)
        for s in todo:
            cfg = load_config(None, rr.arm_config(NAME, DIFFU, seed=s, out=cache.parent / "tmp"))
            have[s] = evaluate_during_training(policy, rows, task.metric, cfg, SimpleNamespace(device="cpu"), 0, 1)["eval/accuracy"]
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({str(k): v for k, v in sorted(have.items())}))
    return have


def arm_curves(runs: dict[int, dict], f: int, v0: dict[int, float]) -> dict[int, list[tuple[int, float]]]:
    """seed -> validation curve [(rollout batches, accuracy)] with the base's step-0 point first."""
    return {s: [(0, v0[s])] + batches_curve([(x["step"], x["eval/accuracy"]) for x in r["records"] if "eval/accuracy" in x], f)
            for s, r in runs.items()}


def hits(curves: dict[int, list], target: float, budget: int, per_batch_answers: int) -> dict:
    """Rollouts-to-target per seed, and the mean over seeds with a bootstrap interval over seeds (censored runs counted
    at the budget)."""
    h = {s: rollouts_to_target(c, target, per_batch_answers, budget) for s, c in curves.items()}
    vals = [[float(h[s].rollouts)] for s in sorted(h)]  # [seeds, 1]
    iv = mean_interval(vals).to_dict()
    return {"per_seed": {s: {"batches": x.batches, "rollouts": x.rollouts, "reached": x.reached} for s, x in h.items()},
            "mean": iv, "censored": sum(not x.reached for x in h.values()), "vals": vals}


def screen_entries(sdir: Path, copy: Path, comp: dict, v0: dict, lines: list[str]) -> list[dict]:
    """The screen runs of folder `sdir` (its screen.jsonl, and any run stopped before its end, marked partial), with
    their per-batch KL, reward and per-step masked CE; their metrics copied to `copy/screen-<run>/`."""
    scr = sdir / "screen.jsonl"
    if not sdir.exists():
        return []
    entries = [json.loads(x) for x in scr.read_text().splitlines() if x.strip()] if scr.exists() else []
    if scr.exists():
        shutil.copy(scr, copy.parent / f"{sdir.name}.jsonl")
    for d in sorted(p for p in sdir.iterdir() if p.is_dir() and not (p / "done.json").exists()):
        recs = read_metrics(d)  # a screen run stopped before its end: its curve so far, marked partial
        label = next((x for x in comp["arms"] if d.name == rr.run_slug(x, 0)), None)
        if not recs or label is None:
            continue
        f_ = int(comp["arms"][label].get("num_iterations", 1))
        entries.append({"arm": label, "seed": 0, "F": f_, "partial": True, "rollouts": -(-recs[-1]["step"] // f_),
                        "seconds": float("nan"), "validation_step0": v0.get(0, float("nan")),
                        "validation": [(r["step"], r["eval/accuracy"]) for r in recs if "eval/accuracy" in r],
                        "kl_k3_max": max(r.get("diag/kl_k3", 0.0) for r in recs)})
    for x in entries:
        d = sdir / rr.run_slug(x["arm"], x["seed"])
        if (d / "metrics.jsonl").exists():
            (copy / f"screen-{d.name}").mkdir(parents=True, exist_ok=True)
            shutil.copy(d / "metrics.jsonl", copy / f"screen-{d.name}" / "metrics.jsonl")
            recs = read_metrics(d)
            x["kl_k3_per_batch"] = per_batch(recs, "diag/kl_k3", x["F"])
            x["reward_per_batch"] = per_batch(recs, ACC, x["F"])
            x["masked_ce_per_step"] = [float(r["dmpo/masked_ce"]) for r in recs if "dmpo/masked_ce" in r]
        lines.append(f"\nscreen {x['arm']} (F = {x['F']}, seed {x['seed']}, {x['rollouts']} batches"
                     f"{', PARTIAL: stopped' if x.get('partial') else ''}): validation step 0 "
                     f"{100 * x['validation_step0']:.1f}, then {[(s // x['F'], round(100 * v, 1)) for s, v in x['validation']]}; "
                     f"KL k3 max {x['kl_k3_max']:.3f}; {x['seconds']:.0f} s")
    return entries


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", default="DMPO_CORRECT_ONLY_F4", help="the reuse arm's constant in reasoning_rl")
    ap.add_argument("--reuse", type=Path, default=Path("/work/runs/reuse/OUT/dllm-countdown3"))
    ap.add_argument("--rl30", type=Path, default=Path("/work/runs/rl30-a4aa/OUT/dllm-countdown3"))
    ap.add_argument("--screen", type=Path, nargs="+", default=[Path("/work/runs/reuse/screen"), Path("/work/runs/reuse/screen-old")],
                    help="screen folders (screen.jsonl and one run folder per arm)")
    ap.add_argument("--old-f8", type=Path, default=Path("docs/results/dllm/rl/dmpo_f8_metrics.jsonl"))
    ap.add_argument("--out", type=Path, default=Path("docs/results/dllm/reuse"))
    a = ap.parse_args()
    arm = getattr(rr, a.arm)
    out = a.out
    copy = out / "runs"
    copy.mkdir(parents=True, exist_ok=True)
    comp = rr.COMPARISONS[NAME]
    f_arm = int(comp["arms"][arm].get("num_iterations", 1))
    per_b = comp["recipe"]["per_device_train_batch_size"]  # 16 problems x 8 answers
    base = json.loads((a.reuse / "base.json").read_text())
    before_items = base["before_items"]
    if a.reuse.resolve() != out.resolve():
        shutil.copy(a.reuse / "base.json", out / "base.json")
    runs = {arm: load_runs(a.reuse, arm, copy), DIFFU: load_runs(a.rl30, DIFFU, copy),
            rr.DMPO_CORRECT_ONLY: load_runs(a.rl30, rr.DMPO_CORRECT_ONLY, copy)}
    f_of = {arm: f_arm, DIFFU: 1, rr.DMPO_CORRECT_ONLY: 1}
    budget = {x: max((r["steps"] // f_of[x] for r in runs[x].values()), default=0) for x in runs}
    seeds_all = sorted(set().union(*[set(v) for v in runs.values()]))
    v0 = step0_validation(seeds_all, out / "base_validation_step0.json")
    rep: dict = {"base_build": "countdown3-md a4aa9766b587 (this machine's rebuild; reference 580b2788de99)",
                 "base_test": base["before"], "base_validation_step0": v0, "arms": {}, "targets": {}, "differences": {}}
    lines = [f"base (test, 256 rows): greedy {100 * base['before']['greedy']:.1f} sampled {100 * base['before']['sampled']:.1f} "
             f"pass@4 {100 * base['before']['pass@4']:.1f}; validation at step 0 per seed "
             + ", ".join(f"{s}: {100 * v:.1f}" for s, v in sorted(v0.items()))]
    curves = {x: arm_curves(runs[x], f_of[x], v0) for x in runs}
    for x, by_seed in runs.items():
        if not by_seed:
            continue
        seeds = sorted(by_seed)
        rs = [by_seed[s] for s in seeds]
        row = {"seeds": seeds, "F": f_of[x], "rollout_batches": budget[x], "answers_per_run": budget[x] * per_b}
        for s in SCORES:
            k = "pass@4" if s == "pass" else s
            row[s] = {"after": float(np.mean([r["after"][k] for r in rs])), "per_seed": [r["after"][k] for r in rs],
                      "gain": gain_interval([r["items"][s] for r in rs], before_items[s]).to_dict()}
        row["validation_curves"] = {s: curves[x][s] for s in seeds}
        row["validation_mean"] = mean_curve([curves[x][s] for s in seeds])
        f = f_of[x]
        row["kl_k3_per_batch"] = {s: per_batch(by_seed[s]["records"], "diag/kl_k3", f) for s in seeds}
        row["reward_per_batch"] = {s: per_batch(by_seed[s]["records"], ACC, f) for s in seeds}
        row["masked_ce_per_step"] = {s: [float(r["dmpo/masked_ce"]) for r in by_seed[s]["records"] if "dmpo/masked_ce" in r]
                                     for s in seeds}
        row["kl_k3_max"] = float(max(v for s in seeds for _, v in row["kl_k3_per_batch"][s]))
        row["seconds"] = [r["seconds"] for r in rs]
        rep["arms"][x] = row
        lines.append(f"\n{x} (F = {f}, {budget[x]} rollout batches, seeds {seeds}): greedy {100 * row['greedy']['after']:.1f} "
                     f"gain {pct(row['greedy']['gain'])}; sampled {100 * row['sampled']['after']:.1f} gain "
                     f"{pct(row['sampled']['gain'])}; pass@4 {100 * row['pass']['after']:.1f} gain {pct(row['pass']['gain'])}; held-out "
                     f"shortcut share {100 * row['shortcut']['after']:.1f} gain {pct(row['shortcut']['gain'])}"
                     f"\n  per seed greedy {np.round(100 * np.array(row['greedy']['per_seed']), 1).tolist()} sampled "
                     f"{np.round(100 * np.array(row['sampled']['per_seed']), 1).tolist()}"
                     f"\n  validation (mean of seeds, by rollout batch) {[(b, round(100 * v, 1)) for b, v in row['validation_mean']]}"
                     f"\n  KL k3 max {row['kl_k3_max']:.3f}; s per run {np.round(row['seconds']).tolist()}")
    # rollouts-to-target
    targets = {}
    if runs[DIFFU]:
        targets["diffu-GRPO's validation at 30 batches (mean of seeds)"] = float(np.mean([c[-1][1] for c in curves[DIFFU].values()]))
    targets["the base's validation + 2 points (mean of seeds)"] = float(np.mean(list(v0.values()))) + 0.02
    if runs[rr.DMPO_CORRECT_ONLY]:
        targets["DMPO correct_only F = 1's validation at 30 batches (mean of seeds)"] = float(
            np.mean([c[-1][1] for c in curves[rr.DMPO_CORRECT_ONLY].values()]))
    base_v = float(np.mean(list(v0.values())))
    for tname, t in targets.items():
        entry = {"target": t, "base_validation_mean": base_v, "vacuous": t <= base_v, "arms": {}}
        for x in runs:
            if runs[x]:
                entry["arms"][x] = hits(curves[x], t, budget[x], per_b)
        if arm in entry["arms"] and DIFFU in entry["arms"] and entry["arms"][arm]["censored"] == 0:
            # only where every seed of the reuse arm reached the target; diffu-GRPO's censored seeds count at its 30
            # batches (their true value is larger), so the difference is then an upper bound (conservative for reuse)
            entry[f"{arm} - {DIFFU}"] = difference_interval(entry["arms"][arm]["vals"], entry["arms"][DIFFU]["vals"]).to_dict()
            entry[f"{arm} - {DIFFU}"]["upper_bound_from_censoring"] = entry["arms"][DIFFU]["censored"] > 0
        for x in entry["arms"].values():
            x.pop("vals")
        rep["targets"][tname] = entry
        lines.append(f"\ntarget {tname}: {100 * t:.2f}% (base validation mean {100 * base_v:.2f}%{', VACUOUS: the base reaches it' if t <= base_v else ''})")
        for x, h in entry["arms"].items():
            ps = ", ".join(f"{s}: {v['rollouts']}{'' if v['reached'] else ' (not reached)'}" for s, v in sorted(h["per_seed"].items()))
            m = h["mean"]
            lines.append(f"  {x}: rollouts per seed {ps}; mean {m['estimate']:.0f} [{m['low']:.0f}, {m['high']:.0f}]"
                         + (f", {h['censored']} censored at {budget[x] * per_b}" if h["censored"] else ""))
        d = entry.get(f"{arm} - {DIFFU}")
        if d:
            lines.append(f"  {arm} - {DIFFU}: {d['estimate']:+.0f} [{d['low']:+.0f}, {d['high']:+.0f}] rollouts"
                         + (" (an upper bound: diffu-GRPO's censored seeds counted at its budget)" if d["upper_bound_from_censoring"] else ""))
        elif arm in entry["arms"]:
            lines.append(f"  {arm} - {DIFFU}: not estimated ({entry['arms'][arm]['censored']} seeds of {arm} censored at its budget)")
    # validation at equal rollouts (the reuse arm's last grid point), over seeds (one figure per seed: the curve's point)
    if runs[arm]:
        b_eq = budget[arm]
        at = {x: [[dict(c)[b_eq]] for _, c in sorted(curves[x].items()) if b_eq in dict(c)] for x in runs if runs[x]}
        rep["validation_at_equal_rollouts"] = {"batches": b_eq, **{x: mean_interval(v).to_dict() for x, v in at.items() if v}}
        for b in (DIFFU, rr.DMPO_CORRECT_ONLY):
            if at.get(b):
                rep["validation_at_equal_rollouts"][f"{arm} - {b}"] = difference_interval(at[arm], at[b]).to_dict()
        lines.append(f"\nvalidation after {b_eq} rollout batches (mean of seeds [95% CI over seeds]): " + "; ".join(
            f"{x} {pct(v)}" for x, v in rep["validation_at_equal_rollouts"].items() if x != "batches"))
    # test differences, paired over items and seeds
    for b in (DIFFU, rr.DMPO_CORRECT_ONLY):
        if runs[arm] and runs[b]:
            common = sorted(set(runs[arm]) & set(runs[b]))
            d = {"seeds": common, **{s: difference_interval([runs[arm][k]["items"][s] for k in common],
                                                            [runs[b][k]["items"][s] for k in common]).to_dict() for s in SCORES}}
            rep["differences"][f"{arm} - {b}"] = d
            lines.append(f"\n{arm} - {b} (test, seeds {common}): " + "; ".join(
                f"{s} {pct(d[s])}" + (" (excludes 0)" if d[s]["excludes_zero"] else "") for s in SCORES))
    # the screen and the old collapse
    rep["screen"] = []
    for sdir in a.screen:
        rep["screen"] += screen_entries(sdir, copy, comp, v0, lines)
    if a.old_f8.exists():
        old = [json.loads(x) for x in a.old_f8.read_text().splitlines() if x.strip()]
        rep["old_dmpo_f8"] = {"kl_k3_per_batch": per_batch(old, "diag/kl_k3", 8), "reward_per_batch": per_batch(old, "reward", 8),
                              "masked_ce_per_step": [float(r["dmpo/masked_ce"]) for r in old if "dmpo/masked_ce" in r]}
    (out / "report.json").write_text(json.dumps(rep, indent=2))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rep, arm, out)


def plot(rep: dict, arm: str, out: Path) -> None:
    """validation.png (validation against rollout batches, mean of seeds, each target dashed) and collapse.png (KL,
    masked CE and reward per rollout batch: the reuse arm's seeds against the old DMPO F = 8)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for x, row in rep["arms"].items():
        b, v = zip(*row["validation_mean"])
        ax.plot(b, v, marker="o", label=f"{x} (F = {row['F']}, {len(row['seeds'])} seeds)")
    for i, (t, e) in enumerate(rep["targets"].items()):
        ax.axhline(e["target"], ls="--", lw=0.8, color=f"C{i + 3}", label=f"target: {t}")
    ax.set_xlabel("rollout batches (16 x 8 answers)")
    ax.set_ylabel("validation accuracy (1 sampled answer / row)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "validation.png", dpi=120)
    plt.close(fig)
    fig, axs = plt.subplots(1, 3, figsize=(13, 4))
    row = rep["arms"].get(arm)
    old = rep.get("old_dmpo_f8")
    for ax, key, title, log in [(axs[0], "kl_k3_per_batch", "KL to the base (k3, batch start)", True),
                                (axs[1], "masked_ce_per_step", "WDCE masked CE (per optimizer step)", False),
                                (axs[2], "reward_per_batch", "training reward (per rollout batch)", False)]:
        if row:
            for j, (s, ys) in enumerate(row[key].items()):
                xs, vs = (zip(*ys) if key != "masked_ce_per_step" else (np.arange(1, len(ys) + 1) / row["F"], ys))
                ax.plot(list(xs), list(vs), color="C0", alpha=0.6, label=f"{arm}" if j == 0 else None)
        for j, x in enumerate(rep.get("screen", [])):
            if x["F"] == 8 and key in x and x[key]:
                ys = x[key]
                xs, vs = (zip(*ys) if key != "masked_ce_per_step" else (np.arange(1, len(ys) + 1) / 8, ys))
                ax.plot(list(xs), list(vs), color=f"C{1 + j}", label=f"screen: {x['arm']} (seed 0)")
        if old:
            ys = old[key]
            xs, vs = (zip(*ys) if key != "masked_ce_per_step" else (np.arange(1, len(ys) + 1) / 8, ys))
            ax.plot(list(xs), list(vs), color="k", label="old DMPO F=8 (group baseline, reference build)")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("rollout batches")
        if log:
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "collapse.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
