"""Countdown reward (d1's rule) and the small arithmetic evaluator it uses instead of `eval`.

d1 (`diffu-grpo/reward_func.py`, `compute_score`; docs/sources.md "d1 / diffu-GRPO"): take the last
<answer>...</answer>; none -> 0. Otherwise 1.0 if the integers in it are exactly the given numbers (as a multiset)
and the expression evaluates within 1e-5 of the target, else 0.1. d1 evaluates with Python's `eval` behind a
character whitelist, which lets `9**9**9` through; here `evaluate_arithmetic` parses numbers, + - * /, unary signs
and parentheses only, with bounded length, token count, nesting and literal size, so every call is fast and safe.
"""
from __future__ import annotations

import re
from typing import Sequence

from mmrl.core.registry import REWARDS
from mmrl.rewards.isolation import isolated
from mmrl.rewards.completions import completion_text, last_tag_content

MAX_CHARS = 512
MAX_TOKENS = 256
MAX_DEPTH = 64
MAX_LITERAL_DIGITS = 30

_TOKEN = re.compile(r"[ \t\n\r\f\v]*(?:([0-9]+\.?[0-9]*|\.[0-9]+)|([-+*/()]))")


class InvalidExpression(ValueError):
    """The expression is not a valid bounded arithmetic expression."""


def _tokens(expr: str) -> list[str]:
    if len(expr) > MAX_CHARS:
        raise InvalidExpression(f"expression longer than {MAX_CHARS} characters")
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            if expr[pos:].strip(" \t\n\r\f\v") == "":
                break
            raise InvalidExpression(f"unexpected character {expr[pos]!r} at {pos}")
        out.append(m.group(1) or m.group(2))
        pos = m.end()
        if len(out) > MAX_TOKENS:
            raise InvalidExpression(f"more than {MAX_TOKENS} tokens")
    if not out:
        raise InvalidExpression("empty expression")
    return out


def _literal(tok: str) -> int | float:
    digits = sum(c.isdigit() for c in tok)
    if digits > MAX_LITERAL_DIGITS:
        raise InvalidExpression(f"number with more than {MAX_LITERAL_DIGITS} digits")
    if "." in tok:
        return float(tok)
    if len(tok) > 1 and tok[0] == "0" and tok.strip("0"):
        raise InvalidExpression(f"integer with a leading zero {tok!r}")  # as Python's own syntax
    return int(tok)


