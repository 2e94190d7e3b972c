"""Untrusted model output, fuzzed with hypothesis: random and adversarial strings and images through every reward and
parser must not crash (only documented errors, naming the reward and the sample), not hang (a watchdog interrupts
anything that takes minutes), and not execute anything (an audit hook sees no process, no network connection, no
file opened for writing; payloads that would create a marker file leave none).

Bounded: a few dozen examples per property, so the file runs in seconds.
"""
import _thread
import atexit
import contextlib
import faulthandler
import html
import json
import math
import os
import shutil
import sys
import tempfile
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmrl.reporting.credit_viz import text_heatmap_html
from mmrl.geneval.detectors import read_detections
from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES
from mmrl.geneval.prompts import generate_suite, vocabulary
from mmrl.geneval.rules import validate_metadata
from mmrl.rewards import RewardError, RewardSet
from mmrl.rewards.completions import completion_text, prompt_text
from mmrl.rewards.countdown import evaluate_arithmetic
from mmrl.rewards.http import parse_rewards

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
HANG_SECONDS = 60  # a liveness bound, far above any real scoring time (milliseconds)

MARKER_DIR = Path(tempfile.mkdtemp(prefix="mmrl-fuzz-"))
atexit.register(shutil.rmtree, MARKER_DIR, True)
MARKER = MARKER_DIR / "pwned"

# ------------------------------------------------------------------------------- no execution, no hang

_ARMED = threading.Event()
_SEEN: list[str] = []
_FORBIDDEN = ("os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.forkpty", "os.spawn",
              "socket.connect", "socket.bind", "pty.spawn", "ctypes.dlopen")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple) -> None:
    if not _ARMED.is_set():
        return
    if event in _FORBIDDEN:
        _SEEN.append(event)
    elif event == "open" and len(args) >= 3:
        mode, flags = args[1], args[2]
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS):
            _SEEN.append(f"open for writing: {args[0]!r}")


sys.addaudithook(_audit)  # inert unless armed (audit hooks cannot be removed)


@contextlib.contextmanager
def untrusted():
    """Arm the audit hook and a watchdog around scoring untrusted output; fail on a side effect or a hang. A hang in
    Python code is interrupted; one inside C code (which never sees the interrupt) ends the process with a traceback."""
    _SEEN.clear()
    timer = threading.Timer(HANG_SECONDS, _thread.interrupt_main)
    timer.start()
    faulthandler.dump_traceback_later(2 * HANG_SECONDS, exit=True)
    _ARMED.set()
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail(f"hung: no result within {HANG_SECONDS} s")
    finally:
        _ARMED.clear()
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()
    assert not _SEEN, f"side effects while scoring untrusted output: {_SEEN}"
    assert not MARKER.exists(), "a payload in the model output was executed"


# ------------------------------------------------------------------------------- adversarial text

CODE = [f"__import__('os').system('touch {MARKER}')", f"open('{MARKER}', 'w').write('x')", f"exec(\"open('{MARKER}','w')\")",
        f"eval(compile('open(\"{MARKER}\",\"w\")','s','exec'))", "lambda: 0", "().__class__.__bases__[0].__subclasses__()",
        "{0.__class__}", "%s%s%s%n", "${jndi:ldap://x}", "<script>alert(1)</script>", "'; DROP TABLE x; --"]
FRAGMENTS = CODE + [
    "<answer>", "</answer>", "<reasoning>", "</reasoning>", "\n", "\\boxed{", "\\fbox{", "}", "{", "\\frac{", "^", "^{",
    "!", "(", ")", "[", "]", "9", "0", "12", "-", "+", "*", "**", "/", "//", ".", ",", "####", " ", "\\left(", "\\right)",
    "\\sqrt{", "\\sum", "\\int", "\\lim", "x", "\\pi", "\\infty", "=", "1e308", "1e-400", "nan", "inf", "\x00", "\u202e",
    "\u0663", "\u00b2", "\U0001d7d7", "\ufeff", "'", '"', "`", "\\\\", "\\x41", "&#x3c;", "%", "$", "9^{9^{9}}", "100000!",
]
adversarial_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=12), max_size=40).map("".join)
repeated_text = st.builds(lambda parts, n: "".join(parts) * n, st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3),
                          st.integers(1, 3000))
