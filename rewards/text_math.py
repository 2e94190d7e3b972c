"""Math rewards: GSM8K (d1's five-part reward and plain correctness), MATH500 (math-verify equivalence plus d1's
format reward) and a generic boxed-answer accuracy.

d1's reward functions (dllm-reasoning/d1 `diffu-grpo/reward_func.py`, identical in DMPO and dllm; docs/sources.md
"d1 / diffu-GRPO") are re-implemented here with the same arithmetic. Completions are strings or chat messages
(d1 reads `completion[0]["content"]`). Everything here is bounded: answers longer than `MAX_ANSWER_CHARS`, numbers
with more than `MAX_DIGITS` digits, exponent towers and the like never reach sympy (they are compared as normalised
strings instead), so adversarial completions score within milliseconds and never raise.
"""
from __future__ import annotations

import functools
import re
import threading

from mmrl.core.registry import REWARDS
from mmrl.rewards.isolation import isolated
from mmrl.rewards.completions import completion_text

MAX_ANSWER_CHARS = 256
MAX_DIGITS = 40


# ---------------------------------------------------------------- shared extraction helpers


def xml_answer(text: str) -> str:
    """d1's `extract_xml_answer`: the text after the last "<answer>" (all of it if there is none), up to the next
    "</answer>", stripped."""
    return text.split("<answer>")[-1].split("</answer>")[0].strip()


def hash_answer(text: str) -> str:
    """A GSM8K reference answer: the part after "####" if present (d1's `extract_hash_answer`), stripped."""
    return text.split("####")[1].strip() if "####" in text else text.strip()


def _closing_braces(text: str) -> dict[int, int]:
    """Index of each "{" -> index of its matching "}" (unmatched ones are absent); one linear pass."""
    match, stack = {}, []
    for i, ch in enumerate(text):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            match[stack.pop()] = i
    return match


def _boxed_spans(text: str, macros=("\\boxed",)) -> list[tuple[int, int, int]]:
    """(macro position, content start, content end) of every balanced `<macro>{...}` (spaces allowed before the
    brace), in order. Indices, not copies: nested boxes would make the copies quadratic in the text's length."""
    match = None
    out = []
    for macro in macros:
        pos = text.find(macro)
        while pos >= 0:
            i = pos + len(macro)
            while i < len(text) and text[i] == " ":
                i += 1
            if i < len(text) and text[i] == "{":
                match = _closing_braces(text) if match is None else match
                if i in match:
                    out.append((pos, i + 1, match[i]))
            pos = text.find(macro, pos + 1)
    return sorted(out)


def last_boxed(text: str) -> str | None:
    """Content of the last balanced `\\boxed{...}` in `text` (`\\fbox{...}` if there is no boxed), None if neither."""
    spans = _boxed_spans(text) or _boxed_spans(text, ("\\fbox",))
    return text[spans[-1][1] : spans[-1][2]] if spans else None


def boxed_contents(text: str) -> list[str]:
    """Contents of every balanced `\\boxed{...}`, in order."""
    return [text[a:b] for _, a, b in _boxed_spans(text)]


_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?|-?\.[0-9]+")
_NOT_NUMBER_CHAR = re.compile(r"[^0-9,.\-$%\\\s]")
"""A character that no string accepted by `parse_number` holds (digits, commas, points, signs, "$", "\\%", "%" and
whitespace are the only ones)."""


def parse_number(text: str) -> float | None:
    """A plain decimal number (ASCII digits, thousands commas, an optional "$" or "%"), else None; numbers with more
    than `MAX_DIGITS` digits are refused."""
    s = text.strip().replace("$", "").replace("\\%", "").rstrip("%").strip()
    if not _NUMBER.fullmatch(s) or sum(c.isdigit() for c in s) > MAX_DIGITS:
        return None
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def _numbers_in(text: str) -> list[str]:
    return [m for m in _NUMBER.findall(text) if sum(c.isdigit() for c in m) <= MAX_DIGITS]


# ---------------------------------------------------------------- GSM8K: d1's five reward functions


def d1_xmlcount(text: str) -> float:
    """d1's `count_xml`: +0.125 for each of "<reasoning>\\n", "\\n</reasoning>\\n", "\\n<answer>\\n" and
    "\\n</answer>" that occurs exactly once, minus 0.001 per character after the last "\\n</answer>\\n" (the whole
    text when absent) when "\\n<answer>\\n" is counted, and minus 0.001 per character after the last "\\n</answer>"
    beyond the first when "\\n</answer>" is counted (d1's arithmetic, quirks included)."""
    score = 0.0
    if text.count("<reasoning>\n") == 1:
        score += 0.125
    if text.count("\n</reasoning>\n") == 1:
        score += 0.125
    if text.count("\n<answer>\n") == 1:
        score += 0.125
        score -= len(text.rpartition("\n</answer>\n")[2]) * 0.001
    if text.count("\n</answer>") == 1:
        score += 0.125
        score -= (len(text.rpartition("\n</answer>")[2]) - 1) * 0.001
    return score