class _Parser:
    """expr := term (('+' | '-') term)*; term := factor (('*' | '/') factor)*;
    factor := ('+' | '-') factor | number | '(' expr ')'. Python's semantics: ints stay exact, '/' is true division."""

    def __init__(self, tokens: list[str]):
        self.toks, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise InvalidExpression("expression ends too early")
        self.i += 1
        return tok

    def expr(self):
        value = self.term()
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self):
        value = self.factor()
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.factor()
            value = value * rhs if op == "*" else value / rhs
        return value

    def factor(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InvalidExpression(f"nesting deeper than {MAX_DEPTH}")
        tok = self.take()
        if tok in ("+", "-"):
            value = self.factor()
            value = value if tok == "+" else -value
        elif tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise InvalidExpression("unbalanced parenthesis")
        elif tok[0].isdigit() or tok[0] == ".":
            value = _literal(tok)
        else:
            raise InvalidExpression(f"unexpected {tok!r}")
        self.depth -= 1
        return value


def evaluate_arithmetic(expr: str) -> int | float | None:
    """The value of an arithmetic expression of decimal numbers, + - * /, unary signs and parentheses, or None if
    it is anything else (other characters, `**`, `//`, unbalanced parentheses, division by zero, overflow, or more
    than the size limits). Never evaluates code."""
    try:
        parser = _Parser(_tokens(expr))
        value = parser.expr()
        if parser.peek() is not None:
            raise InvalidExpression(f"unexpected {parser.peek()!r} after a complete expression")
        return value
    except (InvalidExpression, ZeroDivisionError, OverflowError):
        return None


def last_answer(text: str) -> str | None:
    """d1's `extract_solution` (`re.findall(r"<answer>(.*?)</answer>")[-1]`): the last <answer>...</answer> content,
    stripped; None without one (linear time, `last_tag_content`)."""
    match = last_tag_content(text)
    return match.strip() if match is not None else None


def uses_numbers(equation: str, numbers: Sequence[int]) -> bool:
    """d1's `validate_equation`: the integers written in the equation (runs of digits) are exactly `numbers`."""
    runs = re.findall(r"\d+", equation)
    if any(len(r) > MAX_LITERAL_DIGITS for r in runs):
        return False
    try:
        return sorted(int(r) for r in runs) == sorted(int(n) for n in numbers)
    except ValueError:
        return False


def countdown_score(text: str, numbers: Sequence[int], target: float, format_score: float = 0.1, score: float = 1.0) -> float:
    """d1's `compute_score` (strict method): 0 without an answer, `score` when the answer uses exactly the numbers
    and evaluates within 1e-5 of the target, else `format_score`."""
    equation = last_answer(text)
    if equation is None:
        return 0.0
    if not uses_numbers(equation, numbers):
        return format_score
    value = evaluate_arithmetic(equation)
    if value is None:
        return format_score
    try:
        return score if abs(value - target) < 1e-5 else format_score
    except OverflowError:
        return format_score


def _numbers(value) -> list[int]:
    if isinstance(value, str):  # d1's test file stores "a,b,c"
        return [int(x) for x in value.split(",") if x.strip()]
    return [int(x) for x in value]


@REWARDS.register("countdown")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def countdown(prompts, completions, target, numbers, **kwargs) -> list[float]:
    """d1's Countdown reward: 1.0 / 0.1 / 0 (see `countdown_score`); columns `target` and `numbers`
    (a list of ints or "a,b,c")."""
    return [countdown_score(completion_text(c), _numbers(n), float(t)) for c, n, t in zip(completions, numbers, target)]


_LATEX_OPERATORS = {"\\div": "/", "\\times": "*", "\\cdot": "*"}
_RHS_CHARS = frozenset("0123456789. ")
_LHS_RUN = re.compile(r"[0-9+\-*/() ]+")


def equation_lhs(equation: str) -> str | None:
    """The first match's group of the authors' `re.search(r"([0-9+\\-*/() ]+)=[0-9. ]+", equation)`, found in
    linear time. The regex retries every start inside a long run of expression characters to the run's end
    (quadratic: 7 s on 32 KB of digits). Every start inside one maximal run reaches the same end, where an "=" and
    one right-hand-side character must follow, so only the maximal runs need checking, each once."""
    for run in _LHS_RUN.finditer(equation):  # maximal runs: the class is a single character set, so linear
        end = run.end()
        if equation[end : end + 1] == "=" and equation[end + 1 : end + 2] in _RHS_CHARS:
            return run.group(0)
    return None


def eval_expression(text: str) -> str:
    """The expression the authors' Countdown evaluation reads (d1 / DMPO `eval/parse_and_get_acc.py`,
    `parse_countdown_answers`): the last `\\boxed{}`, else the first <answer>...</answer>, else the whole text; LaTeX
    operators replaced by + - * /, and of "expr = value" only the left-hand side."""
    from mmrl.rewards.text_math import last_boxed

    boxed = last_boxed(text)
    if boxed is not None:
        equation = boxed
    else:
        start = text.find("<answer>")  # the first tag pair, found in linear time (no backtracking regex)
        end = text.find("</answer>", start + len("<answer>")) if start >= 0 else -1
        equation = text[start + len("<answer>") : end].strip() if end >= 0 else text
    for latex, op in _LATEX_OPERATORS.items():
        equation = equation.replace(latex, op)
    lhs = equation_lhs(equation)
    return lhs.strip() if lhs is not None else equation


def countdown_correct(text: str, numbers: Sequence[int], target: float) -> float:
    """1.0 if `eval_expression(text)` uses exactly `numbers` and evaluates within 1e-5 of `target`, else 0.0."""
    equation = eval_expression(text)
    if not uses_numbers(equation, numbers):
        return 0.0
    value = evaluate_arithmetic(equation)
    try:
        return 1.0 if value is not None and abs(value - target) < 1e-5 else 0.0
    except OverflowError:
        return 0.0


@REWARDS.register("countdown_accuracy")
def countdown_accuracy(prompts, completions, target, numbers, **kwargs) -> list[float]:
    """The Countdown evaluation metric: 1.0 for a correct expression (`countdown_correct`), else 0.0 (the training
    reward `countdown` gives 0.1 to a wrong tagged answer)."""
    return [countdown_correct(completion_text(c), _numbers(n), float(t)) for c, n, t in zip(completions, numbers, target)]
