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


@REWARDS.register("sudoku")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def sudoku(prompts, completions, puzzle, solution, **kwargs) -> list[float]:
    """d1's Sudoku reward (`sudoku_score`); columns `puzzle` and `solution` (strings, "0" = blank)."""
    return [sudoku_score(completion_text(c), p, s) for c, p, s in zip(completions, puzzle, solution)]
