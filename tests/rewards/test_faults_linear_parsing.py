"""Issue 30, group 4: every built-in text reward parses in linear time.

Two kinds of test: the linear parsers agree with the regexes they replace (the regexes are the reference, on short
random texts where backtracking is cheap), and every built-in text reward scores 1 MB adversarial completions
correctly inside a generous bound. The bound is a subprocess limit far above linear cost (the whole batch takes a
few seconds) and far below quadratic cost (the old parsers need hours at 1 MB: `countdown_accuracy` took 7 s at
32 KB); the test asserts the scores, and the limit only turns a hang into a failure.
"""
import json
import random
import re
import subprocess
import sys
import textwrap

import pytest

from mmrl.rewards.countdown import equation_lhs
from mmrl.rewards.text_math import _SOFT_PATTERN, _STRICT_PATTERN, soft_format_matches, strict_format_matches
from mmrl.tiny_world.shapes_vqa import normalise_answer

AUTHORS_LHS = re.compile(r"([0-9+\-*/() ]+)=[0-9. ]+")  # d1 / DMPO eval/parse_and_get_acc.py


def random_texts(parts, n=4000, max_len=10, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        yield "".join(rng.choice(parts) for _ in range(rng.randint(0, max_len)))


def test_equation_lhs_is_the_authors_regex():
    for text in random_texts(["1", "23", "+", "-", "*", "/", "(", ")", " ", "=", ".", "x", "\n", "=5", "= "]):
        m = AUTHORS_LHS.search(text)
        assert equation_lhs(text) == (m.group(1) if m else None), repr(text)


@pytest.mark.parametrize("dotall", [False, True])
def test_format_matchers_are_d1s_regexes(dotall):
    flags = re.DOTALL if dotall else 0
    soft, strict = re.compile(_SOFT_PATTERN, flags), re.compile(_STRICT_PATTERN, flags)
    parts = ["<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n", " ", "\t", "\xa0", "\x1c", "x", "<reasoning>\n",
             "\n</reasoning>\n", "<answer>\n", "\n</answer>\n", "\n</answer>"]
    for text in random_texts(parts, n=6000, max_len=9, seed=1 + dotall):
        assert soft_format_matches(text, dotall) == bool(soft.match(text)), repr(text)
        assert strict_format_matches(text, dotall) == bool(strict.match(text)), repr(text)


def test_shapes_vqa_normalisation_is_the_regex():
    trailing = re.compile(r"[\s.!?,;:]+$")
    for text in random_texts(["a", "B", " ", ".", "!", "?", ",", ";", ":", "\n", "\xa0", "\u2028", "x y"], seed=3):
        assert normalise_answer(text) == " ".join(trailing.sub("", text.strip().lower()).split()), repr(text)


MEGABYTE = 2**20

SCRIPT = textwrap.dedent("""
    import json, sys
    import mmrl.tiny_world
    mmrl.tiny_world.register()
    from mmrl.rewards import REWARDS
    N = %d
    def rep(s):
        return s * (N // len(s))
    cases = {
        # every start inside a megabyte of digits retries the LHS regex to the run's end; the answer comes after
        "digits_then_equation": rep("1") + "x1+2+3=6",
        "soft_format_retries": "<reasoning>" + rep("</reasoning><answer>") + "</answer>",
        "soft_format_one_line": "<reasoning>" + rep("</reasoning><answer>") + "\\n</answer>",
        "strict_dotall_retries": "<reasoning>\\n" + rep("\\n</reasoning>\\n<answer>\\n"),
        "nested_boxed": rep("\\\\boxed{") + "6" + "}" * (N // len("\\\\boxed{")),
        "unclosed_answers": rep("<answer>") + "1+2+3",
        "trailing_punctuation": "a" + rep(". ") + "b",
    }
    names = sys.argv[1].split(",")
    out = {}
    for name in names:
        for case, text in cases.items():
            r = REWARDS[name](prompts=["p"], completions=[text], target=[6], numbers=[[1, 2, 3]], answer=["6"],
                              puzzle=["0" * 16], solution=["1234" * 4])
            out[name + "/" + case] = r[0]["score"] if isinstance(r[0], dict) else r[0]
    print(json.dumps(out))
""") % MEGABYTE

TEXT_REWARDS = ["countdown", "countdown_accuracy", "countdown3", "countdown3_accuracy", "gsm8k", "gsm8k_multiline",
                "gsm8k_accuracy", "math500", "math500_accuracy", "boxed_accuracy", "sudoku", "sudoku4", "shapes_vqa"]


def test_every_builtin_text_reward_scores_a_megabyte_correctly():
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(TEXT_REWARDS)], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == len(TEXT_REWARDS) * 7
    # the answers that sit behind the adversarial parts are found (hand-derived values)
    assert got["countdown_accuracy/digits_then_equation"] == 1.0  # the LHS "1+2+3" of "1+2+3=6"
    assert got["countdown3_accuracy/digits_then_equation"] == 1.0
    assert got["countdown_accuracy/nested_boxed"] == 0.0  # the last-opened box is the innermost "6": not 1,2,3
    assert got["gsm8k_accuracy/nested_boxed"] == 1.0  # the first box holding a number is the innermost "6"
    assert got["boxed_accuracy/nested_boxed"] == 1.0
    assert got["countdown/unclosed_answers"] == 0.0  # no closed <answer>
    # d1's format terms: the soft pattern matches the first "</reasoning><answer>" and the final "</answer>"
    assert got["gsm8k_multiline/soft_format_retries"] >= 0.5 and got["gsm8k/soft_format_retries"] >= 0.5
    assert got["gsm8k/soft_format_one_line"] < 0.5 <= got["gsm8k_multiline/soft_format_one_line"]  # a newline before </answer>
    assert got["shapes_vqa/trailing_punctuation"] == 0.0
    assert all(isinstance(v, float) for v in got.values())
