"""Scoreboard: for every comparison report run under the evaluation protocol (docs/results/**/results.json with
per-run, per-item test scores), does any RL arm beat the baselines an RL claim must beat? One row per (report, RL
arm): its gain over the base, arm - RFT and arm - clean SFT with the paired-bootstrap 95% intervals the runners use
(`mmrl.tiny_world.stats`, same pairing, same seed), best-of-n from the base where stored, and a verdict against RFT.
Every recomputed interval the report also stores is checked against it at the printed precision.

    python scripts/studies/scoreboard.py [--results docs/results] [--out docs/results/scoreboard.md]

One reader per report format, on the score its table.md leads with: countdown (`reasoning_rl`: sampled accuracy),
geneval (`shapes_rl`, also behind `masked_image_rl`: GenEval overall, prompts grouped by task), sudoku (`replicate`:
test cell accuracy), vqa (`vqa_rl`: overall test accuracy).
"""
from __future__ import annotations

import argparse
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from mmrl.tiny_world import reasoning_rl, replicate, shapes_rl, vqa_rl
from mmrl.tiny_world.stats import Interval, difference_interval, gain_interval, point_estimate

logger = logging.getLogger("scoreboard")

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
OUT = RESULTS / "scoreboard.md"
COMMAND = "python scripts/studies/scoreboard.py"
DIGEST_CHARS = 12
SUPERSEDED = "SUPERSEDED"
"""A file of this name beside a results.json leaves that report out: its first line names the report that holds the
same runs and more (e.g. a 3-seed report after its 5-seed re-run), so no run is counted twice."""
GAIN, RFT, SFT = "gain", "RFT", "clean SFT"
"""The interval columns: the gain over the base, arm - RFT, arm - clean SFT."""
BASELINE_LABELS = {RFT: (reasoning_rl.RFT_ARM, replicate.RFT_ROW, shapes_rl.RFT_ARM, vqa_rl.RFT_ARM),
                   SFT: (reasoning_rl.CONTINUED_SFT_ARM, replicate.CLEAN_SFT_ROW, vqa_rl.SFT_ARM)}
"""The runners' names of the baseline rows stored among `arms` (anything else there is an RL arm)."""
REFERENCE_LABEL = "clean SFT"
"""reasoning_rl's name of its separately pre-trained clean reference in `differences` ("<arm> - clean SFT")."""
SCORE_NAMES = {"countdown": "sampled acc.", "geneval": "GenEval overall (task-weighted)",
               "sudoku": "test cell accuracy", "vqa": "test accuracy, overall (greedy)"}
BEATS, LEVEL, BELOW, NO_RFT = "beats RFT", "level with RFT", "below RFT", "no RFT row"
ABOVE_RFT_NO_GAIN = "above RFT, no gain over the base"
"""Above RFT only because RFT loses: the arm itself is not claimed above its base."""


@dataclass
class Report:
    """One results.json reduced to what the scoreboard needs; matrices are [seeds, items] of the headline score."""

    folder: str
    family: str
    base: str
    digest: str
    score: str
    base_items: list[float]
    rl: dict[str, list[list[float]]]
    baselines: dict[str, tuple[str, list[list[float]]]]  # column -> (its row's name in the report, matrix)
    groups: list[str] | None = None
    best_of_n: tuple[int, float, float] | None = None  # n, score, score - base
    stored: dict[tuple[str, str], dict] = field(default_factory=dict)  # (arm, column) -> the report's interval
    answers: dict[str, float] = field(default_factory=dict)  # row -> answers sampled per run (mean), where stored
    notes: list[str] = field(default_factory=list)


@dataclass
class Row:
    report: Report
    arm: str
    intervals: dict[str, Interval]  # column -> recomputed interval

    def above(self, column: str) -> bool:
        """Whether the arm is claimed above that baseline: the interval of the difference excludes 0, above it."""
        iv = self.intervals.get(column)
        return iv is not None and iv.excludes_zero and iv.low > 0

    @property
    def verdict(self) -> str:
        """Against RFT, claimed only where the interval of arm - RFT excludes 0."""
        iv = self.intervals.get(RFT)
        if iv is None:
            return NO_RFT
        if not iv.excludes_zero:
            return LEVEL
        if not self.above(RFT):
            return BELOW
        return BEATS if self.above(GAIN) else ABOVE_RFT_NO_GAIN