any_text = st.one_of(st.text(max_size=200), adversarial_text, repeated_text)
completion = st.one_of(any_text, any_text.map(lambda t: [{"role": "assistant", "content": t}]))

TEXT_RANGES = {  # reward -> allowed values
    "gsm8k": (-math.inf, 4.0), "gsm8k_accuracy": {0.0, 1.0}, "math500": (0.0, 3.0), "boxed_accuracy": {0.0, 1.0},
    "countdown": {0.0, 0.1, 1.0}, "sudoku": (0.0, 1.0),
}


def _in_range(value: float, allowed) -> bool:
    # per-reward values are float32 (0.1 reads back as 0.10000000149...)
    return any(abs(value - a) <= 1e-6 for a in allowed) if isinstance(allowed, set) else allowed[0] <= value <= allowed[1]


@FUZZ
@given(completions=st.lists(completion, min_size=1, max_size=3), answer=any_text,
       numbers=st.lists(st.integers(-10**6, 10**6), min_size=1, max_size=4), target=st.integers(-10**6, 10**6),
       puzzle=st.text("0123456789", min_size=16, max_size=16), solution=st.text("0123456789", min_size=16, max_size=16))
def test_text_rewards_score_any_completion(completions, answer, numbers, target, puzzle, solution):
    n = len(completions)
    rs = RewardSet(list(TEXT_RANGES))
    with untrusted():
        out = rs([""] * n, completions, answer=[answer] * n, numbers=[numbers] * n, target=[target] * n, puzzle=[puzzle] * n,
                 solution=[solution] * n)
    assert out.valid.all()
    for name, allowed in TEXT_RANGES.items():
        for v in out.per_reward[name].tolist():
            assert math.isfinite(v) and _in_range(v, allowed), (name, v)


# ------------------------------------------------------------------------------- the countdown evaluator

def _leaf(n: int):
    return str(n), Fraction(n), abs(n)


def _combine(a, op, b):
    (sa, va, ma), (sb, vb, mb) = a, b
    if va is None or vb is None or (op == "/" and vb == 0):
        value = None
    else:
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if op == "/" else None}[op]
    mag = max(ma, mb, abs(value) if value is not None else 0)
    return f"({sa}){op}({sb})", value, mag


def _negate(a):
    s, v, m = a
    return f"-({s})", (None if v is None else -v), m


expressions = st.recursive(st.integers(0, 10**4).map(_leaf),
                           lambda sub: st.one_of(st.builds(_combine, sub, st.sampled_from("+-*/"), sub), sub.map(_negate)),
                           max_leaves=12)


@FUZZ
@given(expressions)
def test_countdown_evaluator_agrees_with_exact_arithmetic(expr):
    """The evaluator against exact rational arithmetic on the expression tree that produced the string."""
    text, value, mag = expr
    assume(len(text) <= 512)
    with untrusted():
        got = evaluate_arithmetic(text)
    if value is None:
        assert got is None  # division by zero
    else:
        assert got is not None and math.isclose(got, float(value), rel_tol=1e-9, abs_tol=1e-9 * float(mag)), (text, got, value)


@FUZZ
@given(any_text)
def test_countdown_evaluator_never_raises(text):
    with untrusted():
        got = evaluate_arithmetic(text)
    assert got is None or (isinstance(got, (int, float)) and not isinstance(got, bool))