_SOFT_PATTERN = r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>"
_STRICT_PATTERN = r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$"
"""d1's format patterns (authors' code: dllm-reasoning/d1 diffu-grpo/reward_func.py), used with `re.match` and
without `re.DOTALL`, so "." stops at a newline and reasoning that spans several lines matches neither; the
`*_multiline` rewards allow newlines (`re.DOTALL`). The regexes backtrack over every "</reasoning>" to the end of
the text (quadratic: seconds per 100 KB completion), so `soft_format_matches` and `strict_format_matches` decide
the same match in linear time; tests compare them with the regexes."""


class _NextFind:
    """`text.find(needle, start)` for non-decreasing `start`: a result is reused until `start` passes it, so the
    scans of successive calls never overlap and all of them together take linear time."""

    def __init__(self, text: str, needle: str):
        self.text, self.needle, self.start, self.found = text, needle, -1, -1

    def __call__(self, start: int) -> int:
        if self.start < 0 or (self.found >= 0 and start > self.found) or (self.found < 0 and start < self.start):
            self.start, self.found = start, self.text.find(self.needle, start)
        return self.found


def soft_format_matches(text: str, dotall: bool = False) -> bool:
    """Whether `re.match(_SOFT_PATTERN, text, re.DOTALL if dotall else 0)` matches, in linear time.

    The match needs "<reasoning>" at 0, then some "</reasoning>" that ".*?" can reach (without DOTALL: before the
    first newline), the whole whitespace run after it ("<" is not whitespace), "<answer>", and a "</answer>" that
    ".*?" can reach from there."""
    head = "<reasoning>"
    if not text.startswith(head):
        return False
    first_newline = text.find("\n", len(head))
    reach = len(text) if dotall or first_newline < 0 else first_newline
    next_close, next_newline = _NextFind(text, "</answer>"), _NextFind(text, "\n")
    p = text.find("</reasoning>", len(head))
    while 0 <= p <= reach:
        q = p + len("</reasoning>")
        while q < len(text) and text[q].isspace():  # `\s`: str.isspace is the same Unicode predicate
            q += 1
        if text.startswith("<answer>", q):
            a = q + len("<answer>")
            close = next_close(a)
            if close < 0:
                return False  # no "</answer>" after this point, hence none after any later one
            newline = next_newline(a)
            if dotall or newline < 0 or close < newline:
                return True
        p = text.find("</reasoning>", p + 1)
    return False


def strict_format_matches(text: str, dotall: bool = False) -> bool:
    """Whether `re.match(_STRICT_PATTERN, text, re.DOTALL if dotall else 0)` matches, in linear time.

    "$" matches at the end or before a final newline, so the text is "<reasoning>\\n" + R + SEP + A +
    "\\n</answer>\\n", with one optional extra "\\n", where SEP = "\\n</reasoning>\\n<answer>\\n". Without DOTALL, R and A
    hold no newline, which fixes the split; with DOTALL any occurrence of SEP in the middle will do."""
    head, sep, tail = "<reasoning>\n", "\n</reasoning>\n<answer>\n", "\n</answer>\n"
    if not text.startswith(head):
        return False
    for end in (len(text), len(text) - 1):  # "$": the end, or just before a final newline
        if end < len(text) and text[end] != "\n":
            continue
        stop = end - len(tail)
        if stop < len(head) or text[stop:end] != tail:
            continue
        if dotall:
            if text.find(sep, len(head), stop) >= 0:
                return True
        else:
            r_end = text.find("\n", len(head), stop + 1)  # R is one line: its end is the first newline
            if 0 <= r_end and r_end + len(sep) <= stop and text.startswith(sep, r_end) and "\n" not in text[r_end + len(sep) : stop]:
                return True
    return False


@REWARDS.register("gsm8k_xmlcount")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_xmlcount(prompts, completions, **kwargs) -> list[float]:
    """d1 `xmlcount_reward_func` (up to 0.5)."""
    return [d1_xmlcount(completion_text(c)) for c in completions]


