"""Study (docs/RESULTS.md, "GRPO without its KL term"): one difference of two rows in a comparison's results.json
against another difference in a second results.json scored on the same test items (e.g. GRPO-no-KL - GRPO on one
base build against DAPO's recipe - GRPO on another), with the paired-bootstrap interval of the contrast
(`mmrl.tiny_world.stats.difference_of_differences_interval`, items shared, seeds resampled per row).

    python scripts/studies/difference_across_tables.py A.json "ROW1" "ROW2" B.json "ROW3" "ROW4" [sampled|greedy]

A row is an arm of `arms`, or "base" / "clean SFT" (the base and reference measurements)."""
import json
import sys

from mmrl.tiny_world.stats import difference_interval, difference_of_differences_interval


def rows_of(res: dict, row: str, score: str) -> list[list[float]]:
    """The [seeds, items] scores of `row` in a results.json."""
    if row == "base":
        return [res["before_items"][score]]
    if row == "clean SFT":
        return [res["reference"]["items"][score]]
    if row not in res["arms"]:
        raise SystemExit(f"row {row!r} not in {sorted(res['arms'])} (nor base / clean SFT)")
    return [r["items"][score] for r in res["arms"][row]]


def main(argv: list[str]) -> None:
    if len(argv) not in (6, 7):
        raise SystemExit(__doc__)
    score = argv[6] if len(argv) == 7 else "sampled"
    if score not in ("sampled", "greedy"):
        raise SystemExit(f"score must be sampled or greedy, got {score!r}")
    a, b = (json.load(open(p)) for p in (argv[0], argv[3]))
    if a["test_prompts"] != b["test_prompts"]:
        raise SystemExit("the two results.json score different test items: no paired contrast")
    x1, x2, x3, x4 = rows_of(a, argv[1], score), rows_of(a, argv[2], score), rows_of(b, argv[4], score), rows_of(b, argv[5], score)
    print(f"{argv[1]} - {argv[2]} ({argv[0]}): {difference_interval(x1, x2).fmt(signed=True)}")
    print(f"{argv[4]} - {argv[5]} ({argv[3]}): {difference_interval(x3, x4).fmt(signed=True)}")
    iv = difference_of_differences_interval(x1, x2, x3, x4)
    print(f"difference of the two ({score}, {iv.n_items} items, {len(x1)}/{len(x2)}/{len(x3)}/{len(x4)} seeds): "
          f"{iv.fmt(signed=True)}{' (interval excludes 0)' if iv.excludes_zero else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
