"""Study (docs/RESULTS.md, "The Sudoku base re-examined (issue 24 item 1)"): the sudoku4 base against pre-training
compute, masked diffusion (the shipped LLaDA recipe, and with MGDM's token reweighting) against the causal LM of the
same size on the same puzzles, scored on the 256 validation puzzles (cell accuracy and whole-puzzle solve rate).

    python scripts/studies/sudoku_base_curve.py OUT_DIR [--steps 150 300 600 1200] [--arms md md-reweight ar]
    python scripts/studies/sudoku_base_curve.py OUT_DIR --report-only      # results.json, curves.png, the table
    python scripts/studies/sudoku_base_curve.py OUT_DIR --report-only --diagnose   # + diagnostics.json (re-decodes)

Every (arm, steps) point is its own build (`pretrain_variant.run`: the `sudoku4` spec, 1-10 blanks, batch 64,
lr 2e-3, its own warm-up and decay over `steps`, one torch thread, seed 0), appended to OUT_DIR/runs.jsonl as it
finishes (a rerun skips the points already there); the points run steps-major (every arm at 150, then at 300, ...)
so that a cut-off leaves every arm with the same points. One seed: the intervals are paired bootstraps over the
256 puzzles (`mmrl.tiny_world.stats`), the test-set sampling error only.
"""
import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pretrain_variant import run  # noqa: E402  (the study's one build-and-score function)

logger = logging.getLogger("sudoku_base_curve")
ARMS = {
    "md": dict(family="masked_diffusion", recipe={}),
    "md-reweight": dict(family="masked_diffusion", recipe={"token_reweight": [0.25, 2]}),
    "ar": dict(family="causal_lm", recipe={}),
}
"""The arms: the shipped LLaDA recipe (eq. 5, 1/t, divided by the length), the same with MGDM's token reweighting
(alpha 0.25, gamma 2, the value countdown3-md's study used), and the causal LM on the puzzles as prompts."""
BLANKS = (1, 10)
"""Blank cells of the pre-training puzzles (the shipped `sudoku4` filter)."""
LABELS = {"md": "masked diffusion (sudoku4 recipe)", "md-reweight": "masked diffusion + MGDM token reweighting",
          "ar": "causal LM, puzzle as prompt"}


def arm_of(rec: dict) -> str:
    o = rec["opts"]
    return next(a for a, v in ARMS.items() if v["family"] == o["family"] and v["recipe"] == o["recipe"])


def load(out: Path) -> list[dict]:
    f = out / "runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def build(out: Path, arms: list[str], steps: list[int]) -> None:
    done = {(arm_of(r), r["opts"]["steps"]) for r in load(out)}
    for s in steps:  # steps-major: a cut-off leaves every arm with the same points
        for a in arms:
            if (a, s) in done:
                continue
            rec = run(s, *BLANKS, family=ARMS[a]["family"], recipe=ARMS[a]["recipe"], save=str(out / "weights" / f"{a}-{s}"))
            rec["arm"] = a
            with open(out / "runs.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            logger.info("%s %d: cpu %.0f s, %s", a, s, rec["build_cpu_s"],
                        ", ".join(f"{k} {v['cell_acc']:.3f} / {v['solved']:.3f}" for k, v in rec["decodes"].items()))


