"""Text rewards (d1's GSM8K / MATH / Countdown / Sudoku rewards, math-verify, the arithmetic evaluator) and the
reward combination (`RewardSet`, registry, error handling, TRL compatibility)."""
import asyncio
import math

import pytest
import torch

from mmrl.core.registry import Registry, UnknownNameError
from mmrl.rewards import REWARDS, RewardError, RewardSet
from mmrl.rewards.countdown import countdown_score, evaluate_arithmetic
from mmrl.rewards.sudoku import sudoku_score
from mmrl.rewards.text_math import d1_boxed_format, d1_xmlcount, gsm8k_prediction, last_boxed, math_equal

PERFECT = "<reasoning>\nNatalia sold 48/2 = 24 clips in May.\n48+24 = 72\n</reasoning>\n<answer>\n72\n</answer>\n"


def gsm8k_parts(completion, answer="72"):
    out = REWARDS["gsm8k"]([""], [completion], answer=[answer])[0]
    return out["score"], {k: v for k, v in out.items() if k != "score"}


# ------------------------------------------------------------------ GSM8K (d1)


ONE_LINE = "<reasoning>\nNatalia sold 48/2 = 24 clips in May, 48+24 = 72.\n</reasoning>\n<answer>\n72\n</answer>\n"


def test_gsm8k_d1_perfect_completion_scores_4():
    score, parts = gsm8k_parts(ONE_LINE)
    assert parts == {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.5, "int": 0.5, "correctness": 2.0}
    assert score == 3.5  # d1's soft pattern needs "<reasoning>" directly followed by non-newline text
    # the conversational form (d1 reads completion[0]["content"]) scores the same
    assert REWARDS["gsm8k"]([""], [[{"role": "assistant", "content": ONE_LINE}]], answer=["72"])[0]["score"] == 3.5
    # a raw GSM8K answer with its "####" line is reduced to the number
    assert gsm8k_parts(ONE_LINE, "Natalia sold 48/2 = 24 clips.\n#### 72")[0] == 3.5
    # multi-line reasoning: both format terms are 0 in d1 (re.match without DOTALL), 3.0 in all
    assert gsm8k_parts(PERFECT) == (3.0, {"xmlcount": 0.5, "soft_format": 0.0, "strict_format": 0.0, "int": 0.5, "correctness": 2.0})
    # the multiline variant gives the 4.0 the d1 format intends
    assert REWARDS["gsm8k_multiline"]([""], [PERFECT], answer=["72"])[0]["score"] == 4.0
    # a completion on one line throughout satisfies d1's soft pattern
    assert REWARDS["gsm8k_soft_format"]([""], ["<reasoning>24+48=72</reasoning> <answer>72</answer>"]) == [0.5]


def test_gsm8k_d1_trailing_text_and_missing_tags_by_hand():
    # 5 characters after the answer: -0.005 after "\n</answer>\n" and -(6-1)*0.001 after "\n</answer>"; strict fails
    score, parts = gsm8k_parts(PERFECT + "extra")
    assert parts["xmlcount"] == pytest.approx(0.5 - 0.010)
    assert (parts["soft_format"], parts["strict_format"], parts["int"], parts["correctness"]) == (0.0, 0.0, 0.5, 2.0)
    assert score == pytest.approx(2.99)
    # no closing answer tag: the "\n<answer>\n" term is penalised by the whole text's length (d1's arithmetic)
    text = "<reasoning>\nx\n</reasoning>\n<answer>\n72"  # 12 + 1 + 14 + 9 + 2 = 38 characters
    assert len(text) == 38
    assert d1_xmlcount(text) == pytest.approx(0.125 + 0.125 + 0.125 - 0.038)
    # the answer is the text after the last <answer>: "72" -> int and correctness both hold
    assert gsm8k_parts(text)[1]["correctness"] == 2.0
    # untagged: nothing but zeros (the whole text is the "answer")
    assert gsm8k_parts("The answer is 72.") == (0.0, {"xmlcount": 0.0, "soft_format": 0.0, "strict_format": 0.0, "int": 0.0,
                                                      "correctness": 0.0})
    # d1 uses str.isdigit: Arabic-Indic digits count as an integer, but are not the answer string
    _, parts = gsm8k_parts("<reasoning>\nx\n</reasoning>\n<answer>\n\u0667\u0662\n</answer>\n")
    assert (parts["int"], parts["correctness"]) == (0.5, 0.0)


