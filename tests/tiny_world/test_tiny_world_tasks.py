"""Tiny-world tasks: generated data is valid, splits do not leak, rewards are d1's rules on the bare answer."""
import itertools

import pytest

from mmrl.data.tasks import load_task
from mmrl.rewards.countdown import countdown_score
from mmrl.rewards.sudoku import sudoku_score
from mmrl.tiny_world.tasks import all_grids, count_solutions, countdown3, solutions, sudoku4, sudoku_split


def valid_grid(g: str) -> bool:
    rows = [g[4 * r : 4 * r + 4] for r in range(4)]
    cols = ["".join(g[4 * r + c] for r in range(4)) for c in range(4)]
    boxes = ["".join(g[4 * r + c] for r in range(br, br + 2) for c in range(bc, bc + 2)) for br in (0, 2) for bc in (0, 2)]
    return all(sorted(u) == list("1234") for u in rows + cols + boxes)


def test_all_288_grids():
    grids = all_grids()
    assert len(grids) == len(set(grids)) == 288
    assert all(valid_grid(g) for g in grids)
    # brute force over row permutations agrees on the count: two-row bands whose boxes and columns are valid, then
    # every pair of bands, checked whole by `valid_grid` (96 x 96 candidates instead of 24^4)
    perms = ["".join(p) for p in itertools.permutations("1234")]
    bands = [a + b for a in perms for b in perms
             if all(x != y for x, y in zip(a, b)) and set(a[:2] + b[:2]) == set("1234")]
    brute = {top + bottom for top in bands for bottom in bands if valid_grid(top + bottom)}
    assert len(bands) == 96 and brute == set(grids)


def test_sudoku4_split_is_by_solution_grid():
    train_grids, val_grids, test_grids = sudoku_split(0)
    assert (len(train_grids), len(val_grids), len(test_grids)) == (201, 29, 58)
    assert set(train_grids) | set(val_grids) | set(test_grids) == set(all_grids())
    assert not set(train_grids) & set(test_grids) and not set(val_grids) & (set(train_grids) | set(test_grids))
    task = load_task("sudoku4")
    sols = {name: {r["solution"] for r in rows} for name, rows in
            (("train", task.train), ("validation", task.validation), ("test", task.test))}
    assert sols["test"] <= set(test_grids) and sols["train"] <= set(train_grids) and sols["validation"] <= set(val_grids)
    assert len(task.validation) == 256 and len(task.test) == 512
    for r in task.test[:50] + task.train[:50] + task.validation[:50]:
        assert 6 <= r["puzzle"].count("0") <= 10
        assert all(p in ("0", s) for p, s in zip(r["puzzle"], r["solution"]))
        assert count_solutions(r["puzzle"]) == 1
    assert len({r["puzzle"] for r in task.test}) == len(task.test)
    d1 = load_task("sudoku4_d1")
    assert not {r["solution"] for r in d1.validation} & {r["solution"] for r in d1.test}


def test_sudoku4_reward_is_d1_on_the_bare_answer():
    row = load_task("sudoku4").test[0]
    sol, puz = row["solution"], row["puzzle"]
    blanks = [i for i, ch in enumerate(puz) if ch == "0"]
    wrong_one = list(sol)
    wrong_one[blanks[0]] = "1" if sol[blanks[0]] != "1" else "2"
    wrong_one = "".join(wrong_one)
    got = sudoku4(None, [sol, wrong_one, "", "12"], [puz] * 4, [sol] * 4)
    assert got[0] == 1.0 and got[1] == pytest.approx(1 - 1 / len(blanks)) and got[2] == 0.0
    assert got == [sudoku_score(f"<answer>{c}</answer>", puz, sol) for c in [sol, wrong_one, "", "12"]]