# ------------------------------------------------------------------------------- what a reward returns

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(10**300, 10**400), st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from([3.4e38, 3.5e38, -1e300, 1e-320]), st.text(max_size=5))
returned_value = st.one_of(
    json_leaf,
    st.dictionaries(st.sampled_from(["score", "note", "x"]), json_leaf, max_size=3),
    st.lists(json_leaf, max_size=2),
    st.floats(width=32, allow_nan=True).map(np.float32),
    st.floats(allow_nan=True).map(torch.tensor),
    st.just(np.zeros(2)),
    st.just(object()),
)


def _classify(v) -> tuple[str, float | None]:
    """What RewardSet must make of one returned value: ("ok", score), ("none", None) (does not apply) or ("bad", None)."""
    if isinstance(v, dict):
        if "score" not in v:
            return "bad", None
        v = v["score"]
    if v is None:
        return "none", None
    if isinstance(v, (np.floating, torch.Tensor)):
        v = float(v)
    if isinstance(v, (bool, int, float)):
        try:
            f = float(v)
        except OverflowError:
            return "bad", None
        return ("ok", f) if math.isfinite(f) and abs(f) <= float(np.finfo(np.float32).max) else ("bad", None)
    return "bad", None  # strings, lists, arrays, objects


@FUZZ
@given(values=st.lists(returned_value, min_size=0, max_size=5), n=st.integers(1, 4), on_error=st.sampled_from(["raise", "drop"]))
def test_reward_set_reports_every_unusable_return(values, n, on_error):
    def judge(prompts, completions, **kw):
        return values

    rs = RewardSet([judge], on_error=on_error)
    kinds = [_classify(v) for v in values]
    try:
        with untrusted():
            out = rs(["p"] * n, ["c"] * n)
    except RewardError as e:
        msg = str(e)
        if len(values) != n:
            assert f"reward 'judge' returned {len(values)} values for {n} completions" in msg
            return
        assert on_error == "raise"
        bad = [i for i, (k, _) in enumerate(kinds) if k == "bad"]
        assert bad, msg  # a None alone is no error (TRL: unscorable, advantage 0)
        assert msg.startswith(f"reward 'judge', sample {bad[0]}: "), msg
        return
    assert len(values) == n
    assert out.valid.tolist() == [k != "bad" for k, _ in kinds]
    assert [bool(out.scorable[i]) for i in range(n) if out.valid[i]] == [k == "ok" for k, _ in kinds if k != "bad"]
    for i, (k, x) in enumerate(kinds):
        assert out.total[i].item() == (pytest.approx(x, rel=1e-6) if k == "ok" else 0.0)


# ------------------------------------------------------------------------------- images

_VOCAB = vocabulary("shapes", {"shapes": (SHAPE_NAMES, COLORS)})
_RECORDS = generate_suite(seed=0, n=12, classnames=_VOCAB[0], colors=_VOCAB[1])
MODES = ["1", "L", "P", "RGB", "RGBA", "I", "F", "LA", "CMYK", "YCbCr", "HSV", "RGBX", "PA"]