def report(out: Path) -> dict:
    """results.json (per-puzzle scores, intervals, paired differences), curves.png, and the markdown table."""
    import numpy as np

    from mmrl.tiny_world.stats import difference_interval, mean_interval

    recs = {(arm_of(r), r["opts"]["steps"]): r for r in load(out)}
    if not recs:
        raise SystemExit(f"no runs in {out / 'runs.jsonl'}")
    puzzles = next(iter(recs.values()))["puzzles"]
    if any(r["puzzles"] != puzzles for r in recs.values()):
        raise SystemExit("runs scored different puzzles; they cannot be paired")

    def solved(scores):
        return (np.asarray(scores) == 1.0).astype(float)

    points, diffs = [], []
    for (a, s), r in sorted(recs.items(), key=lambda kv: (list(ARMS).index(kv[0][0]), kv[0][1])):
        for d, v in r["decodes"].items():
            points.append({"arm": a, "steps": s, "decode": d, "cell_acc": mean_interval(v["scores"]).to_dict(),
                           "solved": mean_interval(solved(v["scores"])).to_dict(), "build_cpu_s": r["build_cpu_s"],
                           "build_wall_s": r["build_wall_s"], "weights_sha256_12": r["weights_sha256_12"],
                           "final_loss": r["final_loss"], "tokens_per_row": r["tokens_per_row"],
                           "parameters": r["parameters"]})
    pairs = [("md", "low_confidence", "ar", "greedy"), ("md", "easy_first", "ar", "greedy"),
             ("md-reweight", "low_confidence", "ar", "greedy"), ("md-reweight", "easy_first", "ar", "greedy"),
             ("md", "easy_first", "md", "low_confidence"), ("md-reweight", "low_confidence", "md", "low_confidence"),
             ("md-reweight", "easy_first", "md", "easy_first")]
    for s in sorted({s for _, s in recs}):
        for a, da, b, db in pairs:
            if (a, s) in recs and (b, s) in recs:
                x, y = recs[(a, s)]["decodes"][da]["scores"], recs[(b, s)]["decodes"][db]["scores"]
                diffs.append({"steps": s, "a": f"{a} {da}", "b": f"{b} {db}",
                              "cell_acc": difference_interval(x, y).to_dict(),
                              "solved": difference_interval(solved(x), solved(y)).to_dict()})
    for s in sorted({s for _, s in recs}):  # about equal build CPU: a causal row is 44 positions, a diffusion row 26
        if ("md", s) in recs and ("ar", s // 2) in recs:
            x, y = recs[("md", s)]["decodes"]["low_confidence"]["scores"], recs[("ar", s // 2)]["decodes"]["greedy"]["scores"]
            diffs.append({"steps": f"{s} vs {s // 2} (about equal CPU)", "a": "md low_confidence", "b": "ar greedy",
                          "cell_acc": difference_interval(x, y).to_dict(), "solved": difference_interval(solved(x), solved(y)).to_dict()})
    result = {"split": "validation", "puzzles": puzzles, "points": points, "differences": diffs,
              "scores": {f"{a}/{s}/{d}": v["scores"] for (a, s), r in recs.items() for d, v in r["decodes"].items()},
              "completions_first8": {f"{a}/{s}/{d}": v["completions"] for (a, s), r in recs.items() for d, v in r["decodes"].items()}}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    plot(points, out / "curves.png")
    logger.info("\n%s", table(points, diffs))
    return result


def diagnose(out: Path) -> dict:
    """Where the errors are, from the saved weights of every point: the accuracy of a blank cell by its ordinal
    among the puzzle's blanks in reading order (the causal LM writes them in that order), and by the puzzle's blank
    count; the causal LM's share of given cells it does not copy (the reward does not read them)."""
    from mmrl.models import adapter_class
    from mmrl.rewards.sudoku import sudoku_digits
    from mmrl.tiny_world.tasks import tagged
    from pretrain_variant import DECODES, eval_rows

    diag = {}
    for r in load(out):
        a, s = arm_of(r), r["opts"]["steps"]
        fam = ARMS[a]["family"]
        pol = adapter_class(fam).from_pretrained(out / "weights" / f"{a}-{s}")
        rows = eval_rows(fam, "validation")
        name, gen = next(iter(DECODES[fam].items()))  # the family's first decoding (low-confidence / greedy)
        comps = pol.sample([x["prompt"] for x in rows], 1, seeds=list(range(len(rows))), **gen).completions
        by_ord, by_blanks, givens_changed, givens = {}, {}, 0, 0
        for x, c in zip(rows, comps):
            d = ((sudoku_digits(tagged(c)) or "") + "0" * 16)[:16]
            blanks = [i for i, ch in enumerate(x["puzzle"]) if ch == "0"]
            for k, i in enumerate(blanks):
                by_ord.setdefault(k + 1, []).append(d[i] == x["solution"][i])
                by_blanks.setdefault(len(blanks), []).append(d[i] == x["solution"][i])
            givens += 16 - len(blanks)
            givens_changed += sum(d[i] != ch for i, ch in enumerate(x["puzzle"]) if ch != "0")
        diag[f"{a}/{s}/{name}"] = {
            "blank_ordinal_acc": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_ord.items())},
            "blank_count_cell_acc": {k: round(sum(v) / len(v), 4) for k, v in sorted(by_blanks.items())},
            "givens_changed": round(givens_changed / givens, 4)}
        logger.info("%s/%s: %s", a, s, diag[f"{a}/{s}/{name}"])
    (out / "diagnostics.json").write_text(json.dumps(diag, indent=1))
    return diag


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    panels = [("cell_acc", "cell accuracy", "steps"), ("solved", "whole-puzzle solve rate", "steps"),
              ("cell_acc", "cell accuracy", "build_cpu_s")]
    for ax, (key, title, x) in zip(axes, panels):
        for (a, d) in dict.fromkeys((p["arm"], p["decode"]) for p in points):
            pts = sorted((p[x], p[key]) for p in points if p["arm"] == a and p["decode"] == d)
            xs = [s for s, _ in pts]
            ax.errorbar(xs, [100 * i["estimate"] for _, i in pts],
                        yerr=[[100 * (i["estimate"] - i["low"]) for _, i in pts], [100 * (i["high"] - i["estimate"]) for _, i in pts]],
                        marker="o", capsize=3, ls="-" if d != "easy_first" else "--", label=f"{LABELS[a]}, {d}")
        ax.set_xscale("log", base=2)
        if x == "steps":
            ticks = sorted({p["steps"] for p in points})
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("pre-training steps (batch 64), each its own schedule" if x == "steps"
                      else "build CPU seconds (one core, loaded machine)")
        ax.set_ylabel(f"validation {title} (%)")
        ax.set_title(f"sudoku4, 256 validation puzzles: {title}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(points: list[dict], diffs: list[dict]) -> str:
    lines = ["| arm | decoding | steps | cell acc. (%) | solved (%) | build CPU s | weights |", "|---|---|---|---|---|---|---|"]
    for p in points:
        ci, sv = p["cell_acc"], p["solved"]
        lines.append(f"| {LABELS[p['arm']]} | {p['decode']} | {p['steps']} | {100 * ci['estimate']:.1f} [{100 * ci['low']:.1f}, "
                     f"{100 * ci['high']:.1f}] | {100 * sv['estimate']:.1f} [{100 * sv['low']:.1f}, {100 * sv['high']:.1f}] | "
                     f"{p['build_cpu_s']:.0f} | `{p['weights_sha256_12']}` |")
    lines += ["", "| steps | a - b | cell acc. (points) | solved (points) |", "|---|---|---|---|"]
    for d in diffs:
        c, s = d["cell_acc"], d["solved"]
        lines.append(f"| {d['steps']} | {d['a']} - {d['b']} | {100 * c['estimate']:+.1f} [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] | "
                     f"{100 * s['estimate']:+.1f} [{100 * s['low']:+.1f}, {100 * s['high']:+.1f}] |")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, nargs="+", default=[150, 300, 600, 1200])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--diagnose", action="store_true", help="also decode the saved weights again: errors by blank ordinal and count")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        build(a.out, a.arms, a.steps)
    report(a.out)
    if a.diagnose:
        diagnose(a.out)


if __name__ == "__main__":
    main()