def test_gsm8k_parts_registered_separately_sum_to_the_whole():
    comps = [PERFECT, PERFECT + "extra", "no tags 72", "<answer>71</answer>"]
    names = ["gsm8k_xmlcount", "gsm8k_soft_format", "gsm8k_strict_format", "gsm8k_int", "gsm8k_correctness"]
    separate = RewardSet(names)([""] * 4, comps, answer=["72"] * 4).total
    whole = RewardSet(["gsm8k"])([""] * 4, comps, answer=["72"] * 4).total
    assert torch.allclose(separate, whole)


def test_gsm8k_plain_accuracy():
    acc = REWARDS["gsm8k_accuracy"]
    comps = [PERFECT, "so \\boxed{72} it is", "<answer>It is 1,072 apples</answer>", "The answer is 72.", "\\boxed{x} then 72",
             "<answer>72.0</answer>", "<answer>73</answer> 72", ""]
    assert acc([""] * 8, comps, answer=["72", "72", "1072", "72", "72", "72", "72", "72"]) == [1, 1, 1, 1, 1, 1, 0, 0]
    assert gsm8k_prediction("\\boxed{3} and \\boxed{4}") == 3.0  # first numeric box


# ------------------------------------------------------------------ MATH500


def test_math500_format_reward_values():
    assert d1_boxed_format("<answer>\\boxed{5}</answer>") == 1.0
    assert d1_boxed_format("<answer>5</answer>") == 0.75
    assert d1_boxed_format("\\boxed{5}") == 0.5
    assert d1_boxed_format("5") == 0.25
    # only the text between the first <answer> and the next </answer> is looked at
    assert d1_boxed_format("<answer>5</answer> \\boxed{5}") == 0.75


