"""scripts/studies/scoreboard.py: rows extracted from tiny synthetic reports (hand-computed gains, the verdict rule,
what is left out and why), and the recomputed intervals against a stored report's own. Nothing is written into the
working tree (the synthetic reports live in tmp_path)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "studies"))
try:
    import scoreboard as sb
finally:
    sys.path.pop(0)

BASE = [0.0, 0.0, 0.5, 0.5]  # mean 0.25
RFT_ITEMS = [0.25, 0.25, 0.5, 0.5]  # mean 0.375


def countdown_report(with_rft: bool = True) -> dict:
    """A reasoning_rl-format report: 4 test rows, per-run sampled scores; RFT, clean reference, best-of-4."""
    run = lambda seed, items: {"seed": seed, "items": {"sampled": items, "greedy": items}}  # noqa: E731
    arms = {"GRPO": [run(0, [1.0, 1.0, 0.5, 0.5]), run(1, [0.5, 0.5, 0.5, 0.5])],  # mean 0.625: gain +0.375
            "Better": [run(0, [x + 0.25 for x in RFT_ITEMS])],  # RFT + 0.25 on every row
            "Same": [run(0, list(RFT_ITEMS))],
            "Worse": [run(0, [x - 0.25 for x in RFT_ITEMS])]}
    if with_rft:
        arms["RFT"] = [run(0, list(RFT_ITEMS))]
    return {"name": "toy", "base": "toy-base", "base_weights_sha256": "0123456789abcdef" * 4, "protocol": "test once",
            "table": "| model | sampled acc. (T=1, 4 per row) [95% CI] |", "smoke": False,
            "before_items": {"sampled": BASE, "greedy": BASE},
            "reference": {"model": "toy-clean", "items": {"sampled": [0.5] * 4}},  # mean 0.5
            "best_of_n": {"n": 4, "items": {"best": [1.0, 0.0, 1.0, 1.0]}},  # 0.75: +0.5 over the base
            "arms": arms, "differences": {}, "arm_intervals": {}}


def write(root: Path, folder: str, res: dict) -> None:
    (root / folder).mkdir(parents=True)
    (root / folder / "results.json").write_text(json.dumps(res))


def rows_of(tmp_path: Path) -> dict:
    reports, left_out = sb.collect(tmp_path)
    return {(r.report.folder, r.arm): r for rep in reports for r in sb.score_arms(rep)}, dict(left_out)


def test_gains_and_differences_are_the_hand_computed_means(tmp_path):
    write(tmp_path, "toy", countdown_report())
    rows, _ = rows_of(tmp_path)
    assert set(rows) == {("toy", a) for a in ("GRPO", "Better", "Same", "Worse")}  # RFT is a baseline, not a row
    grpo = rows["toy", "GRPO"]
    assert grpo.intervals[sb.GAIN].estimate == pytest.approx(0.625 - 0.25)
    assert grpo.intervals[sb.RFT].estimate == pytest.approx(0.625 - 0.375)
    assert grpo.intervals[sb.SFT].estimate == pytest.approx(0.625 - 0.5)
    rep = grpo.report
    assert (rep.base, rep.digest, rep.score) == ("toy-base", "0123456789ab", "sampled acc. (T=1, 4 per row)")
    assert rep.best_of_n == (4, pytest.approx(0.75), pytest.approx(0.5))


def test_verdict_is_claimed_only_where_the_interval_excludes_zero(tmp_path):
    write(tmp_path, "toy", countdown_report())
    write(tmp_path, "no-rft", countdown_report(with_rft=False))
    rows, _ = rows_of(tmp_path)
    better = rows["toy", "Better"].intervals[sb.RFT]  # one seed each, +0.25 on every row: a zero-width interval
    assert (better.low, better.estimate, better.high) == pytest.approx((0.25, 0.25, 0.25))
    assert rows["toy", "Better"].verdict == sb.BEATS
    assert rows["toy", "Same"].verdict == sb.LEVEL  # [0, 0] touches 0: no claim
    assert rows["toy", "Worse"].verdict == sb.BELOW
    assert rows["no-rft", "GRPO"].verdict == sb.NO_RFT and sb.RFT not in rows["no-rft", "GRPO"].intervals


def test_above_rft_without_a_gain_is_not_called_beating_rft(tmp_path):
    # RFT loses to the base (0 everywhere vs 0.25); the arm equals the base: +0.25 over RFT on every row, gain 0
    res = countdown_report()
    run = lambda items: [{"seed": 0, "items": {"sampled": items, "greedy": items}}]  # noqa: E731
    res["before_items"] = {"sampled": [0.25] * 4, "greedy": [0.25] * 4}
    res["arms"] = {"Flat": run([0.25] * 4), "RFT": run([0.0] * 4)}
    write(tmp_path, "rft-loses", res)
    rows, _ = rows_of(tmp_path)
    flat = rows["rft-loses", "Flat"]
    assert flat.above(sb.RFT) and not flat.above(sb.GAIN)
    assert flat.verdict == sb.ABOVE_RFT_NO_GAIN


def test_geneval_scores_are_weighted_by_task(tmp_path):
    # tasks a, a, b: the overall is the mean of the task means, (1 + 0) / 2 = 0.5, not the row mean 2/3
    res = {"name": "toy-shapes", "base": "toy", "protocol": "test once", "split": "test", "smoke": False,
           "test_tags": ["a", "a", "b"], "before_items": [0.0, 0.0, 0.0],
           "reference": {"model": "toy-clean", "items": [0.0, 0.0, 1.0]},
           "rows": {"best-of-4 (base)": {"overall": {"estimate": 0.9}, "gain": {"estimate": 0.9}}},
           "arms": {"GRPO": [{"seed": 0, "items": [1.0, 1.0, 0.0]}], "RFT": [{"seed": 0, "items": [0.0, 0.0, 0.0]}]},
           "differences": {}}
    write(tmp_path, "shapes", res)
    rows, _ = rows_of(tmp_path)
    row = rows["shapes", "GRPO"]
    assert row.intervals[sb.GAIN].estimate == pytest.approx(0.5)
    assert row.intervals[sb.SFT].estimate == pytest.approx(0.5 - 0.5)
    assert row.report.best_of_n == (4, 0.9, 0.9) and row.report.digest == "-"


def test_reports_without_item_scores_or_baselines_are_left_out_with_the_reason(tmp_path):
    write(tmp_path, "old", {"name": "old", "before": {"sampled": 0.1}, "arms": {"GRPO": [{"seed": 0, "after": {}}]}})
    no_baseline = countdown_report(with_rft=False)
    no_baseline.update(reference=None, best_of_n=None)
    write(tmp_path, "bare", no_baseline)
    write(tmp_path, "lr", {**countdown_report(), "split": "validation"})
    _, left_out = rows_of(tmp_path)
    assert "per-item" in left_out["old"]
    assert left_out["bare"] == "no baseline row (no RFT, clean SFT or best-of-n)"
    assert "validation" in left_out["lr"]
    text = sb.render([], list(left_out.items()), [])
    assert text.isascii() and "- bare: no baseline row" in text and sb.COMMAND in text


def test_a_superseded_report_is_left_out_and_names_its_successor(tmp_path):
    write(tmp_path, "cmp", countdown_report())
    write(tmp_path, "cmp/three-seeds", countdown_report())
    (tmp_path / "cmp/three-seeds" / sb.SUPERSEDED).write_text("cmp (5 seeds)\nwhy: more seeds\n")
    rows, left_out = rows_of(tmp_path)
    assert {folder for folder, _ in rows} == {"cmp"}  # the superseded copy's arms are not counted twice
    assert left_out == {"cmp/three-seeds": "superseded by cmp (5 seeds)"}


@pytest.mark.parametrize("folder", ["protocol/gcpo-vs-grpo-vqa-reads", "protocol/gcpo-vs-grpo"])
def test_recomputed_intervals_match_the_stored_report_at_printed_precision(folder):
    path = ROOT / "docs" / "results" / folder / "results.json"  # read only
    res = json.loads(path.read_text())
    assert sb.exclusion(res) is None
    rows = {r.arm: r for r in sb.score_arms(sb.read_report(res, folder))}
    from mmrl.tiny_world.stats import Interval

    stored = Interval(**{k: v for k, v in res["differences"]["GRPO - RFT"].items() if k != "excludes_zero"})
    assert rows["GRPO"].intervals[sb.RFT].fmt(signed=True) == stored.fmt(signed=True)
    checks = sb.stored_checks(list(rows.values()))
    assert len(checks) == 3 * len(rows)  # gain, arm - RFT, arm - clean SFT of every RL arm are stored
    assert [c for c in checks if c[3] != c[4]] == []
