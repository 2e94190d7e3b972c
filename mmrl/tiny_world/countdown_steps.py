"""`countdown4_steps`: Countdown with four numbers and the working written out, a long-answer task with few decisive
tokens (issue 25, item 1).

Prompt `a,b,c,d=T`. The response is three steps separated by `|`; a step combines two numbers of the current pool,
`{x}{op}{y}:{working}={r}`, and puts `r` back. The working spells the arithmetic out digit by digit, units first
(`step_text`), so once a step's header `{x}{op}{y}` is written everything up to the next header is determined by
it: the headers' operand and operator characters are the answer's decisions (`decisive_mask`), the rest is
bookkeeping. The numbers are in 1-15, every intermediate result of a generated solution and the target at most 99
(`MAX_VALUE`). With the char tokenizer of the tiny causal models one character is one token; answers are 60-200
characters (`ANSWER_CHARS`; 60-160, mean 78, as generated).

The reward (`countdown4_steps`) is exact: 1.0 when every step is written exactly as `step_text` writes it, its
operands are in the pool, every intermediate result is a positive integer (division exact), all four numbers are
used and the last result is the target; 0.0 otherwise. Splits are by the number multiset (`countdown_split` of
`mmrl.tiny_world.tasks`): no held-out multiset appears in training with any target.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache

from mmrl.core.registry import REWARDS
from mmrl.data.tasks import TASKS, Task
from mmrl.rewards.completions import completion_text
from mmrl.tiny_world.tasks import countdown3_row, countdown_split  # the same row layout and multiset split as countdown3

OPS = "+-*/"
STEP_SEP = "|"
ROW_SEP = ";"
ANSWER_CHARS = (60, 200)
"""Inclusive bounds on a generated demonstration's length in characters (= tokens of the char tokenizer)."""
NUMBER_RANGE = (1, 15)
"""The four numbers are drawn from this inclusive range."""
TARGET_RANGE = (10, 99)
"""Inclusive bounds on the targets."""
MAX_VALUE = 99
"""Largest intermediate result a generated solution may have: at most two digits, so a multiplication is at most
two rows and every column sum is of single digits (version 2 of the task; version 1 allowed 999 and targets up to
200, and its tiny base solved nothing after 300 steps, docs/RESULTS.md)."""
HELD_OUT = 300
"""Problems in each of the validation and test splits (one per held-out number multiset)."""
_HEADER = re.compile(r"^(\d+)([+\-*/])(\d+):")


def _digits(n: int) -> list[int]:
    """Decimal digits of n >= 0, units first."""
    return [int(c) for c in reversed(str(n))]


def add_working(a: int, b: int) -> str:
    """Column addition, units first: `x+y+carry=s` per column, comma separated."""
    da, db = _digits(a), _digits(b)
    cols, c = [], 0
    for i in range(max(len(da), len(db))):
        x, y = (da[i] if i < len(da) else 0), (db[i] if i < len(db) else 0)
        s = x + y + c
        cols.append(f"{x}+{y}+{c}={s}")
        c = s // 10
    return ",".join(cols)


def sub_working(a: int, b: int) -> str:
    """Column subtraction of a >= b, units first: `{x + 10*borrow_out}-{y}-{borrow_in}={digit}` per column."""
    da, db = _digits(a), _digits(b)
    cols, borrow = [], 0
    for i in range(len(da)):
        x, y = da[i], (db[i] if i < len(db) else 0)
        out = 1 if x - y - borrow < 0 else 0
        cols.append(f"{x + 10 * out}-{y}-{borrow}={x + 10 * out - y - borrow}")
        borrow = out
    return ",".join(cols)


def mul_row(a: int, d: int) -> str:
    """a times one digit d, units first: `x*d+carry=v` per digit of a."""
    cols, c = [], 0
    for x in _digits(a):
        v = x * d + c
        cols.append(f"{x}*{d}+{c}={v}")
        c = v // 10
    return ",".join(cols)


def mul_working(a: int, b: int) -> str:
    """Long multiplication: one `mul_row` per digit of b (units first, `row=p`), then the shifted partial products
    added one at a time with `add_working` (`+=acc`); rows separated by `;`."""
    rows, acc = [], None
    for j, d in enumerate(_digits(b)):
        p = a * d
        rows.append(f"{mul_row(a, d)}={p}")
        if acc is None:
            acc = p
        else:
            shifted = p * 10**j
            rows.append(f"{acc}+{shifted}:{add_working(acc, shifted)}={acc + shifted}")
            acc += shifted
    return ROW_SEP.join(rows)