@st.composite
def images(draw):
    w, h = draw(st.integers(1, 96)), draw(st.integers(1, 96))
    kind = draw(st.sampled_from(["noise", "flat", "stripes"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "noise":
        arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    elif kind == "flat":
        arr = np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (h, w, 3)).copy()
    else:
        arr = np.zeros((h, w, 3), np.uint8)
        arr[:, ::2] = rng.integers(0, 256, 3, dtype=np.uint8)
    return Image.fromarray(arr, "RGB").convert(draw(st.sampled_from(MODES)))


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    from tiny_vision import tiny_open_clip_dir

    return tiny_open_clip_dir(tmp_path_factory.mktemp("clip"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.one_of(images(), images(), st.sampled_from([None, "not an image", b"\x89PNG", 3.5, [1, 2], np.zeros((4, 4, 3))])),
                      min_size=1, max_size=4),
       record=st.sampled_from(_RECORDS), prompt=any_text)
def test_image_rewards_score_any_image_and_report_anything_else(batch, record, prompt, clip_dir):
    rs = RewardSet(["geneval", "geneval_partial", "clip_score"], on_error="drop",
                   clip_score={"model_name": f"local-dir:{clip_dir}", "batch_size": 2})
    n = len(batch)
    with untrusted():
        out = rs([prompt] * n, batch, metadata=[json.dumps(record)] * n)
    for i, item in enumerate(batch):
        if not isinstance(item, Image.Image):
            assert not out.valid[i]  # reported (dropped), never scored 0
        elif out.valid[i]:
            assert 0.0 <= out.per_reward["geneval"][i] <= 1.0 and 0.0 <= out.per_reward["geneval_partial"][i] <= 1.0
            assert -1.0 <= out.per_reward["clip_score"][i] <= 1.0


def test_image_reward_errors_name_the_reward_and_sample():
    small = Image.new("RGB", (5, 5))
    with pytest.raises(RewardError, match=r"reward 'geneval', sample 1: raised ValueError: image of 5x5 px is smaller than"):
        RewardSet(["geneval"])(["p", "p"], [Image.new("RGB", (96, 96)), small], metadata=[_RECORDS[0]] * 2)
    with pytest.raises(RewardError, match=r"reward 'geneval', sample 0: raised TypeError: GenEval rewards need PIL images"):
        RewardSet(["geneval"])(["p"], ["<svg onload=alert(1)>"], metadata=[_RECORDS[0]])


# ------------------------------------------------------------------------------- parsers of untrusted files and answers

json_like = st.recursive(json_leaf, lambda sub: st.lists(sub, max_size=4) | st.dictionaries(st.text(max_size=8), sub, max_size=4),
                         max_leaves=15)
raw_bytes = st.one_of(st.binary(max_size=300), json_like.map(lambda v: json.dumps(v).encode()),
                      st.lists(json_like, max_size=5).map(lambda v: json.dumps({"rewards": v}).encode()),
                      st.integers(1, 50000).map(lambda k: b"[" * k + b"]" * k))


@FUZZ
@given(raw_bytes)
def test_reward_server_answers_parse_or_fail_cleanly(body):
    with untrusted():
        try:
            rewards = parse_rewards(body)
        except RewardError as e:
            assert "reward server" in str(e)
            return
    assert isinstance(rewards, list)


@FUZZ
@given(lines=st.lists(st.one_of(any_text, json_like.map(json.dumps),
                                st.builds(lambda img, objs: json.dumps({"image": img, "objects": objs}), any_text, st.lists(json_like, max_size=3))),
                      max_size=4))
def test_detections_files_parse_or_fail_naming_the_line(lines):
    path = MARKER_DIR / "dets.jsonl"
    path.write_text("\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines), encoding="utf-8", errors="surrogatepass")
    with untrusted():
        try:
            table = read_detections(path)
        except ValueError as e:
            assert str(path) in str(e)
            return
    assert isinstance(table, dict)


@FUZZ
@given(json_like)
def test_geneval_metadata_validates_or_fails_cleanly(record):
    with untrusted():
        try:
            validate_metadata(record, "metadata[0]")
        except ValueError as e:
            assert "metadata[0]" in str(e)


@FUZZ
@given(json_like)
def test_completion_and_prompt_readers_return_text_or_type_error(value):
    with untrusted():
        for read in (completion_text, prompt_text):
            try:
                assert isinstance(read(value), str)
            except TypeError:
                pass


@FUZZ
@given(tokens=st.lists(st.lists(any_text, max_size=6), min_size=1, max_size=3))
def test_credit_pictures_escape_model_output(tokens):
    credit = [[0.5] * len(row) for row in tokens]
    with untrusted():
        page = text_heatmap_html(tokens, credit, ["<b>title</b>"] * len(tokens), "<i>heading</i>")
    assert "<script" not in page.lower() and "<b>" not in page and "<i>" not in page
    for row in tokens:
        for tok in row:
            assert f">{html.escape(tok)}</span>" in page