def test_countdown3_split_is_by_number_multiset():
    task = load_task("countdown3")
    ms = lambda rows: [tuple(sorted(r["numbers"])) for r in rows]  # noqa: E731
    train, val, test = set(ms(task.train)), ms(task.validation), ms(task.test)
    assert len(test) == len(set(test)) == 500 and len(val) == len(set(val)) == 500  # one problem per held-out multiset
    assert not train & set(test) and not train & set(val) and not set(val) & set(test)
    assert len(task.train) > 9000
    d1 = load_task("countdown3_d1")
    assert not set(ms(d1.train)) & set(ms(d1.test)) and not set(ms(d1.validation)) & set(ms(d1.test))
    sols = [r["solution"] for r in task.train[:300]]
    scores = countdown3(None, sols, [r["target"] for r in task.train[:300]], [r["numbers"] for r in task.train[:300]])
    assert scores == [1.0] * 300
    # the solver: (3, 4, 5) reaches 17 = 3*4+5 and 60 = 3*4*5, never 0 or negatives
    s = solutions([3, 4, 5])
    assert 17 in s and 60 in s and all(t > 0 for t in s)
    assert countdown_score(f"<answer>{s[17]}</answer>", [3, 4, 5], 17) == 1.0
    assert countdown3(None, ["1+2"], [17], [[3, 4, 5]]) == [0.1]


def test_shapes_split_holds_out_compositions_under_the_geneval_rules():
    from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES
    from mmrl.geneval.prompts import parse_prompt
    from mmrl.tiny_world.shapes_split import canonical, compositions

    task = load_task("shapes")
    splits = {"train": task.train, "validation": task.validation, "test": task.test}
    tags = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
    for tag in tags:  # a real test: at least 20 test prompts in every GenEval task
        assert sum(r["metadata"]["tag"] == tag for r in task.test) >= 20, tag
    # every row's metadata is what the GenEval parser reads from its prompt
    for rows in splits.values():
        for r in rows[::7]:
            assert parse_prompt(r["prompt"], SHAPE_NAMES, COLORS) == r["metadata"]
    units = {k: set().union(*(compositions(r["metadata"]) for r in rows)) for k, rows in splits.items()}
    meanings = {k: {canonical(r["metadata"]) for r in rows} for k, rows in splits.items()}
    for held in ("validation", "test"):
        # no held-out composition (pairing, count pair, shape pair) is named by any training prompt ...
        assert not units[held] & units["train"]
        # ... so no held-out meaning is a training meaning, apart from single_object (nothing to hold out)
        shared = meanings[held] & meanings["train"]
        assert shared and all(m[0] == "single_object" for m in shared)
        # distinct meanings: no held-out prompt is a paraphrase of another
        rows = [r for r in splits[held] if r["metadata"]["tag"] != "single_object"]
        assert len({canonical(r["metadata"]) for r in rows}) == len(rows)
    assert not units["validation"] & units["test"]
    # every shape, colour and count still appears in training
    train_units = units["train"]
    assert {u[2] for u in train_units if u[0] == "pairing"} == set(SHAPE_NAMES)
    assert {u[1] for u in train_units if u[0] == "pairing"} == set(COLORS)
    assert {u[1] for u in train_units if u[0] == "count"} == {2, 3, 4, 5, 6}


def test_canonical_meaning_identifies_paraphrases_and_mirrored_relations():
    from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES
    from mmrl.geneval.prompts import parse_prompt
    from mmrl.tiny_world.shapes_split import canonical

    c = lambda p: canonical(parse_prompt(p, SHAPE_NAMES, COLORS))  # noqa: E731
    assert c("a photo of a circle and a square") == c("a photo of a square and a circle")
    assert c("a photo of a circle right of a square") == c("a photo of a square left of a circle")
    assert c("a photo of a ring below a tee") == c("a photo of a tee above a ring")
    assert c("a photo of a ring below a tee") != c("a photo of a ring above a tee")
    assert c("a photo of a red tee and a blue ring") == c("a photo of a blue ring and a red tee")
    assert c("a photo of a red tee and a blue ring") != c("a photo of a blue tee and a red ring")
    assert c("a photo of three tees") != c("a photo of four tees")


