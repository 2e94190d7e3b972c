"""Study (docs/RESULTS.md, "`dllm-countdown3` run long"): the paired difference of one row of a comparison's
results.json and one row of another results.json scored on the same test items from the same base measurement
(e.g. diffu-GRPO with d1's settings, `dllm-countdown3-d1`, against the RFT row of `dllm-countdown3`, never run in
one table), greedy, sampled and pass@4, with the paired-bootstrap 95% interval over the shared test items and the
seeds both rows have (`mmrl.tiny_world.stats.difference_interval`: items resampled once per replicate and shared,
seeds resampled per row).

    python scripts/studies/pair_rows_across_tables.py A.json "ROW_A" B.json "ROW_B" [OUT.json]

A row is an arm of `arms` or "base". Refuses to pair (one-line error) unless the two files score the same test
prompts and hold identical per-item base scores (`before_items`: the same base build and evaluation), and pairs
each seed of A with the same seed of B."""
import json
import sys

from mmrl.tiny_world.stats import difference_interval

SCORES = ("greedy", "sampled", "pass")
"""Per-item scores compared (pass = pass@4 of the sampled answers)."""


def runs_of(res: dict, row: str) -> dict[int, dict]:
    """{seed: per-item scores} of `row` in a results.json ("base": one pseudo-seed -1)."""
    if row == "base":
        return {-1: res["before_items"]}
    if row not in res["arms"]:
        raise SystemExit(f"row {row!r} not in {sorted(res['arms'])} (nor base)")
    return {int(r["seed"]): r["items"] for r in res["arms"][row]}


def pair(a: dict, row_a: str, b: dict, row_b: str) -> dict:
    """The differences row_a - row_b per score on the seeds both rows have (the base pairs with every seed)."""
    if a["test_prompts"] != b["test_prompts"]:
        raise SystemExit("the two results.json score different test items: no paired difference")
    if a["before_items"] != b["before_items"]:
        raise SystemExit("the two results.json hold different per-item base scores (another base build or "
                         "evaluation): no paired difference")
    ra, rb = runs_of(a, row_a), runs_of(b, row_b)
    seeds = sorted((set(ra) if -1 not in ra else set(rb)) & (set(rb) if -1 not in rb else set(ra)) - {-1})
    if not seeds:
        raise SystemExit(f"{row_a!r} and {row_b!r} share no seed")
    out = {"row_a": row_a, "row_b": row_b, "seeds": seeds, "n_items": len(a["test_prompts"])}
    rows = lambda r, score: [r[-1][score]] if -1 in r else [r[s][score] for s in seeds]  # noqa: E731  [seeds, items]
    for score in SCORES:
        out[score] = difference_interval(rows(ra, score), rows(rb, score)).to_dict()
    return out


def main(argv: list[str]) -> None:
    if len(argv) not in (4, 5):
        raise SystemExit(__doc__)
    a, b = (json.load(open(p)) for p in (argv[0], argv[2]))
    out = pair(a, argv[1], b, argv[3])
    out["files"] = [argv[0], argv[2]]
    for score in SCORES:
        iv = out[score]
        print(f"{argv[1]} - {argv[3]}, {score} (seeds {out['seeds']}, {iv['n_items']} items): "
              f"{100 * iv['estimate']:+.1f} [{100 * iv['low']:+.1f}, {100 * iv['high']:+.1f}]"
              f"{' (interval excludes 0)' if iv['excludes_zero'] else ''}")
    if len(argv) == 5:
        with open(argv[4], "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
