"""Study (docs/RESULTS.md, "`dllm-countdown3`: the lr swept"): issue 24 item 2's lr sweep on validation only.

    python scripts/studies/dllm_lr_sweep.py sweep OUT [--seeds N]      # train every arm x lr of dllm-countdown3-lr
    python scripts/studies/dllm_lr_sweep.py report OUT DOCDIR          # sweep.json, table.md, val_vs_kl.png, curves
    python scripts/studies/dllm_lr_sweep.py test OUT2 --deadline HH:MM LABEL...   # stage 2: 5 seeds, test once
    python scripts/studies/dllm_lr_sweep.py test-report DOCDIR LABEL=RUNS_DIR...   # stage 2's gains and difference

`sweep` trains each arm of `COMPARISONS["dllm-countdown3-lr"]` (diffu-GRPO and DMPO with weight on right answers
only, at each lr of `DLLM_LR_SWEEP`) from the cached `countdown3-md` base, seed-major, in the budget's order (lr 5e-4,
2e-3, 1e-3, 2e-4; each lr diffu-GRPO then DMPO), with the trainer's validation curve (one sampled answer per row on
the first 256 validation rows, every 5 steps), then scores the same validation rows once as the test would be
(greedy; 4 sampled answers per row; pass@4; per-row items). No test row is read. Each run writes
OUT/runs/<run>/sweep_run.json when it finishes (a rerun skips it); the base's validation figures go to
OUT/base_validation.json.

`report` gathers the runs into DOCDIR/sweep.json (every run: curve, final validation figures and items, KL to the
base per step, reward per step, seconds), applies the selection rule (`choose_lr` on the final validation sampled
accuracy, per method), and draws DOCDIR/val_vs_kl.png (final validation accuracy against the KL to the base, k3,
mean of the last 10 steps, every arm x lr a point) and DOCDIR/validation_curves.png.
"""
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

NAME = "dllm-countdown3-lr"
BASE = "countdown3-md"
ORDER = (5e-4, 2e-3, 1e-3, 2e-4)
"""The budget's run order (lr 5e-4 first: it checks the runs against the 30-batch rerun's)."""
VAL_ROWS = 256
SAMPLES = 4
KL_LAST = 10
"""The KL figure: the mean of `diag/kl_k3` (and k1) over the last 10 optimizer steps, as in the 30-batch table."""


def val_score(policy, rows, task):
    """Final validation figures and per-row items: greedy, 4 sampled answers per row, pass@4, the `+` shortcut share."""
    from mmrl.tiny_world.reasoning_rl import COUNTDOWN_MD_RL, held_out_items

    return held_out_items(policy, rows, task.metric, "masked_diffusion", COUNTDOWN_MD_RL["max_completion_length"],
                          SAMPLES, shortcut_op="+")