def test_d1_test_files_load_in_tiny_format():
    s = load_task("sudoku4_d1")
    assert len(s.test) == 500 and all(len(r["puzzle"]) == 16 for r in s.test)
    assert not {r["solution"] for r in s.train} & {r["solution"] for r in s.test}
    c = load_task("countdown3_d1")
    assert len(c.test) == 256 and c.test[0]["numbers"] == [30, 100, 93] and c.test[0]["target"] == 23


def test_count_solutions_equals_a_scan_of_every_grid():
    """The bitmask count against the definition: the grids that agree with every given cell, capped at `limit`."""
    import random

    rng = random.Random(0)
    grids = all_grids()

    def scan(puzzle, limit):
        return min(sum(all(p == "0" or p == q for p, q in zip(puzzle, g)) for g in grids), limit)

    puzzles = ["0" * 16, grids[5], grids[5][:15] + "0", "5" + "0" * 15, "11" + "0" * 14]
    for _ in range(300):
        g = rng.choice(grids)
        blanks = set(rng.sample(range(16), rng.randint(0, 16)))
        puzzles.append("".join("0" if i in blanks else (str(rng.randint(1, 4)) if rng.random() < 0.1 else ch)
                               for i, ch in enumerate(g)))
    for p in puzzles:
        for limit in (1, 2, 3, 300):
            assert count_solutions(p, limit) == scan(p, limit), (p, limit)
    assert count_solutions("0" * 16, 1000) == 288 and count_solutions(grids[5]) == 1


def test_sudoku4_posed_to_a_causal_lm_pairs_the_same_puzzles_and_reward(monkeypatch):
    """The causal family's pre-training rows are the masked-diffusion base's puzzles with the puzzle in the prompt
    and the whole solution as the target; the sudoku4 reward scores that target 1.0 and the bare puzzle 0."""
    import dataclasses

    from mmrl.tiny_world import tasks
    from mmrl.tiny_world.models import TINY_MODELS, _training_pairs
    from mmrl.tiny_world.tasks import SUDOKU_PROMPT, sudoku4_causal_row

    real = tasks.sudoku_puzzles  # the real generator, 200 puzzles instead of 8000 (the test's time)
    monkeypatch.setattr(tasks, "sudoku_puzzles", lambda grids, n, blanks, seed: real(grids, 200, blanks, seed))
    md = TINY_MODELS["sudoku4"]
    md_prompts, md_targets = _training_pairs(md)
    ar_prompts, ar_targets = _training_pairs(dataclasses.replace(md, family="causal_lm"))
    assert ar_targets == md_targets and len(ar_prompts) == len(md_prompts) == 200
    for p, q, t in zip(md_prompts[:50], ar_prompts[:50], ar_targets[:50]):
        puzzle = p["response_template"].replace("<mask>", "0")
        assert q == f"{SUDOKU_PROMPT} {puzzle}" and len(puzzle) == len(t) == 16
        assert all(c == "0" or c == s for c, s in zip(puzzle, t))  # the givens are the solution's
    row = sudoku4_causal_row(puzzle, t)
    assert sudoku4(None, [t, puzzle], [row["puzzle"]] * 2, [row["solution"]] * 2) == [1.0, 0.0]


def test_sudoku4_strong_is_sudoku4_trained_longer_and_sudoku4_is_unchanged():
    """The competent Sudoku base differs from `sudoku4` only in its steps; `sudoku4`'s cache key (the build behind
    the earlier tables and other runs) stays the one it had."""
    import dataclasses

    from mmrl.tiny_world.models import TINY_MODELS

    weak, strong = TINY_MODELS["sudoku4"], TINY_MODELS["sudoku4-strong"]
    assert weak.key() == "26175176bd" and strong.steps == 8 * weak.steps
    same = dataclasses.replace(strong, name=weak.name, steps=weak.steps, description=weak.description)
    assert same == weak
    mid = TINY_MODELS["sudoku4-mid"]  # the base with headroom for RL: only the steps differ too
    assert mid.steps == 2 * weak.steps
    assert dataclasses.replace(mid, name=weak.name, steps=weak.steps, description=weak.description) == weak