def test_math500_correctness_with_math_verify():
    r = REWARDS["math500"]
    out = r([""] * 5, ["<answer>\\boxed{\\frac{1}{2}}</answer>", "\\boxed{\\dfrac12}", "<answer>(3, \\frac{\\pi}{2})</answer>",
                       "\\boxed{0.6}", "no answer"],
            answer=["0.5", "The answer is $\\boxed{\\frac{1}{2}}$.", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{1}{2}", "1"])
    assert [o["correctness"] for o in out] == [2.0, 2.0, 2.0, 0.0, 0.0]
    assert [o["format"] for o in out] == [1.0, 0.5, 0.75, 0.5, 0.25]
    assert [o["score"] for o in out] == [3.0, 2.5, 2.75, 0.5, 0.25]
    assert REWARDS["boxed_accuracy"]([""] * 3, ["\\boxed{x^2+1}", "\\boxed{[0,1)}", "\\boxed{2}"],
                                     answer=["1+x^2", "[0, 1)", "3"]) == [1.0, 1.0, 0.0]


def test_last_boxed_extraction():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"
    assert last_boxed("\\boxed {7}") == "7"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("\\fbox{9}") == "9"
    assert last_boxed("nothing") is None


# ------------------------------------------------------------------ Countdown


def test_arithmetic_evaluator_semantics():
    assert evaluate_arithmetic("30 - (100 - 93)") == 23
    assert evaluate_arithmetic("6 / 4 * 2") == 3.0 and evaluate_arithmetic("7/2") == 3.5
    assert evaluate_arithmetic("-(2) + +3 * -1") == -5  # -2 + (3 * -1)
    assert evaluate_arithmetic("2.5*2") == 5.0 and evaluate_arithmetic(".5 + 3.") == 3.5
    assert evaluate_arithmetic("1 + 2 * 3 - 4 / 2") == 5.0  # precedence
    for bad in ["9**9**9", "2**3", "7//2", "__import__('os')", "(1+2", "1+2)", "2(3)", "(2)(3)", "1 2", "", "   ",
                "1/0", "1/(2-2)", "03", "1e5", "1_000", "\u0661+2", "abs(-1)", "1;2", "1+" * 300 + "1",
                "(" * 100 + "1" + ")" * 100, "9" * 31]:
        assert evaluate_arithmetic(bad) is None, bad
    assert evaluate_arithmetic("0") == 0 and evaluate_arithmetic("00") == 0 and evaluate_arithmetic("03.5") == 3.5


def test_countdown_d1_rule_on_the_test_set_rows():
    # rows of d1's countdown_cd3_test.jsonl: {"input": "30,100,93", "output": "23"}, {"input": "83,18,75", "output": "10"}
    r = REWARDS["countdown"]
    comps = ["<reasoning>7 from 100-93</reasoning><answer>30 - (100 - 93)</answer>",
             "<answer>18 - (83 - 75)</answer>",
             "<answer>100 - 93 + 30</answer>",  # right numbers, wrong value
             "<answer>30 + 23 - 30</answer>",  # wrong numbers
             "30 - (100 - 93)",  # no answer tag
             "<answer>1</answer> then <answer>30 - (100 - 93)</answer>"]  # the last answer counts
    assert r([""] * 6, comps, target=["23", "10", "23", "23", "23", "23"],
             numbers=["30,100,93", "83,18,75", [30, 100, 93], [30, 100, 93], [30, 100, 93], [30, 100, 93]]) == [1.0, 1.0, 0.1, 0.1, 0.0, 1.0]
    assert countdown_score("<answer>6/(4/2)</answer>", [6, 4, 2], 3) == 1.0
    assert countdown_score("<answer>3/(3-3)*2</answer>", [3, 3, 2], 3) == 0.1  # division by zero
    assert countdown_score("<answer></answer>", [1, 2, 3], 6) == 0.1  # an answer, but empty


ADVERSARIAL = [
    "__import__('os')", "<answer>__import__('os').system('echo pwned')</answer>", "9**9**9", "<answer>9**9**9</answer>",
    "<answer>" + "1" * 10_000 + "</answer>", "1" * 10_000, "\\boxed{" + "9" * 10_000 + "}", "<answer>\u0661\u0662+\u0663</answer>",
    "\\boxed{\u0661\u0662}", "<answer>((((1+2)</answer>", "\\boxed{(((}", "\\boxed{" * 2000, "(" * 5000, "", " ",
    "<answer>" + "(" * 5000 + "</answer>", "\\boxed{9^{9^{9}}}", "\\boxed{2^{999999999}}", "\\boxed{100000!}",
    "\\boxed{9**9**9}", "<answer></answer>" * 1000, "\\boxed{\\sum_{n=1}^{10^{9}} n}", "<answer>\n\u00b2\u00b3\n</answer>",
]
TEXT_REWARDS = {
    "countdown": dict(target=[23], numbers=[[30, 100, 93]]),
    "math500": dict(answer=["\\frac{1}{2}"]),
    "boxed_accuracy": dict(answer=["12"]),
    "gsm8k": dict(answer=["12"]),
    "gsm8k_accuracy": dict(answer=["12"]),
    "sudoku": dict(puzzle=["3102200002100320"], solution=["3142243142131324"]),
}


@pytest.mark.parametrize("name", sorted(TEXT_REWARDS))
def test_adversarial_completions_never_raise_and_never_reach_sympy(name, monkeypatch):
    """Every adversarial completion gets a finite reward, and none of them is handed to sympy (math-verify), which is
    what keeps them within milliseconds (benchmarks/reward_adversarial.py measures it: under 50 ms each)."""
    from mmrl.rewards import text_math

    parsed = []
    original = text_math._parse_latex
    monkeypatch.setattr(text_math, "_parse_latex", lambda s, t: parsed.append(s) or original(s, t))
    fn, kw = REWARDS[name], TEXT_REWARDS[name]
    for text in ADVERSARIAL:
        out = fn([""], [text], **kw)
        value = out[0]["score"] if isinstance(out[0], dict) else out[0]
        assert isinstance(value, float) and math.isfinite(value), (name, text[:40])
        if name == "countdown":
            assert value == (0.1 if "<answer>" in text else 0.0), text[:40]
    assert parsed == []
    # ordinary answers do go through math-verify
    fn([""], ["\\boxed{\\frac{3}{4}}"], **kw)
    assert parsed == (["\\frac{1}{2}", "\\frac{3}{4}"] if name == "math500" else ["12", "\\frac{3}{4}"]
                      if name == "boxed_accuracy" else [])


def test_math_equal_refuses_code_and_towers_without_calling_sympy():
    assert not math_equal("__import__('os')", "1")
    assert not math_equal("9^{9^{9}}", "1")
    assert math_equal("9^{9^{9}}", "9^{9^{9}}")  # equal as normalised strings, no evaluation needed


# ------------------------------------------------------------------ Sudoku


def test_sudoku_d1_cell_accuracy_by_hand():
    puzzle, solution = "3102200002100320", "3142243142131324"  # blanks at 2, 5, 6, 7, 8, 11, 12, 15
    r = REWARDS["sudoku"]
    comps = [f"<answer>{solution}</answer>", "<answer>\n3142\n2431\n4213\n1324\n</answer>", "<answer>3142243100000000</answer>",
             f"<answer>{puzzle}</answer>", "<answer>3142</answer>", solution, "<answer>x</answer>"]
    got = r([""] * 7, comps, puzzle=[puzzle] * 7, solution=[solution] * 7)
    assert got == [1.0, 1.0, 0.5, 0.0, 1 / 8, 0.0, 0.0]
    assert sudoku_score("<answer>1</answer>", "1234", "1234") == 0.0  # no blanks
    with pytest.raises(ValueError, match="differ in length"):
        sudoku_score("<answer>1</answer>", "0000", "12")


# ------------------------------------------------------------------ RewardSet


def length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def half_applies(prompts, completions, **kwargs):
    return [1.0 if i % 2 == 0 else None for i in range(len(completions))]


def test_weighted_sum_none_and_metrics():
    rs = RewardSet([length_reward, half_applies], [0.5, 2.0])
    out = rs(["p"] * 4, ["a", "bb", "ccc", "dddd"])
    # sample i: 0.5 * len + 2.0 * (1 if i even): 2.5, 1.0, 3.5, 2.0
    assert out.total.tolist() == [2.5, 1.0, 3.5, 2.0]
    assert out.per_reward["length_reward"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out.per_reward["half_applies"][0] == 1.0 and math.isnan(out.per_reward["half_applies"][1])
    assert out.metrics["rewards/length_reward/mean"] == 2.5
    assert out.metrics["rewards/length_reward/std"] == pytest.approx(math.sqrt(5 / 3))  # n - 1 as TRL
    assert out.metrics["rewards/half_applies/mean"] == 1.0 and out.metrics["rewards/half_applies/std"] == 0.0
    assert out.valid.all() and out.total.dtype == torch.float32 and out.total.shape == (4,)


def test_dict_returns_are_logged():
    def scored(prompts, completions, **kw):
        return [{"score": 1.0, "hits": i, "ok": i > 0, "why": "x"} for i in range(len(completions))]

    out = RewardSet([scored])(["p"] * 3, ["a", "b", "c"])
    assert out.total.tolist() == [1.0, 1.0, 1.0]
    assert out.extras["scored/hits"] == [0, 1, 2] and out.extras["scored/why"] == ["x"] * 3
    assert out.metrics["rewards/scored/hits/mean"] == 1.0 and out.metrics["rewards/scored/ok/mean"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad, message", [
    (lambda p, c, **k: [1.0, float("nan"), 1.0], "sample 1: returned nan"),
    (lambda p, c, **k: [1.0, 1.0, float("inf")], "sample 2: returned inf"),
    (lambda p, c, **k: [1.0, 1.0], "returned 2 values for 3 completions"),
    (lambda p, c, **k: [1.0, "high", 1.0], "sample 1: returned str"),
    (lambda p, c, **k: [{"value": 1}, 1.0, 1.0], "sample 0: a dict reward needs a 'score' key"),
    (lambda p, c, **k: 1.0, "returned float"),
    (lambda p, c, **k: [1 / (len(x) - 2) for x in c], "sample 1: raised ZeroDivisionError"),
])
def test_reward_errors_name_the_reward_and_sample(bad, message):
    def broken(prompts, completions, **kwargs):
        return bad(prompts, completions, **kwargs)

    with pytest.raises(RewardError, match=f"reward 'broken'.*{message}" if "sample" in message else message):
        RewardSet([length_reward, broken])(["p"] * 3, ["a", "bb", "ccc"])


def test_drop_mode_marks_bad_samples_invalid():
    def flaky(prompts, completions, **kwargs):
        if any(c == "bad" for c in completions):
            raise RuntimeError("cannot score 'bad'")
        return [2.0] * len(completions)

    out = RewardSet([length_reward, flaky], on_error="drop")(["p"] * 3, ["a", "bad", "ccc"])
    assert out.valid.tolist() == [True, False, True]
    assert out.total.tolist() == [3.0, 0.0, 5.0]
    assert math.isnan(out.per_reward["length_reward"][1])
    assert out.metrics["rewards/length_reward/mean"] == 2.0 and out.metrics["rewards/dropped"] == 1.0


def test_no_applicable_reward_is_unscorable_with_a_warning_naming_the_prompt(caplog):
    """TRL (`GRPOTrainer._calculate_rewards`): a sample every reward returned None for is warned about, not an
    error; it is marked unscorable (the trainer gives it advantage 0)."""
    def never_on_b(prompts, completions, **kwargs):
        return [None if c == "b" else 1.0 for c in completions]

    for mode in ("raise", "drop"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="mmrl.rewards.combine"):
            out = RewardSet([never_on_b], on_error=mode)(["p0", "the prompt of b"], ["a", "b"], answer=["x", "y"])
        assert out.valid.tolist() == [True, True] and out.scorable.tolist() == [True, False]
        assert out.total.tolist() == [1.0, 0.0]
        assert out.metrics["rewards/never_on_b/mean"] == 1.0  # the unscorable sample is not averaged in
        (msg,) = [r.getMessage() for r in caplog.records]
        assert "sample 1" in msg and "the prompt of b" in msg and "'answer': 'y'" in msg


def test_registry_names_and_configuration_errors():
    with pytest.raises(UnknownNameError, match="unknown reward 'gsm9k'.*gsm8k"):
        RewardSet(["gsm9k"])
    with pytest.raises(ValueError, match="already registered"):
        REWARDS.register("gsm8k")(length_reward)
    with pytest.raises(ValueError, match="more than once"):
        RewardSet(["gsm8k", "gsm8k"])
    with pytest.raises(ValueError, match="configuration given for \\['sudoku'\\]"):
        RewardSet(["gsm8k"], sudoku={})
    with pytest.raises(ValueError, match="2 weights for 1 rewards"):
        RewardSet(["gsm8k"], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite number"):
        RewardSet(["gsm8k"], [float("nan")])
    with pytest.raises(ValueError, match="on_error"):
        RewardSet(["gsm8k"], on_error="ignore")
    assert isinstance(REWARDS, Registry)
    expected = {"gsm8k", "gsm8k_xmlcount", "gsm8k_soft_format", "gsm8k_strict_format", "gsm8k_int", "gsm8k_correctness",
                "gsm8k_accuracy", "math500", "math500_correctness", "math500_format", "boxed_accuracy", "countdown", "sudoku",
                "clip_score", "geneval", "geneval_strict", "geneval_partial"}
    assert expected <= set(REWARDS)


def test_registered_function_with_configuration():
    rs = RewardSet(["countdown"], countdown={"numbers": [[1, 2, 3]]})  # bound keyword argument
    assert rs([""], ["<answer>1+2+3</answer>"], target=[6]).total.tolist() == [1.0]


def test_trl_reward_functions_work_unchanged():
    from trl.rewards import think_format_reward

    comps = [[{"role": "assistant", "content": "<think>\nhmm\n</think>\n42"}], [{"role": "assistant", "content": "42"}]]
    out = RewardSet([think_format_reward, "gsm8k_accuracy"])(["q", "q"], comps, answer=["42", "42"])
    assert out.per_reward["think_format_reward"].tolist() == [1.0, 0.0]
    assert out.total.tolist() == [2.0, 1.0]


def test_plain_callables_get_only_the_arguments_they_name_and_trl_logging_hooks():
    seen = {}

    def named_only(completions, ground_truth):
        seen["args"] = (completions, ground_truth)
        return [1.0 if c == g else 0.0 for c, g in zip(completions, ground_truth)]

    def logs(prompts, completions, log_metric, log_extra, **kwargs):
        log_metric("custom/metric", 7)
        log_extra("custom/column", ["x"] * len(completions))
        return [0.0] * len(completions)

    async def async_reward(prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [0.5] * len(completions)

    out = RewardSet([named_only, logs, async_reward])(["p", "p"], ["a", "b"], ground_truth=["a", "c"], unused=[1, 2])
    assert seen["args"] == (["a", "b"], ["a", "c"])
    assert out.total.tolist() == [1.5, 0.5]
    assert out.metrics["custom/metric"] == 7.0 and out.extras["custom/column"] == ["x", "x"]


def test_a_parse_that_timed_out_is_tried_again_not_remembered_as_unparseable(monkeypatch):
    """math-verify returns [] when its timeout fires (a busy machine); remembering that would score a correct answer
    0 for the rest of the run."""
    import math_verify

    from mmrl.rewards import text_math

    real = math_verify.parse
    fired = []

    def parse_timing_out_once(text, *args, **kw):
        if "\\frac{5}{7}" in text and not fired:
            fired.append(text)
            return []  # what math-verify returns on a timeout
        return real(text, *args, **kw)

    monkeypatch.setattr(math_verify, "parse", parse_timing_out_once)
    monkeypatch.setattr(text_math, "_PARSED", {}, raising=False)
    assert text_math.math_equal("\\frac{5}{7}", "\\frac{10}{14}") is False  # the timed-out parse
    assert fired
    assert text_math.math_equal("\\frac{5}{7}", "\\frac{10}{14}") is True


def test_sudoku_violations_by_hand():
    from mmrl.rewards.sudoku import sudoku_violations

    solution = "1234341221434321"  # rows 1234 / 3412 / 2143 / 4321
    puzzle = "1030000221400300"  # givens at cells 0, 2, 7, 8, 9, 10, 13
    assert sudoku_violations(solution, puzzle) == 0
    # one blank cell wrong (cell 1: 2 -> 4): row 0 repeats 4 once, column 1 repeats 4 once, box 0 repeats 4 once
    assert sudoku_violations("1434341221434321", puzzle) == 3
    # a given cell changed (cell 0: 1 -> 2): the given, row 0, column 0 and box 0 each count once
    assert sudoku_violations("2234341221434321", puzzle) == 4
    # a cell left blank ("0") counts once, and its row, column and box do not count it again
    assert sudoku_violations("1034341221434321", puzzle) == 1
    # short answers are padded with blanks: 8 missing cells, 4 of them givens (cells 8, 9, 10, 13)
    assert sudoku_violations("12343412", puzzle) == 8 + 4
    with pytest.raises(ValueError, match="puzzle has 12 cells"):
        sudoku_violations("1" * 12, "0" * 12)


def test_sudoku_solved_and_validity_by_hand():
    """The fully-solved 1 / 0 reward and the verifier reward 1 - violations / (3 x blanks), hand-computed."""
    from mmrl.rewards.sudoku import sudoku_score, sudoku_solved, sudoku_validity

    solution = "1234341221434321"
    puzzle = "1030000221400300"  # 9 blanks
    wrap = lambda d: f"<answer>{d}</answer>"  # noqa: E731
    assert sudoku_solved(wrap(solution), puzzle, solution) == 1.0
    assert sudoku_score(wrap("1434341221434321"), puzzle, solution) == pytest.approx(8 / 9)
    assert sudoku_solved(wrap("1434341221434321"), puzzle, solution) == 0.0  # 8 of 9 right is still 0
    assert sudoku_solved("no answer", puzzle, solution) == 0.0
    assert sudoku_validity(solution, puzzle) == 1.0
    assert sudoku_validity("1434341221434321", puzzle) == pytest.approx(1 - 3 / 27)  # 3 violations, bound 27
    assert sudoku_validity("1034341221434321", puzzle) == pytest.approx(1 - 1 / 27)  # one cell left blank
    assert sudoku_validity("", puzzle) == pytest.approx(1 - 23 / 27)  # 16 cells not a digit, 7 of them givens
    assert sudoku_validity("4" * 16, puzzle) == 0.0  # givens changed: past the bound, clipped at 0
    assert sudoku_validity("", "0" * 16) == pytest.approx(1 - 16 / 48)
    assert sudoku_validity(solution, solution) == 0.0  # no blanks: 0, as sudoku_score


def test_sudoku_validity_is_bounded_and_one_exactly_on_valid_grids():
    """Property: every fill of a puzzle's blanks with digits 0-4 keeps the givens and scores in [0, 1], 1 exactly
    when it is a valid Sudoku (the 4x4 puzzle here has two solutions: the verifier accepts both, the solved 1 / 0
    reward only the stored one)."""
    import itertools
    import random

    from mmrl.rewards.sudoku import sudoku_solved, sudoku_validity

    def valid(g):
        units = ([[r * 4 + c for c in range(4)] for r in range(4)] + [[r * 4 + c for r in range(4)] for c in range(4)]
                 + [[(br + i) * 4 + bc + j for i in range(2) for j in range(2)] for br in (0, 2) for bc in (0, 2)])
        return all(sorted(g[i] for i in u) == list("1234") for u in units)

    solution = "1234341221434321"
    puzzle = "1234000000000000"  # row 0 given, 12 blanks
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    rng = random.Random(0)
    for _ in range(300):
        g = list(puzzle)
        for i in blanks:
            g[i] = rng.choice("01234")
        v = sudoku_validity("".join(g), puzzle)
        assert 0.0 <= v <= 1.0 and (v == 1.0) == valid(g)
    other = "1234341243212143"  # a second valid completion of the same givens
    assert valid(list(other)) and other != solution
    assert sudoku_validity(other, puzzle) == 1.0 and sudoku_solved(f"<answer>{other}</answer>", puzzle, solution) == 0.0
    # the bound is reached: every blank a 1 (column 0 and box 0 / 2 repeat; 3 per blank at most) stays >= 0
    assert all(0.0 <= sudoku_validity("1234" + "".join(f) * 3, puzzle) < 1.0 for f in itertools.product("14", repeat=4))