def sweep(out: Path, seeds: int, rollouts: int | None = None) -> None:
    from mmrl.config.train_config import load_config
    from mmrl.data.tasks import load_task
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world import register
    from mmrl.tiny_world.models import load_base_policy
    from mmrl.tiny_world.reasoning_rl import DLLM_LR_METHODS, arm_config, lr_label, run_slug
    from mmrl.training.trainer import Trainer

    register()
    task = load_task("countdown3")
    val_rows = task.validation[:VAL_ROWS]
    out.mkdir(parents=True, exist_ok=True)
    bv_file = out / "base_validation.json"
    if not bv_file.exists():
        summary, items = val_score(load_base_policy(BASE, progress=False), val_rows, task)
        bv_file.write_text(json.dumps({"summary": summary, "items": items}))
        print(f"base validation: {summary}", flush=True)
    for seed in range(seeds):
        for lr in ORDER:
            for arm in DLLM_LR_METHODS:
                label = lr_label(arm, lr)
                d = out / "runs" / run_slug(label, seed)
                done = d / "sweep_run.json"
                if done.exists():
                    continue
                if d.exists():
                    shutil.rmtree(d)  # an unfinished run of a stopped call
                policy = load_base_policy(BASE, progress=False)
                cfg = load_config(None, arm_config(NAME, label, seed=seed, out=d, rollouts=rollouts))
                trainer = Trainer(cfg, policy=policy, dataset=task.train, reward_funcs=cfg.reward_funcs,
                                  eval_dataset=val_rows, eval_metric=task.metric)
                t0 = time.perf_counter()
                trainer.train()
                secs = time.perf_counter() - t0
                t1 = time.perf_counter()
                summary, items = val_score(policy, val_rows, task)
                recs = read_metrics(d)

                def series(key):
                    return [(int(r["step"]), float(r[key])) for r in recs if r.get(key) is not None]

                res = {"label": label, "arm": arm, "lr": lr, "seed": seed, "steps": cfg.max_steps,
                       "train_seconds": secs, "val_seconds": time.perf_counter() - t1,
                       "val_final": summary, "val_items": items, "curve": series("eval/accuracy"),
                       "kl_k3": series("diag/kl_k3"), "kl_k1": series("diag/kl_k1"),
                       "reward": series("rewards/countdown3_accuracy/mean"),
                       "neg_weight_frac": series("diag/neg_weight_frac"), "masked_ce": series("dmpo/masked_ce")}
                done.write_text(json.dumps(res))
                k3 = [y for _, y in res["kl_k3"]][-KL_LAST:]
                print(f"{time.strftime('%H:%M:%S')} {label} seed {seed}: {secs:.0f} s train; validation "
                      f"sampled {100 * summary['sampled']:.1f} greedy {100 * summary['greedy']:.1f}; curve "
                      f"{[round(100 * y, 1) for _, y in res['curve']]}; KL k3 last {KL_LAST} {np.mean(k3):.3f}",
                      flush=True)


def short(lr: float) -> str:
    """"5e-4" for 0.0005 (the arm labels' spelling)."""
    from mmrl.tiny_world.reasoning_rl import lr_label

    return lr_label("", lr).split("lr ")[1]


def kl_figure(run: dict, key: str = "kl_k3") -> float:
    """The mean of the run's per-step KL estimate over its last `KL_LAST` steps."""
    ys = [y for _, y in run[key]][-KL_LAST:]
    return float(np.mean(ys)) if ys else float("nan")