@REWARDS.register("gsm8k_soft_format")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_soft_format(prompts, completions, **kwargs) -> list[float]:
    """d1 `soft_format_reward_func`: 0.5 if the completion starts with <reasoning>...</reasoning> <answer>...</answer>
    with no newline inside either tag pair (d1's `re.match` without `re.DOTALL`; `gsm8k_soft_format_multiline`
    allows newlines)."""
    return [0.5 if soft_format_matches(completion_text(c)) else 0.0 for c in completions]


@REWARDS.register("gsm8k_strict_format")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_strict_format(prompts, completions, **kwargs) -> list[float]:
    """d1 `strict_format_reward_func`: 0.5 for exactly "<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>\\n"
    where each "..." is a single line (d1's `re.match` without `re.DOTALL`; `gsm8k_strict_format_multiline` allows
    several lines)."""
    return [0.5 if strict_format_matches(completion_text(c)) else 0.0 for c in completions]


@REWARDS.register("gsm8k_soft_format_multiline")
def gsm8k_soft_format_multiline(prompts, completions, **kwargs) -> list[float]:
    """`gsm8k_soft_format` with `re.DOTALL`: the tagged parts may span several lines (not d1's behaviour)."""
    return [0.5 if soft_format_matches(completion_text(c), dotall=True) else 0.0 for c in completions]


@REWARDS.register("gsm8k_strict_format_multiline")
def gsm8k_strict_format_multiline(prompts, completions, **kwargs) -> list[float]:
    """`gsm8k_strict_format` with `re.DOTALL`: the reasoning and answer may span several lines (not d1's behaviour)."""
    return [0.5 if strict_format_matches(completion_text(c), dotall=True) else 0.0 for c in completions]


@REWARDS.register("gsm8k_int")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_int(prompts, completions, **kwargs) -> list[float]:
    """d1 `int_reward_func`: 0.5 if the extracted answer is all digits (`str.isdigit`, as d1)."""
    return [0.5 if xml_answer(completion_text(c)).isdigit() else 0.0 for c in completions]


@REWARDS.register("gsm8k_correctness")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """d1 `correctness_reward_func`: 2.0 if the extracted answer equals the reference answer string exactly."""
    return [2.0 if xml_answer(completion_text(c)) == hash_answer(str(a)) else 0.0 for c, a in zip(completions, answer)]


GSM8K_PARTS = {
    "xmlcount": gsm8k_xmlcount,
    "soft_format": gsm8k_soft_format,
    "strict_format": gsm8k_strict_format,
    "int": gsm8k_int,
    "correctness": gsm8k_correctness,
}


GSM8K_MULTILINE_PARTS = {**GSM8K_PARTS, "soft_format": gsm8k_soft_format_multiline, "strict_format": gsm8k_strict_format_multiline}


def _sum_of_parts(parts_fns: dict, prompts, completions, answer) -> list[dict]:
    parts = {k: fn(prompts, completions, answer=answer) for k, fn in parts_fns.items()}
    return [{"score": sum(p[i] for p in parts.values()), **{k: p[i] for k, p in parts.items()}} for i in range(len(completions))]


@REWARDS.register("gsm8k")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k(prompts, completions, answer, **kwargs) -> list[dict]:
    """d1's GSM8K reward: the sum of its five functions (at most 4.0; a correct answer with multi-line reasoning
    gets 3.0, as in d1, whose format patterns do not cross newlines); each part is logged."""
    return _sum_of_parts(GSM8K_PARTS, prompts, completions, answer)


@REWARDS.register("gsm8k_multiline")
def gsm8k_multiline(prompts, completions, answer, **kwargs) -> list[dict]:
    """d1's GSM8K reward with the `re.DOTALL` format patterns: multi-line reasoning in the d1 format also earns the
    two format terms (4.0 for a perfect multi-line answer)."""
    return _sum_of_parts(GSM8K_MULTILINE_PARTS, prompts, completions, answer)


def gsm8k_prediction(text: str) -> float | None:
    """The predicted number: the first `\\boxed{}` holding a number, else the last number inside the last
    <answer>...</answer>, else the last number of the completion (d1's evaluation parser, docs/sources.md "DMPO",
    plus the last fallback for untagged models)."""
    for _, a, b in _boxed_spans(text):
        # only a run of number characters can parse; the check stops at the first other character (every
        # "\\boxed{" has one), so nested boxes cost linear time, not the sum of their lengths
        other = _NOT_NUMBER_CHAR.search(text, a, b)
        v = parse_number(text[a:b]) if other is None else None
        if v is not None:
            return v
    span = text.rpartition("<answer>")[2].partition("</answer>")[0] if "<answer>" in text else text
    nums = _numbers_in(span)
    return parse_number(nums[-1]) if nums else None


