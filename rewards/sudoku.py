"""Sudoku reward: d1's fraction of the puzzle's blank cells filled correctly.

d1 (`diffu-grpo/reward_func.py`, `sudoku_reward_func`; docs/sources.md "d1 / diffu-GRPO"): the digits (`str.isdigit`)
of the last <answer>...</answer>, padded with "0" or truncated to the grid size (16 for 4x4), scored as the
fraction of the puzzle's "0" cells whose digit matches the solution; no answer, no digits, or a puzzle without
blanks score 0.
"""
from __future__ import annotations

from mmrl.core.registry import REWARDS
from mmrl.rewards.isolation import isolated
from mmrl.rewards.completions import completion_text, last_tag_content

def sudoku_digits(text: str) -> str | None:
    """d1's `extract_answer_sudoku`: the digit characters of the last <answer> block, None without one (found in
    linear time, `last_tag_content`)."""
    match = last_tag_content(text)
    return "".join(ch for ch in match.strip() if ch.isdigit()) if match is not None else None


def sudoku_score(text: str, puzzle: str, solution: str) -> float:
    """Fraction of the blank ("0") cells of `puzzle` that the answer fills with the `solution` digit."""
    puzzle, solution = str(puzzle), str(solution)
    if len(puzzle) != len(solution):
        raise ValueError(f"puzzle and solution differ in length ({len(puzzle)} vs {len(solution)})")
    digits = sudoku_digits(text)
    if not digits:
        return 0.0
    size = len(puzzle)
    digits = (digits + "0" * size)[:size]
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    if not blanks:
        return 0.0
    return sum(digits[i] == solution[i] for i in blanks) / len(blanks)


def sudoku_violations(digits: str, puzzle: str) -> int:
    """How far a filled grid is from a valid solution of `puzzle`, without reading the solution (a verifier for
    best-of-n): cells that are not a digit 1..n (missing ones included), given cells changed, and in every row,
    column and box the digits that repeat (n minus its distinct valid digits). 0 exactly when `digits` solves the
    puzzle: a grid with no repeat in any row, column or box that keeps the givens is a solution, unique or not.

    Shapes: `puzzle` has n*n cells ("0" = blank), n a square (4x4: boxes of 2x2; 9x9: 3x3)."""
    from math import isqrt

    size = len(puzzle)
    n, b = isqrt(size), isqrt(isqrt(size))
    if n * n != size or b * b != n:
        raise ValueError(f"puzzle has {size} cells; expected n*n cells with n a square (16, 81)")
    cells = (str(digits) + "0" * size)[:size]
    valid = [ch if ch.isdigit() and 1 <= int(ch) <= n else None for ch in cells]
    bad = sum(v is None for v in valid) + sum(p != "0" and v != p for p, v in zip(puzzle, valid))
    units = ([[r * n + c for c in range(n)] for r in range(n)] + [[r * n + c for r in range(n)] for c in range(n)]
             + [[(br + i) * n + bc + j for i in range(b) for j in range(b)] for br in range(0, n, b) for bc in range(0, n, b)])
    return bad + sum(n - len({valid[i] for i in u if valid[i] is not None}) - sum(valid[i] is None for i in u)
                     for u in units)


def sudoku_solved(text: str, puzzle: str, solution: str) -> float:
    """1.0 when the answer fills every blank ("0") cell of `puzzle` with the `solution` digit, else 0.0 (the
    fully-solved 1 / 0 reward: `sudoku_score == 1`; issue 24 item 5)."""
    return 1.0 if sudoku_score(text, puzzle, solution) == 1.0 else 0.0


def sudoku_validity(digits: str, puzzle: str) -> float:
    """A verifier reward that does not read the solution: `max(0, 1 - sudoku_violations / (3 * blanks))` in [0, 1].

    With the given cells kept (the masked-diffusion canvas fixes them), each blank cell adds at most 3 violations
    (one repeat in each of its row, column and box; or 1 when it is not a digit 1..n), so `3 * blanks` bounds the
    count and the reward is 1 exactly for a valid completion of the puzzle (unique or not) and 0 at the bound; a
    grid that changes a given can pass the bound and is clipped to 0. A puzzle without blanks scores 0 (as
    `sudoku_score`). Shapes: `puzzle` n*n cells ("0" = blank), `digits` the answer's digit string."""
    blanks = str(puzzle).count("0")
    if not blanks:
        return 0.0
    return max(0.0, 1.0 - sudoku_violations(digits, str(puzzle)) / (3 * blanks))


@REWARDS.register("sudoku")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def sudoku(prompts, completions, puzzle, solution, **kwargs) -> list[float]:
    """d1's Sudoku reward (`sudoku_score`); columns `puzzle` and `solution` (strings, "0" = blank)."""
    return [sudoku_score(completion_text(c), p, s) for c, p, s in zip(completions, puzzle, solution)]
