"""countdown4_steps (issue 25, item 1): splits, exact reward on hand-written answers, decisive-token marks."""
import pytest
import torch

import mmrl.tiny_world.tasks  # noqa: F401  registers the tiny-world tasks
from mmrl.core.registry import REWARDS
from mmrl.data.tasks import load_task
from mmrl.tiny_world import countdown_steps as cs
from mmrl.tiny_world.tasks import multiset

# 3,7,8,2 -> 25 by (8-2)*3+7, written by hand in the task's format
RIGHT = "8-2:8-2-0=6=6|6*3:6*3+0=18=18=18|18+7:8+7+0=15,1+0+1=2=25"
NUMS, TARGET = [3, 7, 8, 2], 25


def test_workings_digit_by_digit():
    assert cs.add_working(48, 37) == "8+7+0=15,4+3+1=8"
    assert cs.sub_working(42, 17) == "12-7-0=5,4-1-1=2"
    assert cs.mul_working(12, 13) == "2*3+0=6,1*3+0=3=36;2*1+0=2,1*1+0=1=12;36+120:6+0+0=6,3+2+0=5,0+1+0=1=156"
    assert cs.step_text(156, "/", 12) == "156/12:q=13," + cs.mul_working(13, 12) + "=13"
    assert cs.step_text(7, "/", 2) is None and cs.step_text(8, "-", 8) is None and cs.step_text(3, "-", 5) is None


def test_reward_exact_on_hand_written_answers():
    assert cs.score(RIGHT, NUMS, TARGET) == 1.0
    assert cs.score(RIGHT.replace("1+0+1=2=25", "1+0+1=3=35"), NUMS, 35) == 0.0  # wrong arithmetic (and result)
    assert cs.score(RIGHT.replace("8+7+0=15", "8+7+0=14"), NUMS, TARGET) == 0.0  # one wrong column, right result
    assert cs.score(RIGHT, NUMS, 24) == 0.0  # right working, wrong final value
    assert cs.score(RIGHT.replace("8-2:8-2-0=6=6", "9-3:9-3-0=6=6"), NUMS, TARGET) == 0.0  # 9 is not in the pool
    assert cs.score(RIGHT, [3, 7, 8, 8], TARGET) == 0.0  # 2 is not in the pool
    for bad in ["", "25", RIGHT.split("|", 1)[1], RIGHT + "|", RIGHT.replace(":", "", 1), "8-2=6|6*3=18|18+7=25"]:
        assert cs.score(bad, NUMS, TARGET) == 0.0, bad
    assert REWARDS.get("countdown4_steps")(["p", "p"], [RIGHT, RIGHT], target=[25, 24], numbers=[NUMS, NUMS]) == [1.0, 0.0]


def test_decisive_mask_marks_the_step_headers():
    mask = cs.decisive_mask(RIGHT)
    assert len(mask) == len(RIGHT) == 57
    assert {i for i, m in enumerate(mask) if m} == {0, 1, 2, 14, 15, 16, 33, 34, 35, 36}
    assert "".join(c for c, m in zip(RIGHT, mask) if m) == "8-26*318+7"
    with pytest.raises(ValueError, match="header"):
        cs.decisive_mask("garbage")


def test_splits_disjoint_and_demonstrations_valid():
    task = load_task("countdown4_steps")
    keys = {k: {multiset(r["numbers"]) for r in getattr(task, k)} for k in ("train", "validation", "test")}
    assert len(task.validation) == len(task.test) == cs.HELD_OUT == len(keys["validation"]) == len(keys["test"])
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"] and not keys["validation"] & keys["test"]
    for r in task.train[:500] + task.validation + task.test:
        assert cs.ANSWER_CHARS[0] <= len(r["solution"]) <= cs.ANSWER_CHARS[1]
        assert cs.score(r["solution"], r["numbers"], r["target"]) == 1.0
        assert r["prompt"] == ",".join(map(str, r["numbers"])) + f"={r['target']}"


def test_base_spec_trains_on_the_demonstrations_within_its_span():
    from mmrl.tiny_world.models import _training_pairs, spec_for

    spec = spec_for("countdown4-steps-ar")
    prompts, targets = _training_pairs(spec)
    task = load_task("countdown4_steps")
    assert prompts == [r["prompt"] for r in task.train] and targets == [r["solution"] for r in task.train]
    assert max(len(t) for t in targets) + 1 <= spec.gen_length  # char tokenizer: one token a character, plus EOS


def test_version_2_keeps_results_to_two_digits():
    from mmrl.tiny_world.tasks import TASK_VERSIONS

    assert TASK_VERSIONS["countdown4_steps"] == 2 and cs.MAX_VALUE == 99
    for r in load_task("countdown4_steps").train[:300]:
        results = [int(s.rsplit("=", 1)[1]) for s in r["solution"].split(cs.STEP_SEP)]
        assert max(results) <= cs.MAX_VALUE and results[-1] == r["target"] and 10 <= r["target"] <= 99


def test_base_recipe_trims_each_batch_to_its_longest_row_without_changing_the_loss():
    import copy

    from mmrl.models import adapter_class
    from mmrl.tiny_world.models import spec_for
    from mmrl.tiny_world.pretrain import causal_sft

    spec = spec_for("countdown4-steps-ar")
    assert spec.recipe == {"trim_padding": True} and spec.steps == 1500 and spec.family == "causal_lm"
    prompts, targets = ["1,2,3,4=10", "5,6,7,8=26", "9,1,2,3=15", "2,2,2,2=16"], ["1+2", "5+6:6+5+0=11", "9", "2*2:x=4|4*4"]
    a = adapter_class("causal_lm").tiny(seed=0)
    b = copy.deepcopy(a)
    widths = []
    b.model.register_forward_pre_hook(lambda m, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    full = causal_sft(a, prompts, targets, steps=4, batch_size=2, progress=False, seed=3)
    trimmed = causal_sft(b, prompts, targets, steps=4, batch_size=2, progress=False, seed=3, trim_padding=True)
    longest = max(len(p) + len(t) for p, t in zip(prompts, targets)) + 1  # + EOS (char tokenizer)
    assert max(widths) <= longest and min(widths) < longest  # some batch was cut
    torch.testing.assert_close(torch.tensor([h["loss"] for h in trimmed]), torch.tensor([h["loss"] for h in full]),
                               rtol=1e-4, atol=1e-5)
