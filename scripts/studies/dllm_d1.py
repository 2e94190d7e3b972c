"""Study (docs/RESULTS.md, "diffu-GRPO with d1's settings on the masked-diffusion base (`dllm-countdown3-d1`)"):
issue 24 item 2's diffu-GRPO with d1's settings on `countdown3-md`, its lr chosen on validation, then test once.

    python scripts/studies/dllm_d1.py choose OUT                      # validation only: choice.json
    python scripts/studies/dllm_d1.py run OUT --deadline HH:MM [--wait PID]   # choose, then the chosen arm's seeds
    python scripts/studies/dllm_d1.py plots DOCDIR REF_REPORT [ARM...]   # curves against rollout batches

`choose` reads the trainer's validation curve (`eval/accuracy`: one sampled answer per row on the first 256
validation rows, every 5 rollout batches) of each candidate's selection runs (seed 0 of both lrs of
`DLLM_D1_LRS`) under OUT/dllm-countdown3-d1/runs/, takes the curve's last point (step 360), the mean over the
selection seeds, and applies `choose_lr` (the highest; a tie goes to the shared recipe's 5e-4). It writes
OUT/choice.json and reads no test figure (the runs' result.json are not opened).

`run` waits for process PID (the job that runs the selection runs) until both selection runs are saved, stops it
(its next run, unfinished, is discarded by the runner), chooses, then runs the chosen arm's further seeds with
`dllm_lr_sweep.test_stage` (`run_reasoning_comparison(..., resume=True)`, seed-major, each seed started only if
projected to end by the deadline).

`plots` draws, against rollout batches (so mu = 12 and one step per batch line up), the validation curve, the
training reward and the KL to the base (k3, mean over each batch's inner steps) of every arm in DOCDIR/report.json
(`dllm_lr_sweep.py test-report`) that has training logs, beside the seed-mean curves of ARM... from REF_REPORT (the
30-batch table's `docs/results/dllm/rl30/report.json`, `dllm_rl_report.py`), and the clip fraction per inner step
1..12 (`clip_ratio/region_mean`, mean over the run), into DOCDIR/validation.png, reward.png, kl.png, clip.png.
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

NAME = "dllm-countdown3-d1"
SELECTION_SEEDS = (0,)
"""The seeds the choice is made on (the budget in docs/RESULTS.md: one seed, from the first run's timing)."""


def validation_last(run_dir: Path) -> tuple[int, float]:
    """(step, eval/accuracy) of the last validation point in a run's metrics.jsonl."""
    from mmrl.reporting.metrics_log import read_metrics

    pts = [(int(r["step"]), float(r["eval/accuracy"])) for r in read_metrics(run_dir) if r.get("eval/accuracy") is not None]
    if not pts:
        raise ValueError(f"{run_dir}: no validation point (eval/accuracy) in metrics.jsonl")
    return pts[-1]


def selection_done(root: Path) -> bool:
    from mmrl.tiny_world.reasoning_rl import DLLM_D1_LRS, d1_md_label, run_slug

    return all((root / "runs" / run_slug(d1_md_label(lr), s) / "result.json").exists()
               for lr in DLLM_D1_LRS for s in SELECTION_SEEDS)


def choose(out: Path) -> dict:
    from mmrl.tiny_world.reasoning_rl import DLLM_D1_LRS, choose_lr, d1_md_label, run_slug

    root = out / NAME
    figs, per_run = {}, {}
    for lr, v in DLLM_D1_LRS.items():
        pts = [validation_last(root / "runs" / run_slug(d1_md_label(lr), s)) for s in SELECTION_SEEDS]
        per_run[lr] = {"seeds": list(SELECTION_SEEDS), "last_points": pts}
        figs[v] = sum(y for _, y in pts) / len(pts)
    lr_v = choose_lr(figs, DLLM_D1_LRS["5e-4"])
    lr = next(k for k, v in DLLM_D1_LRS.items() if v == lr_v)
    choice = {"chosen": d1_md_label(lr), "lr": lr, "figures": {k: figs[v] for k, v in DLLM_D1_LRS.items()},
              "runs": per_run, "rule": "highest mean of the last validation point (eval/accuracy) over the selection "
                                       "seeds; a tie goes to 5e-4", "time": time.strftime("%H:%M:%S", time.gmtime())}
    (out / "choice.json").write_text(json.dumps(choice, indent=2))
    print(json.dumps(choice), flush=True)
    return choice


def run(out: Path, deadline: str, wait: int | None) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dllm_lr_sweep import test_stage

    root = out / NAME
    while not selection_done(root):
        if wait is not None:
            try:
                os.kill(wait, 0)
            except ProcessLookupError:
                if not selection_done(root):
                    raise SystemExit(f"process {wait} ended before the selection runs were saved")
                break
        time.sleep(10)
    if wait is not None:
        try:
            os.kill(wait, signal.SIGTERM)  # the selection job's next run (seed 1) is not in the budget
        except ProcessLookupError:
            pass
        time.sleep(5)
    c = choose(out)
    # the projection of the first further run: the selection runs' mean wall time (base.json written before the first)
    from mmrl.tiny_world.reasoning_rl import DLLM_D1_LRS, d1_md_label, run_slug

    ends = [(root / "runs" / run_slug(d1_md_label(lr), s) / "result.json").stat().st_mtime
            for lr in DLLM_D1_LRS for s in SELECTION_SEEDS]
    per_run = (max(ends) - (root / "base.json").stat().st_mtime) / len(ends)
    test_stage(out, [c["chosen"]], deadline, name=NAME, first_projection=per_run)


def plots(doc: Path, ref_report: Path, ref_arms: list[str]) -> None:
    from mmrl.tiny_world.report import plot_curves

    rep = json.loads((doc / "report.json").read_text())
    ref_all = json.loads(ref_report.read_text())
    ref = ref_all["arms"]
    logged = {a: row for a, row in rep["arms"].items() if row.get("val_curve_mean")}
    f_of = lambda row: max(1, round(max(s for s, _ in next(iter(row["per_run"].values()))["val_curve"]) / 30))  # noqa: E731
    series = {"validation": {}, "reward": {}, "kl": {}}
    for a, row in logged.items():
        f = f_of(row)
        runs = list(row["per_run"].values())
        series["validation"][a] = [[(s / f, y) for s, y in r["val_curve"]] for r in runs]
        series["reward"][a] = [list(enumerate(r["reward_per_batch"], 1)) for r in runs]
        series["kl"][a] = [list(enumerate(r["kl_per_batch"], 1)) for r in runs]
    for a in ref_arms:
        r = ref[a]
        label = f"{a} (30-batch table, mean of {len(r['seeds'])} seeds)"
        series["validation"][label] = [list(zip(r["val_steps"], r["val_per_eval"]))]
        series["reward"][label] = [list(enumerate(r["reward_per_step"], 1))]
        series["kl"][label] = [list(enumerate(r["kl_per_step"], 1))]
    base_val = (ref_all.get("base_validation") or {}).get("sampled")  # the base on the same 256 validation rows
    plot_curves(series["validation"], doc / "validation.png", xlabel="rollout batch", ylabel="accuracy",
                title="dllm-countdown3-d1: validation (one sampled answer per row, 256 rows)", baseline=base_val)
    plot_curves(series["reward"], doc / "reward.png", xlabel="rollout batch", ylabel="reward",
                title="training reward (accuracy of the rollouts) per rollout batch")
    plot_curves(series["kl"], doc / "kl.png", xlabel="rollout batch", ylabel="KL (k3, per token)",
                title="KL to the base, mean over each batch's optimizer steps")
    plot_curves({a: [list(enumerate(r["clip_per_inner_step"], 1)) for r in row["per_run"].values()]
                 for a, row in logged.items() if row.get("clip_per_inner_step")}, doc / "clip.png",
                xlabel="inner step within a rollout batch (1..mu)", ylabel="share of tokens clipped",
                title="clip fraction (clip_ratio/region_mean) by inner step, mean over the run")


if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("choose", "run", "plots"):
        raise SystemExit(__doc__)
    if argv[0] == "choose":
        choose(Path(argv[1]))
    elif argv[0] == "plots":
        plots(Path(argv[1]), Path(argv[2]), argv[3:])
    else:
        run(Path(argv[1]), argv[argv.index("--deadline") + 1],
            int(argv[argv.index("--wait") + 1]) if "--wait" in argv else None)