def family_of(res: dict) -> str | None:
    if "base_measures" in res:
        return "vqa"
    if "base_items" in res:
        return "sudoku"
    if isinstance(res.get("before_items"), dict):
        return "countdown"
    if isinstance(res.get("before_items"), list) and "test_tags" in res:
        return "geneval"
    return None


def has_item_scores(res: dict) -> bool:
    """Whether every arm is a list of per-run rows, each with per-item test scores."""
    arms = res.get("arms") or {}
    return bool(arms) and all(isinstance(runs, list) and runs and all(r.get("items") for r in runs)
                              for runs in arms.values())


def exclusion(res: dict) -> str | None:
    """Why a results.json is left out of the scoreboard (None: it is included)."""
    if "arms" not in res:
        return "no trained arms (not a comparison of RL runs)"
    if not has_item_scores(res):
        if "protocol" not in res and not (res.get("before_items") or res.get("base_items")):
            return "written before the evaluation protocol: per-arm means only, no per-item scores"
        return "arms not stored as per-run rows with per-item scores (a study's own format)"
    if family_of(res) is None:
        return "report format not recognised"
    if res.get("smoke"):
        return "smoke run"
    if res.get("split") == "validation":
        return "scored on the validation split (a learning-rate choice), not the test split"
    baselines = {x for labels in BASELINE_LABELS.values() for x in labels}
    if not set(res["arms"]) - baselines:
        return "no RL arm"
    if not (set(res["arms"]) & baselines or res.get("reference") or res.get("best_of_n")):
        return "no baseline row (no RFT, clean SFT or best-of-n)"
    return None


def base_name(res: dict) -> str:
    """The base model's name (a Sudoku report's "base" is its score: the name is in the configs)."""
    if isinstance(res.get("base"), str):
        return res["base"]
    if res.get("base_model"):
        return res["base_model"]
    return next(iter(res["configs"].values()))["model_name_or_path"].split(":", 1)[-1]


def build_digest(res: dict) -> str:
    digest = res.get("base_weights_sha256") or (res.get("base_measures") or {}).get("weights_sha256")
    return digest[:DIGEST_CHARS] if digest and digest != "unknown" else "-"


def split_arms(res: dict, items) -> tuple[dict, dict]:
    """(RL arms, baselines) of `arms` as matrices (`items(run)`: a run's headline per-item scores)."""
    rl, baselines = {}, {}
    for arm, runs in res["arms"].items():
        column = next((c for c, labels in BASELINE_LABELS.items() if arm in labels), None)
        if column is None:
            rl[arm] = [items(r) for r in runs]
        else:
            baselines[column] = (arm, [items(r) for r in runs])
    return rl, baselines


def store(rep: Report, res: dict, gains: dict, vs_sft: dict | None = None) -> None:
    """The report's own intervals of each arm: its gain (`gains`: arm -> interval), arm - RFT and arm - clean SFT
    from `differences` ("<arm> - <row>"), or from `vs_sft` (arm -> interval) where a runner keeps them there."""
    diffs = res.get("differences", {})
    for arm in rep.rl:
        found = {GAIN: gains.get(arm)}
        for column, (label, _) in rep.baselines.items():
            found[column] = vs_sft.get(arm) if column == SFT and vs_sft is not None else diffs.get(f"{arm} - {label}")
        rep.stored.update({(arm, c): v for c, v in found.items() if v})


def read_countdown(res: dict, rep: Report) -> None:
    rep.score = (re.search(r"sampled acc\. \(T=1, \d+ per row\)", res.get("table", "")) or [rep.score])[0]
    rep.base_items = res["before_items"]["sampled"]
    rep.rl, rep.baselines = split_arms(res, lambda r: r["items"]["sampled"])
    rep.answers = {a: sum(r["rollouts"] for r in runs) / len(runs) for a, runs in res["arms"].items()
                   if runs and all("rollouts" in r for r in runs)}  # dynamic sampling draws more than its batches
    ref = res.get("reference")
    if ref:  # the base's clean twin pre-trained at the same compute (one model: one row)
        rep.baselines[SFT] = (REFERENCE_LABEL, [ref["items"]["sampled"]])
        if ref.get("model") == rep.base:
            rep.notes.append("the clean SFT reference is the base itself: arm - clean SFT equals the gain")
    best = res.get("best_of_n")
    if best:
        value = point_estimate([best["items"]["best"]])
        rep.best_of_n = (best["n"], value, value - point_estimate([rep.base_items]))
    store(rep, res, {a: ivs["gain"] for a, ivs in res.get("arm_intervals", {}).items()})