def apply_op(a: int, op: str, b: int) -> int | None:
    """The result of `a op b` if it is a positive integer (exact division), else None."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a > b else None
    if op == "*":
        return a * b
    if op == "/":
        return a // b if b and a % b == 0 else None
    raise ValueError(f"unknown operator {op!r}; valid: {list(OPS)}")


def step_text(a: int, op: str, b: int) -> str | None:
    """The one correct way to write the step `a op b`, or None when its result is not a positive integer.
    Division is checked by multiplication: `a/b:q={q},{mul_working(q, b)}={q}`."""
    r = apply_op(a, op, b)
    if r is None:
        return None
    if op == "+":
        work = add_working(a, b)
    elif op == "-":
        work = sub_working(a, b)
    elif op == "*":
        work = mul_working(a, b)
    else:
        work = f"q={r},{mul_working(r, b)}"
    return f"{a}{op}{b}:{work}={r}"


def answer_text(steps: list[tuple[int, str, int]]) -> str:
    """The response for a list of (a, op, b) steps (each assumed valid)."""
    return STEP_SEP.join(step_text(a, op, b) for a, op, b in steps)


def score(answer: str, numbers: list[int], target: int) -> float:
    """The exact reward of one response: 1.0 or 0.0 (module docstring)."""
    pool = Counter(int(x) for x in numbers)
    steps = answer.strip().split(STEP_SEP)
    if len(steps) != len(numbers) - 1:
        return 0.0
    last = None
    for s in steps:
        m = _HEADER.match(s)
        if m is None:
            return 0.0
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        if step_text(a, op, b) != s:  # wrong arithmetic, wrong result or a malformed working
            return 0.0
        pool[a] -= 1
        pool[b] -= 1
        if pool[a] < 0 or pool[b] < 0:  # an operand not in the pool (or used twice)
            return 0.0
        last = apply_op(a, op, b)
        pool[last] += 1
    return 1.0 if last == int(target) else 0.0


def decisive_mask(answer: str) -> list[bool]:
    """One flag per character of `answer` (per token with the char tokenizer): True on the characters of every
    step's header `{a}{op}{b}` (which numbers are combined, and how), False on the working, the results and the
    separators, which the headers determine. Raises ValueError on a step without a header."""
    mask = [False] * len(answer)
    pos = 0
    for s in answer.split(STEP_SEP):
        m = _HEADER.match(s)
        if m is None:
            raise ValueError(f"step {s!r} has no `a op b:` header")
        for i in range(m.end() - 1):  # the header without its colon
            mask[pos + i] = True
        pos += len(s) + len(STEP_SEP)
    return mask


def random_solution(numbers: list[int], rng: random.Random) -> list[tuple[int, str, int]] | None:
    """A random sequence of three valid steps over `numbers` (random pair, order and operator each step), or None
    when a drawn step is invalid or an intermediate exceeds `MAX_VALUE`."""
    pool = list(numbers)
    steps = []
    while len(pool) > 1:
        i, j = rng.sample(range(len(pool)), 2)
        op = rng.choice(OPS)
        r = apply_op(pool[i], op, pool[j])
        if r is None or r > MAX_VALUE:
            return None
        steps.append((pool[i], op, pool[j]))
        pool = [x for k, x in enumerate(pool) if k not in (i, j)] + [r]
    return steps


def problems(n: int, seed: int) -> list[tuple[list[int], int, str]]:
    """`n` distinct (numbers, target, demonstration) problems: a random multiset, a random valid solution whose
    answer is `ANSWER_CHARS` long and whose value lies in `TARGET_RANGE`; distinct by (multiset, target)."""
    rng = random.Random(seed)
    seen: set[tuple] = set()
    out = []
    while len(out) < n:
        nums = [rng.randint(*NUMBER_RANGE) for _ in range(4)]
        steps = random_solution(nums, rng)
        if steps is None:
            continue
        text = answer_text(steps)
        target = apply_op(*steps[-1])
        if not (ANSWER_CHARS[0] <= len(text) <= ANSWER_CHARS[1] and TARGET_RANGE[0] <= target <= TARGET_RANGE[1]):
            continue
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        out.append((nums, target, text))
    return out


@REWARDS.register("countdown4_steps")
def countdown4_steps(prompts, completions, target, numbers, **kwargs) -> list[float]:
    """The exact countdown4_steps reward (`score`): 1.0 for a fully correct written-out solution, else 0.0."""
    return [score(completion_text(c), [int(x) for x in n], int(t)) for c, n, t in zip(completions, numbers, target)]


@TASKS.register("countdown4_steps")
@lru_cache(maxsize=2)
def _countdown4_steps(dataset_path: str | None, seed: int) -> Task:

    probs = problems(12000, seed=21)  # the split is part of the task definition, not of a run's seed
    parts = {k: [countdown3_row(n, t, s) for n, t, s in v] for k, v in countdown_split(probs, held_out=HELD_OUT, seed=22).items()}
    return Task("countdown4_steps", parts["train"], parts["test"], ["countdown4_steps"], "countdown4_steps",
                family="causal_lm", validation=parts["validation"],
                info={k: len(v) for k, v in parts.items()} | {"split": "by number multiset", "answer_chars": ANSWER_CHARS})


_countdown4_steps.generates_data = True  # load_task refuses a dataset_path instead of ignoring it