@REWARDS.register("gsm8k_accuracy")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def gsm8k_accuracy(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 if the predicted number equals the reference number (as floats, relative tolerance 1e-6), else 0.0."""
    out = []
    for c, a in zip(completions, answer):
        pred, gold = gsm8k_prediction(completion_text(c)), parse_number(hash_answer(str(a)))
        out.append(1.0 if pred is not None and gold is not None and abs(pred - gold) <= 1e-6 * max(1.0, abs(gold)) else 0.0)
    return out


# ---------------------------------------------------------------- MATH500


_EXPONENT = re.compile(r"\^\s*\{?\s*\(?\s*([0-9]+)")
_FACTORIAL = re.compile(r"([0-9]+)\s*!")
_REFUSED = ("**", "\\sum", "\\prod", "\\int", "\\lim", "\\binom", "\\choose", "factorial")


def _exponent_tower(s: str) -> bool:
    """True if some exponent itself holds an exponent (9^{9^9}, 2^2^2 ...)."""
    for m in re.finditer(r"\^", s):
        i = m.end()
        while i < len(s) and s[i] == " ":
            i += 1
        if i < len(s) and s[i] in "{(":
            open_, close = s[i], "}" if s[i] == "{" else ")"
            depth, j = 0, i
            while j < len(s):
                depth += s[j] == open_
                depth -= s[j] == close
                if depth == 0:
                    break
                j += 1
            if "^" in s[i : j + 1]:
                return True
        else:
            j = i
            while j < len(s) and (s[j].isalnum() or s[j] == "."):
                j += 1
            if j < len(s) and s[j:].lstrip().startswith("^"):
                return True
    return False


_ALLOWED_NON_ASCII = set("πθαβγ∞√×·°−≤≥÷")


def _balanced(s: str) -> bool:
    """Brackets nest properly: "{...}" on their own, "(" / "[" against ")" / "]" together (intervals like (0, 1]
    are fine)."""
    braces = round_ = 0
    for ch in s:
        if ch == "{":
            braces += 1
        elif ch == "}":
            braces -= 1
        elif ch in "([":
            round_ += 1
        elif ch in ")]":
            round_ -= 1
        if braces < 0 or round_ < 0:
            return False
    return braces == 0 and round_ == 0


def too_costly(expr: str) -> bool:
    """True for answers sympy should not see: longer than `MAX_ANSWER_CHARS`, numbers of more than `MAX_DIGITS`
    digits, unbalanced brackets, code-like text ("__", quotes, backticks), non-ASCII characters other than a few math
    symbols (unicode digits included), exponent towers, exponents or factorials above 1000, and
    sums/products/integrals/limits/binomials (any of which sympy may evaluate at length)."""
    if len(expr) > MAX_ANSWER_CHARS or any(tok in expr for tok in _REFUSED):
        return True
    if "__" in expr or any(q in expr for q in "\"`") or any(ord(c) > 127 and c not in _ALLOWED_NON_ASCII for c in expr):
        return True
    if any(len(run) > MAX_DIGITS for run in re.findall(r"[0-9]+", expr)) or not _balanced(expr):
        return True
    if any(int(e) > 1000 for e in _EXPONENT.findall(expr)) or any(int(f) > 1000 for f in _FACTORIAL.findall(expr)):
        return True
    return _exponent_tower(expr)


def _normalise(s: str) -> str:
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("$", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return re.sub(r"\s+", "", s).rstrip(".")


def math_equal(pred: str | None, gold: str | None) -> bool:
    """Whether two final answers are equivalent: math-verify (parse both as `\\boxed{...}`, then `verify`) when both
    are safe for sympy (`too_costly`), else equality of normalised strings."""
    if pred is None or gold is None:
        return False
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold:
        return False
    if _normalise(pred) == _normalise(gold):
        return True
    if too_costly(pred) or too_costly(gold):
        return False
    from math_verify import verify

    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    timeout = 1 if threading.current_thread() is threading.main_thread() else None
    try:
        g, p = _parse_latex(gold, timeout), _parse_latex(pred, timeout)
        return bool(g) and bool(p) and bool(verify(list(g), list(p), timeout_seconds=timeout))
    except Exception:  # math-verify failures (timeouts included) mean "not shown equal"
        return False


_PARSED: dict[tuple[str, int | None], tuple] = {}
_PARSED_MAX = 4096


def _parse_latex(answer: str, timeout: int | None):
    """math-verify's LaTeX parser only: its plain-expression parser goes through sympy's `parse_expr`, which
    `eval`s, and model outputs are never evaluated. Parses are remembered, except an empty one: math-verify returns
    nothing on a timeout too, and on a busy machine a correct answer would stay "wrong" for the rest of the run."""
    key = (answer, timeout)
    if key in _PARSED:
        return _PARSED[key]
    from math_verify import LatexExtractionConfig, parse

    _warm_up_math_verify()
    out = tuple(parse("\\boxed{" + answer + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=timeout))
    if out:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = out
    return out


@functools.cache
def _warm_up_math_verify() -> None:
    """One untimed parse and verify of a trivial answer: the first call builds math-verify's LaTeX grammar (0.2 s on
    an idle core, over its 1 s timeout on a loaded one), which must not count against the first real answer."""
    from math_verify import LatexExtractionConfig, parse, verify

    one = parse("\\boxed{1}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    verify(one, one, timeout_seconds=None)


def math_prediction(text: str) -> str | None:
    """The final answer of a completion: the last `\\boxed{}` content, else the last <answer>...</answer> content."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    if "<answer>" in text:
        return text.rpartition("<answer>")[2].partition("</answer>")[0].strip()
    return None