def read_geneval(res: dict, rep: Report) -> None:
    rep.base_items, rep.groups = res["before_items"], res["test_tags"]
    rep.rl, rep.baselines = split_arms(res, lambda r: r["items"])
    ref = res.get("reference")
    if ref:  # the base pre-trained on clean captions at the same compute
        rep.baselines[SFT] = (ref["model"], [ref["items"]])
        if ref["model"] == rep.base:
            rep.notes.append("the clean-caption model is the base itself: arm - clean SFT equals the gain")
    rows = res.get("rows", {})
    best = next((k for k in rows if k.startswith("best-of-")), None)
    if best:
        n = int(re.match(r"best-of-(\d+)", best)[1])
        rep.best_of_n = (n, rows[best]["overall"]["estimate"], rows[best]["gain"]["estimate"])
    store(rep, res, {a: r.get("gain") for a, r in rows.items()}, {a: r.get("vs clean base") for a, r in rows.items()})


def read_sudoku(res: dict, rep: Report) -> None:
    rep.base_items = res["base_items"]
    rep.rl, rep.baselines = split_arms(res, lambda r: r["items"])
    best = res.get("best_of_n")
    if best:
        value = point_estimate([best["items"]["best"]])
        rep.best_of_n = (res["n_best"], value, value - point_estimate([rep.base_items]))
    store(rep, res, res.get("gains", {}))


def read_vqa(res: dict, rep: Report) -> None:
    rep.base_items = res["base_measures"]["test_items"]
    rep.rl, rep.baselines = split_arms(res, lambda r: r["items"])
    store(rep, res, res.get("gains", {}))


READERS = {"countdown": read_countdown, "geneval": read_geneval, "sudoku": read_sudoku, "vqa": read_vqa}


def read_report(res: dict, folder: str) -> Report:
    """An included results.json (`exclusion` None) as a `Report`, by its family's reader."""
    family = family_of(res)
    rep = Report(folder=folder, family=family, base=base_name(res), digest=build_digest(res),
                 score=SCORE_NAMES[family], base_items=[], rl={}, baselines={})
    READERS[family](res, rep)
    return rep


def collect(results: Path) -> tuple[list[Report], list[tuple[str, str]]]:
    """(the included reports, [(folder, why left out)]) of every results.json under `results`."""
    reports, left_out = [], []
    for path in sorted(results.rglob("results.json")):
        folder = path.parent.relative_to(results).as_posix()
        res = json.loads(path.read_text())
        marker = path.parent / SUPERSEDED
        why = f"superseded by {marker.read_text().strip().splitlines()[0]}" if marker.is_file() else exclusion(res)
        if why:
            left_out.append((folder, why))
            logger.info("left out %s: %s", folder, why)
        else:
            reports.append(read_report(res, folder))
            logger.info("read %s (%s)", folder, reports[-1].family)
    return reports, left_out


def score_arms(rep: Report) -> list[Row]:
    """The gain and the differences to each baseline of every RL arm, paired as the runner pairs them."""
    rows = []
    for arm, m in rep.rl.items():
        ivs = {GAIN: gain_interval(m, rep.base_items, groups=rep.groups)}
        ivs.update({c: difference_interval(m, b, groups=rep.groups) for c, (_, b) in rep.baselines.items()})
        rows.append(Row(rep, arm, ivs))
    return rows


def stored_checks(rows: list[Row]) -> list[tuple[str, str, str, str, str]]:
    """(folder, arm, column, recomputed, stored) for every interval the report also stores, printed as its table
    prints it (points, one decimal)."""
    out = []
    for row in rows:
        for column, iv in row.intervals.items():
            theirs = row.report.stored.get((row.arm, column))
            if theirs:
                stored = Interval(**{k: v for k, v in theirs.items() if k != "excludes_zero"})
                out.append((row.report.folder, row.arm, column, iv.fmt(signed=True), stored.fmt(signed=True)))
    return out


