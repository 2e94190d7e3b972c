"""Study (docs/RESULTS.md, "Each method with its authors' settings on Sudoku"): one row's gain over its own base in a
Sudoku comparison's results.json (`mmrl replicate`'s Sudoku runner) against another row's gain over its own base in
a second results.json, the two scored on the same test puzzles but possibly from different `sudoku4` builds: the
contrast (A_row - A_base) - (B_row - B_base) with the paired-bootstrap 95% interval
(`mmrl.tiny_world.stats.difference_of_differences_interval`: puzzles resampled once per replicate and shared by the
four rows, seeds resampled per row, so no seed of A is paired with a seed of B).

    python scripts/studies/sudoku_gain_across_builds.py A.json "ROW_A" B.json "ROW_B" [OUT.json]

Refuses (one-line error) unless the two files list the same test puzzles."""
import json
import sys

from mmrl.tiny_world.stats import difference_of_differences_interval


def rows_of(res: dict, row: str) -> list[list[float]]:
    """The [seeds, puzzles] test scores of `row` in a Sudoku results.json."""
    if row not in res["arms"]:
        raise SystemExit(f"row {row!r} not in {sorted(res['arms'])}")
    return [r["items"] for r in res["arms"][row]]


def contrast(a: dict, row_a: str, b: dict, row_b: str) -> dict:
    if a["test_puzzles"] != b["test_puzzles"]:
        raise SystemExit("the two results.json score different test puzzles: no paired contrast")
    iv = difference_of_differences_interval(rows_of(a, row_a), [a["base_items"]], rows_of(b, row_b), [b["base_items"]])
    return {"row_a": row_a, "row_b": row_b, "builds": [a.get("base_weights_sha256"), b.get("base_weights_sha256")],
            "seeds": [len(a["arms"][row_a]), len(b["arms"][row_b])], **iv.to_dict()}


def main(argv: list[str]) -> None:
    if len(argv) not in (4, 5):
        raise SystemExit(__doc__)
    a, b = (json.load(open(p)) for p in (argv[0], argv[2]))
    out = contrast(a, argv[1], b, argv[3])
    print(f"gain of {argv[1]} ({(out['builds'][0] or '?')[:12]}) - gain of {argv[3]} ({(out['builds'][1] or '?')[:12]}), "
          f"{out['n_items']} puzzles: {100 * out['estimate']:+.1f} [{100 * out['low']:+.1f}, {100 * out['high']:+.1f}]"
          f"{' (interval excludes 0)' if out['excludes_zero'] else ''}")
    if len(argv) == 5:
        with open(argv[4], "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