def reference_answer(answer: str) -> str:
    """A MATH reference: the last `\\boxed{}` of a solution, or the answer itself."""
    boxed = last_boxed(str(answer))
    return boxed if boxed is not None else str(answer).strip()


@REWARDS.register("math500_correctness")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def math500_correctness(prompts, completions, answer, **kwargs) -> list[float]:
    """Training reward, 2.0 (d1's scale) if the completion's final answer is math-verify-equivalent to the reference,
    else 0.0; the evaluation metric (1 / 0) is `math500_accuracy`."""
    return [2.0 if math_equal(math_prediction(completion_text(c)), reference_answer(a)) else 0.0
            for c, a in zip(completions, answer)]


def d1_boxed_format(text: str) -> float:
    """d1's `boxed_and_answer_tags_format_reward`: 0.5 x (1 if "<answer>" occurs + (1 if "\\boxed" is in the text
    between the first "<answer>" and the next "</answer>" (the whole text without tags) else 0.5)), in
    {0.25, 0.5, 0.75, 1.0}.

    d1's source tests `"\\boxed" in r` with a non-raw string, which Python reads as backspace + "oxed", so in d1 the
    second term is always 0.5; mmrl checks for a literal backslash-"boxed", the evident intent."""
    if "<answer>" in text:
        tags, span = 1.0, text.split("<answer>")[1].split("</answer>")[0]
    else:
        tags, span = 0.0, text
    return 0.5 * (tags + (1.0 if "\\boxed" in span else 0.5))


@REWARDS.register("math500_accuracy")
def math500_accuracy(prompts, completions, answer, **kwargs) -> list[float]:
    """The MATH500 evaluation metric: 1.0 if the completion's final answer (`math_prediction`: last `\\boxed{}`, else
    the <answer> text, as d1's / DMPO's `parse_math_answers`) is equivalent to the reference, else 0.0.
    Equivalence is math-verify's (`math_equal`), where the authors use Hendrycks' `strip_string` comparison."""
    return [1.0 if math_equal(math_prediction(completion_text(c)), reference_answer(a)) else 0.0
            for c, a in zip(completions, answer)]


@REWARDS.register("math500_format")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def math500_format(prompts, completions, **kwargs) -> list[float]:
    """d1's MATH format reward (`d1_boxed_format`)."""
    return [d1_boxed_format(completion_text(c)) for c in completions]


@REWARDS.register("math500")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def math500(prompts, completions, answer, **kwargs) -> list[dict]:
    """MATH500: correctness (2.0, math-verify) + d1's format reward; both parts logged."""
    corr = math500_correctness(prompts, completions, answer)
    fmt = math500_format(prompts, completions)
    return [{"score": c + f, "correctness": c, "format": f} for c, f in zip(corr, fmt)]


@REWARDS.register("boxed_accuracy")
@isolated  # pure CPU string work: under a timeout it runs in a killable child process
def boxed_accuracy(prompts, completions, answer, **kwargs) -> list[float]:
    """1.0 if the last `\\boxed{}` of the completion is equivalent to the reference answer (`math_equal`), else 0.0."""
    return [1.0 if math_equal(last_boxed(completion_text(c)), reference_answer(a)) else 0.0 for c, a in zip(completions, answer)]