def render(rows: list[Row], left_out: list[tuple[str, str]], checks: list[tuple]) -> str:
    count = lambda pred: sum(1 for r in rows if pred(r))  # noqa: E731
    both = [r for r in rows if r.verdict == BEATS and r.above(SFT)]
    lines = [
        "# Scoreboard: RL arms against the baselines an RL claim must beat", "",
        "One row per RL arm of every comparison report run under the evaluation protocol (docs/results/**/results.json "
        "with per-run, per-item test scores and at least one baseline row). The baselines: RFT (rejection-sampling "
        "fine-tuning at the same rollouts, same seeds), clean SFT (the same base trained on clean data at the same "
        "compute: the clean-caption / clean-answer twin, or continued SFT on true answers) and best-of-n from the base "
        "(n samples per item, the best by the reward; its score, in parentheses its gain over the base). Every figure "
        "is in points of the report's headline score (the one its table.md leads with), recomputed from the stored "
        "per-item scores with `mmrl.tiny_world.stats` (paired bootstrap over items and seeds, 95% percentile "
        "intervals, seeds resampled per arm, as the runners do; GenEval prompts grouped by task). With one seed an "
        f"interval covers the test-set sampling error only. Build: the first {DIGEST_CHARS} hex digits of the base's "
        "weights digest, \"-\" where the report predates that field.", "",
        "Claim rule: a difference is claimed only where its 95% interval excludes 0. Verdict: \"beats RFT\" where "
        "the intervals of arm - RFT and of the arm's gain over the base both lie above 0; \"above RFT, no gain over "
        "the base\" where arm - RFT lies above 0 but the gain does not (RFT loses to the base); \"below RFT\" where "
        "arm - RFT lies below 0; \"level with RFT\" where it covers 0; \"no RFT row\" where the report has none. "
        "RFT samples as many answers as the report's first arm; an arm with dynamic sampling draws more (the "
        "answers column, where the report stores them), so its verdict against RFT is not at equal samples.", "",
        f"Regenerate: `{COMMAND}` (reads docs/results/**/results.json, writes this file).", "",
        f"Summary: {len(rows)} rows; {count(lambda r: r.verdict == BEATS)} beat RFT, "
        f"{count(lambda r: r.verdict == LEVEL)} level with RFT, {count(lambda r: r.verdict == BELOW)} below RFT, "
        f"{count(lambda r: r.verdict == ABOVE_RFT_NO_GAIN)} above RFT without a gain over the base (RFT loses), "
        f"{count(lambda r: r.verdict == NO_RFT)} without an RFT row; {len(both)} beat both RFT and clean SFT"
        + "".join(f"{'; ' if i else ': '}{r.report.folder} / {r.arm}" for i, r in enumerate(both)) + ".", "",
        "| report | RL arm | base (build) | seeds | score | gain over base [95% CI] | arm - RFT [95% CI] "
        "| arm - clean SFT [95% CI] | best-of-n from the base | answers sampled per run, arm / RFT | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.report
        best = f"{100 * rep.best_of_n[1]:.1f} ({100 * rep.best_of_n[2]:+.1f}), n={rep.best_of_n[0]}" if rep.best_of_n else "-"
        ivs = [r.intervals[c].fmt(signed=True) if c in r.intervals else "-" for c in (GAIN, RFT, SFT)]
        rft_label = rep.baselines.get(RFT, (None,))[0]
        answers = (f"{rep.answers[r.arm]:,.0f} / {rep.answers[rft_label]:,.0f}"
                   if r.arm in rep.answers and rft_label in rep.answers else "-")
        cells = [rep.folder, r.arm, f"{rep.base} ({rep.digest})", str(len(rep.rl[r.arm])), rep.score, *ivs, best,
                 answers, r.verdict]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    notes = sorted({f"{r.report.folder}: {n}" for r in rows for n in r.report.notes})
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    bad = [c for c in checks if c[3] != c[4]]
    lines += ["", f"Check against the reports: {len(checks)} recomputed intervals that the reports also store "
              f"(gains, arm - RFT, arm - clean SFT) compared at the printed precision; {len(bad)} differ"
              + (":" if bad else "."), ""]
    lines += [f"- {f} / {a} / {c}: recomputed {mine}, stored {theirs}" for f, a, c, mine, theirs in bad] + [""] * bool(bad)
    lines += ["## Reports not included, and why", "", *[f"- {f}: {why}" for f, why in left_out], ""]
    return "\n".join(lines)


def build(results: Path) -> str:
    reports, left_out = collect(results)
    rows = [row for rep in reports for row in score_arms(rep)]
    checks = stored_checks(rows)
    for f, a, c, mine, theirs in checks:
        if mine != theirs:
            logger.warning("%s / %s / %s: recomputed %s, stored %s", f, a, c, mine, theirs)
    text = render(rows, left_out, checks)
    if not text.isascii():
        raise ValueError("the scoreboard must be plain ASCII")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS, help="folder searched for results.json")
    ap.add_argument("--out", type=Path, default=OUT, help="the markdown file written")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.write_text(build(args.results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