def report(out: Path, doc: Path) -> None:
    from mmrl.tiny_world.reasoning_rl import DLLM_LR_METHODS, DLLM_LR_SWEEP, choose_lr
    from mmrl.tiny_world.report import markdown_table, plot_curves
    from mmrl.tiny_world.stats import difference_interval

    base = json.loads((out / "base_validation.json").read_text())
    runs = [json.loads(f.read_text()) for f in sorted((out / "runs").glob("*/sweep_run.json"))]
    if not runs:
        raise ValueError(f"no finished sweep run under {out / 'runs'}")
    doc.mkdir(parents=True, exist_ok=True)
    by = {(r["arm"], r["lr"], r["seed"]): r for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    choice: dict[str, dict] = {}
    rows = []
    for arm in DLLM_LR_METHODS:
        figs = {}
        for lr in DLLM_LR_SWEEP:
            rs = [by[(arm, lr, s)] for s in seeds if (arm, lr, s) in by]
            if not rs:
                continue
            figs[lr] = float(np.mean([r["val_final"]["sampled"] for r in rs]))
            gain = difference_interval([r["val_items"]["sampled"] for r in rs], base["items"]["sampled"])
            ggain = difference_interval([r["val_items"]["greedy"] for r in rs], base["items"]["greedy"])
            curve = np.mean([[y for _, y in r["curve"]] for r in rs], 0)
            rows.append([arm, short(lr), str(len(rs)),
                         f"{100 * figs[lr]:.1f} ({gain.fmt(signed=True)})",
                         f"{100 * np.mean([r['val_final']['greedy'] for r in rs]):.1f} ({ggain.fmt(signed=True)})",
                         f"{100 * np.mean([r['val_final']['pass@4'] for r in rs]):.1f}",
                         f"{100 * np.mean([r['val_final']['shortcut'] for r in rs]):.1f}",
                         " / ".join(f"{100 * y:.1f}" for y in curve),
                         f"{np.mean([kl_figure(r) for r in rs]):.3f} ({np.mean([kl_figure(r, 'kl_k1') for r in rs]):.3f})",
                         f"{np.mean([np.mean([y for _, y in r['reward']][:5]) for r in rs]):.3f} -> "
                         f"{np.mean([np.mean([y for _, y in r['reward']][-5:]) for r in rs]):.3f}",
                         f"{np.mean([r['train_seconds'] for r in rs]):.0f}"])
        if not figs:
            continue
        lr = choose_lr(figs, 5e-4)
        c = {"lr": lr, "figures": figs, "complete": sorted(figs) == sorted(DLLM_LR_SWEEP)}
        if lr != 5e-4 and 5e-4 in figs:  # the paired validation difference chosen - 5e-4 (a check, not the rule)
            c["chosen_minus_5e-4"] = {x: difference_interval(
                [by[(arm, lr, s)]["val_items"][x] for s in seeds if (arm, lr, s) in by],
                [by[(arm, 5e-4, s)]["val_items"][x] for s in seeds if (arm, 5e-4, s) in by]).to_dict()
                for x in ("sampled", "greedy")}
        choice[arm] = c
    head = ["arm", "lr", "seeds", "validation sampled, 4/row (gain over base [95% CI])", "validation greedy (gain [95% CI])",
            "validation pass@4", "shortcut share", "curve: sampled 1/row at steps 5..30", "KL to base k3 (k1), mean of last 10 steps",
            "train reward, first 5 -> last 5 steps", "train s"]
    bs = base["summary"]
    table = (markdown_table(head, rows) + f"\n\nBase `{BASE}` on the same 256 validation rows: sampled {100 * bs['sampled']:.1f}, "
             f"greedy {100 * bs['greedy']:.1f}, pass@4 {100 * bs['pass@4']:.1f}, shortcut {100 * bs['shortcut']:.1f}. Seeds {seeds}; "
             f"30 rollout batches of 16 x 8 per run. Chosen (highest validation sampled accuracy; ties to 5e-4): "
             + "; ".join(f"{a}: lr {short(c['lr'])}" + ("" if c["complete"] else " (sweep incomplete)") for a, c in choice.items()) + "\n")
    for a, c in choice.items():
        if "chosen_minus_5e-4" in c:
            table += "\n" + f"{a}: lr {short(c['lr'])} - lr 5e-4 on validation (paired over the 256 rows): " + "; ".join(
                f"{x} {100 * v['estimate']:+.1f} [{100 * v['low']:+.1f}, {100 * v['high']:+.1f}]" for x, v in c["chosen_minus_5e-4"].items()) + "\n"
    (doc / "table.md").write_text(table)
    (doc / "sweep.json").write_text(json.dumps({"base": BASE, "base_validation": base, "choice": choice, "runs": runs},
                                               default=str))
    print(table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    for arm, marker in zip(DLLM_LR_METHODS, ("o", "s")):
        pts = sorted((lr, kl_figure(r), 100 * r["val_final"]["sampled"]) for (a, lr, _), r in by.items() if a == arm)
        line, = ax.plot([p[1] for p in pts], [p[2] for p in pts], marker=marker, ls=":", label=arm)
        for lr, x, y in pts:
            ax.annotate(short(lr), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=line.get_color())
    ax.axhline(100 * bs["sampled"], ls="--", color="grey", label="base")
    if all(kl_figure(r) > 0 for r in runs):
        from matplotlib.ticker import NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # (the 2..9 x 10^k labels overlap)
    ax.set_xlabel("KL to the base (k3, per token, mean of last 10 steps)")
    ax.set_ylabel("validation accuracy, sampled (4 / row, %)")
    ax.set_title(f"{NAME}: lr swept (seed{'s' if len(seeds) > 1 else ''} {seeds}, 30 batches)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(doc / "val_vs_kl.png", dpi=90)
    plt.close(fig)
    plot_curves({r["label"]: [[tuple(p) for p in r["curve"]]] for r in sorted(runs, key=lambda r: (r["arm"], r["lr"]))},
                doc / "validation_curves.png", title=f"{NAME}: validation accuracy (one sampled answer per row)",
                ylabel="accuracy")


def test_stage(out: Path, labels: list[str], deadline: str, seeds: int = 5, name: str = NAME,
               first_projection: float | None = None) -> None:
    """Stage 2: `run_reasoning_comparison(name, out, ...)` on `labels`, one seed at a time (seed-major), each seed
    not yet saved for every label started only if the last run seed's wall time projects it to end by `deadline`
    (HH:MM UTC; the first is projected at `first_projection` seconds, default 8 minutes a run). Seeds already saved
    (e.g. the selection runs of `dllm_d1.py`) are kept, not timed."""
    import datetime as dt

    from mmrl.tiny_world.reasoning_rl import run_reasoning_comparison, run_slug
    from mmrl.tiny_world.report import cutoff_time

    end = dt.datetime.fromtimestamp(cutoff_time(deadline), dt.timezone.utc)  # past midnight: the coming night's
    per_seed = 8 * 60.0 * len(labels) if first_projection is None else first_projection
    for n in range(1, seeds + 1):
        saved = all((out / name / "runs" / run_slug(a, n - 1) / "result.json").exists() for a in labels)
        left = (end - dt.datetime.now(dt.timezone.utc)).total_seconds()
        if not saved and per_seed > left:
            print(f"{time.strftime('%H:%M:%S')} stage 2 stops before seed {n - 1}: projected {per_seed:.0f} s, "
                  f"{left:.0f} s left to {deadline}", flush=True)
            break
        t0 = time.perf_counter()
        run_reasoning_comparison(name, out, seeds=n, rollouts=30, arms=labels, baselines=False, resume=True,
                                 progress=True)
        if not saved:
            per_seed = time.perf_counter() - t0  # (the first seed's also scores the base: a margin)
        print(f"{time.strftime('%H:%M:%S')} stage 2 seed {n - 1} {'kept' if saved else 'done'} "
              f"({per_seed:.0f} s per seed projected)", flush=True)


def run_diagnostics(recs: list[dict], steps: int, rollouts: int = 30) -> dict:
    """A run's training diagnostics from its metrics.jsonl records (`read_metrics`): the KL to the base (k3, mean of
    the last `KL_LAST` optimizer steps), the training reward per rollout batch (buffer metrics repeat over a batch's
    F = steps / rollouts inner steps: the first step of each batch is taken) and its first / last 5 batches, the
    validation curve, the KL per rollout batch (mean over its inner steps), and the clip fraction (`clip_ratio/region_mean`: the share of tokens whose ratio is clipped),
    mean over all steps, over the last 5 batches, and per inner step 1..F. None where a run has no records (e.g.
    runs imported from a stored report, `reasoning_rl.import_stored_runs`)."""
    if not recs:
        return {"kl_k3_last10": None, "kl_per_batch": None, "reward_first5_last5": None, "reward_per_batch": None, "val_curve": [],
                "clip_mean": None, "clip_last5_batches": None, "clip_per_inner_step": None}
    f = max(1, steps // rollouts)
    by_step = {int(x["step"]): x for x in recs}
    rew = [by_step[s]["rewards/countdown3_accuracy/mean"] for s in sorted(by_step)
           if (s - 1) % f == 0 and "rewards/countdown3_accuracy/mean" in by_step[s]]
    clip = [(s, by_step[s]["clip_ratio/region_mean"]) for s in sorted(by_step) if "clip_ratio/region_mean" in by_step[s]]
    kl = [(s, by_step[s]["diag/kl_k3"]) for s in sorted(by_step) if "diag/kl_k3" in by_step[s]]
    out = {"kl_k3_last10": float(np.mean([y for _, y in kl][-KL_LAST:])),
           "kl_per_batch": [float(np.mean([y for s, y in kl if (s - 1) // f == b])) for b in range(rollouts)
                            if any((s - 1) // f == b for s, _ in kl)],
           "reward_per_batch": [float(y) for y in rew],
           "reward_first5_last5": [float(np.mean(rew[:5])), float(np.mean(rew[-5:]))],
           "val_curve": [(x["step"], x["eval/accuracy"]) for x in recs if "eval/accuracy" in x],
           "clip_mean": float(np.mean([c for _, c in clip])) if clip else None,
           "clip_last5_batches": float(np.mean([c for _, c in clip][-5 * f:])) if clip else None,
           "clip_per_inner_step": [float(np.mean([c for s, c in clip if (s - 1) % f == j])) for j in range(f)] if clip else None}
    return out


def test_report(doc: Path, pairs: list[str]) -> None:
    """Stage 2's table from saved runner folders: `pairs` are LABEL=DIR (DIR: a `run_reasoning_comparison` output
    `<out>/<name>` whose base.json and runs/<slug>-seed<k>/ hold the label's runs, under the label's own slug or
    under `slug=` given as LABEL=DIR:SLUG). Gains over the base and every difference of an earlier label minus a later
    one on the seeds both have (paired bootstrap over the 256 test rows and the seeds, `mmrl.tiny_world.stats`), with
    the runs' diagnostics (`run_diagnostics`; none for runs without training logs)."""
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.tiny_world.reasoning_rl import run_slug
    from mmrl.tiny_world.stats import difference_interval, gain_interval

    doc.mkdir(parents=True, exist_ok=True)
    base_items, arms = None, {}
    for p in pairs:
        label, where = p.split("=", 1)
        root, slug = (where.split(":", 1) + [None])[:2] if ":" in where else (where, None)
        root = Path(root)
        b = json.loads((root / "base.json").read_text())
        if base_items is None:
            base_items, before = b["before_items"], b["before"]
        elif b["before_items"] != base_items:
            raise ValueError(f"{root}: another base or other test rows than the first folder's")
        runs = {}
        for seed in range(5):
            d = root / "runs" / (f"{slug}-seed{seed}" if slug else run_slug(label, seed))
            if (d / "result.json").exists():
                r = json.loads((d / "result.json").read_text())
                r.update(run_diagnostics(read_metrics(d) if (d / "metrics.jsonl").exists() else [], int(r["steps"])))
                r["dir"] = str(d)
                runs[seed] = r
        arms[label] = runs
    out = {"base": before, "arms": {}, "difference": {}}
    lines = [f"base: greedy {100 * before['greedy']:.1f}, sampled {100 * before['sampled']:.1f}, pass@4 {100 * before['pass@4']:.1f}"]
    for label, runs in arms.items():
        seeds = sorted(runs)
        rs = [runs[s] for s in seeds]
        row = {"seeds": seeds, "dirs": [r["dir"] for r in rs]}
        for x in ("greedy", "sampled", "pass", "shortcut"):
            row[x] = {"after": float(np.mean([np.mean(r["items"][x]) for r in rs])),
                      "per_seed": [float(np.mean(r["items"][x])) for r in rs],
                      "gain": gain_interval([r["items"][x] for r in rs], base_items[x]).to_dict()}
        logged = [r for r in rs if r["val_curve"]]
        mean_of = lambda k: (np.mean([r[k] for r in logged], 0).tolist() if logged else None)  # noqa: E731
        row["kl_k3_last10"] = mean_of("kl_k3_last10")
        row["reward_first5_last5"] = mean_of("reward_first5_last5")
        row["val_curve_mean"] = (np.mean([[y for _, y in r["val_curve"]] for r in logged], 0).round(4).tolist()
                                 if logged else None)
        for k in ("clip_mean", "clip_last5_batches", "clip_per_inner_step"):
            row[k] = mean_of(k) if logged and logged[0][k] is not None else None
        row["per_run"] = {s: {k: runs[s][k] for k in ("kl_k3_last10", "kl_per_batch", "reward_per_batch", "val_curve", "clip_mean",
                                                       "clip_per_inner_step")} for s in seeds}
        row["seconds"] = [r["seconds"] for r in rs]
        row["items"] = {s: runs[s]["items"] for s in seeds}
        out["arms"][label] = row
        g = lambda x: row[x]["gain"]  # noqa: E731
        num = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
        lines.append(f"{label} ({len(seeds)} seeds {seeds}): greedy {100 * row['greedy']['after']:.1f} gain "
                     + "{:+.1f} [{:+.1f}, {:+.1f}]".format(*(100 * g("greedy")[k] for k in ("estimate", "low", "high")))
                     + f"; sampled {100 * row['sampled']['after']:.1f} gain "
                     + "{:+.1f} [{:+.1f}, {:+.1f}]".format(*(100 * g("sampled")[k] for k in ("estimate", "low", "high")))
                     + f"; pass@4 {100 * row['pass']['after']:.1f} gain "
                     + "{:+.1f} [{:+.1f}, {:+.1f}]".format(*(100 * g("pass")[k] for k in ("estimate", "low", "high")))
                     + f"; shortcut {100 * row['shortcut']['after']:.1f}; KL k3 last 10 {num(row['kl_k3_last10'])}; reward "
                     + ("-" if row["reward_first5_last5"] is None else
                        f"{row['reward_first5_last5'][0]:.3f} -> {row['reward_first5_last5'][1]:.3f}")
                     + f"; clip fraction mean {num(row['clip_mean'], '{:.4f}')}; validation curve "
                     f"{row['val_curve_mean']}; per seed greedy {np.round(100 * np.array(row['greedy']['per_seed']), 1).tolist()}"
                     f" sampled {np.round(100 * np.array(row['sampled']['per_seed']), 1).tolist()}; s {np.round(row['seconds']).tolist()}")
    labels = list(arms)
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            common = sorted(set(arms[a]) & set(arms[b]))
            if not common:
                continue
            d = {"seeds": common}
            for x in ("greedy", "sampled", "pass", "shortcut"):
                d[x] = difference_interval([arms[a][s]["items"][x] for s in common],
                                           [arms[b][s]["items"][x] for s in common]).to_dict()
            out["difference"][f"{a} - {b}"] = d
            lines.append(f"{a} - {b} (seeds {common}): " + "; ".join(
                f"{x} " + "{:+.1f} [{:+.1f}, {:+.1f}]".format(*(100 * d[x][k] for k in ("estimate", "low", "high")))
                + (" (claimed)" if d[x]["excludes_zero"] else "") for x in ("greedy", "sampled", "pass", "shortcut")))
    (doc / "report.json").write_text(json.dumps(out, default=str))
    (doc / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("sweep", "report", "test", "test-report"):
        raise SystemExit(__doc__)
    if argv[0] == "sweep":
        n = int(argv[argv.index("--seeds") + 1]) if "--seeds" in argv else 1
        # --rollouts N: a plumbing check only (the budget's runs use the comparison's 30)
        sweep(Path(argv[1]), n, int(argv[argv.index("--rollouts") + 1]) if "--rollouts" in argv else None)
    elif argv[0] == "report":
        report(Path(argv[1]), Path(argv[2]))
    elif argv[0] == "test":
        i = argv.index("--deadline")
        test_stage(Path(argv[1]), [a for j, a in enumerate(argv[2:], 2) if j not in (i, i + 1)], argv[i + 1])
    else:
        test_report(Path(argv[1]), argv[2:])
