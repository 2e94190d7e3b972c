"""A TRL user's reward code runs unchanged: TRL's documented reward examples (standard, conversational,
`trainer_state`, async), TRL's keyword arguments, rewards given by import path, and TRL's truncation rule."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.rewards import RewardSet
from mmrl.training.trainer import Trainer


def base(tmp_path, **kw):
    v = dict(family="causal_lm", method="grpo", max_steps=1, num_generations=4, per_device_train_batch_size=8,
             max_completion_length=6, learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
             report_to=["jsonl"])
    v.update(kw)
    return load_config(None, v)


def tiny_policy(family: str, **kw):
    if family == "masked_diffusion":
        return adapter_class(family).tiny(seed=0, gen_length=8, block_length=4, steps=4, **kw)
    return adapter_class(family).tiny(seed=0, **kw)


def chat_rows(n=8):
    return [{"prompt": [{"role": "user", "content": f"say a {i}"}], "answer": str(i)} for i in range(n)]


def text_rows(n=8):
    return [{"prompt": f"say a {i}", "answer": str(i)} for i in range(n)]


# ---------------------------------------------------------------- TRL's documented reward functions, verbatim

def reward_len(completions, **kwargs):
    """TRL docs, "Using a custom reward function" (standard format)."""
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """TRL docs, "Example 2: Reward completions with a specific format" (conversational format)."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


SEEN: dict[str, list] = {}


def recording_reward(prompts, completions, completion_ids, trainer_state, answer, **kwargs):
    """Records every argument TRL passes; scores by completion length so rewards vary."""
    SEEN.setdefault("calls", []).append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                             step=trainer_state.global_step, max_steps=trainer_state.max_steps,
                                             answer=answer))
    return [float(len(ids)) for ids in completion_ids]


def curriculum_reward(completions, trainer_state, **kwargs):
    """A curriculum reward in the style of TRL's `trainer_state` example: weight grows with training progress."""
    progress = trainer_state.global_step / trainer_state.max_steps
    return [progress * len(c[0]["content"] if isinstance(c, list) else c) for c in completions]


@pytest.mark.parametrize("family", ["causal_lm", "masked_diffusion"])
def test_conversational_prompts_give_trl_message_completions(tmp_path, family):
    SEEN.clear()
    cfg = base(tmp_path, family=family, max_steps=2, **({"max_completion_length": 8, "block_length": 4} if family == "masked_diffusion" else {}))
    t = Trainer(cfg, policy=tiny_policy(family), dataset=chat_rows(),
                reward_funcs=[format_reward_func, recording_reward, curriculum_reward])
    last = t.train()
    calls = SEEN["calls"]
    assert len(calls) == 2
    for call in calls:
        assert all(isinstance(c, list) and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str)
                   for c in call["completions"])
        assert all(isinstance(p, list) and p[0]["role"] == "user" for p in call["prompts"])
        assert len(call["completion_ids"]) == 8 and all(isinstance(i, int) for ids in call["completion_ids"] for i in ids)
        assert call["max_steps"] == 2 and len(call["answer"]) == 8
        assert call["answer"][:4] == [call["answer"][0]] * 4  # a dataset column, repeated G times
    assert [c["step"] for c in calls] == [0, 1]  # trainer_state.global_step: optimizer steps done so far
    assert "rewards/format_reward_func/mean" in last and "rewards/curriculum_reward/mean" in last
    assert last["rewards/curriculum_reward/mean"] > 0  # step 1 of 2: progress 0.5


def test_plain_prompts_keep_string_completions(tmp_path):
    SEEN.clear()
    Trainer(base(tmp_path), policy=tiny_policy("causal_lm"), dataset=text_rows(), reward_funcs=[reward_len, recording_reward]).train()
    (call,) = SEEN["calls"]
    assert all(isinstance(c, str) for c in call["completions"])


@pytest.mark.parametrize("name,text,columns,want", [
    ("gsm8k_correctness", "<reasoning>2+2</reasoning>\n<answer>\n4\n</answer>", {"answer": ["#### 4"]}, 2.0),
    ("gsm8k_accuracy", "<answer>4</answer>", {"answer": ["#### 4"]}, 1.0),
    ("math500_correctness", "<answer>\\boxed{4}</answer>", {"answer": ["\\boxed{4}"]}, 2.0),
    ("boxed_accuracy", "so \\boxed{4}", {"answer": ["4"]}, 1.0),
    ("countdown", "<answer>3*4+5</answer>", {"numbers": [[3, 4, 5]], "target": [17]}, 1.0),
    ("countdown3", "3*4+5", {"numbers": [[3, 4, 5]], "target": [17]}, 1.0),
])
def test_builtin_rewards_accept_both_formats(name, text, columns, want):
    from mmrl.data.tasks import task_names
    from mmrl.rewards import REWARDS

    task_names()  # registers the tiny-world rewards
    fn = REWARDS[name]
    as_text = fn(["q"], [text], **columns)
    as_chat = fn([[{"role": "user", "content": "q"}]], [[{"role": "assistant", "content": text}]], **columns)
    as_text = [v["score"] if isinstance(v, dict) else v for v in as_text]
    as_chat = [v["score"] if isinstance(v, dict) else v for v in as_chat]
    assert as_text == as_chat == [want]


# -------------------------------------------------------------------------------------------- async rewards

_EVENT: dict[str, asyncio.Event] = {}


async def waits_for_other(completions, **kwargs):
    """Returns only once `sets_event` has run: sequential execution (one asyncio.run after another) times out."""
    await asyncio.wait_for(_EVENT["e"].wait(), timeout=2.0)
    return [1.0] * len(completions)


async def sets_event(completions, **kwargs):
    await asyncio.sleep(0.05)
    _EVENT["e"].set()
    return [0.5] * len(completions)


def _fresh_event():
    _EVENT["e"] = asyncio.Event()


def test_async_rewards_run_concurrently():
    _fresh_event()
    out = RewardSet([waits_for_other, sets_event])(["p", "q"], ["a", "b"])
    assert out.total.tolist() == [1.5, 1.5]


def test_async_reward_concurrency_is_wall_clock_of_the_slowest():
    async def slow_a(completions, **kw):
        await asyncio.sleep(0.4)
        return [1.0] * len(completions)

    async def slow_b(completions, **kw):
        await asyncio.sleep(0.4)
        return [2.0] * len(completions)

    t0 = time.perf_counter()
    out = RewardSet([slow_a, slow_b])(["p"], ["a"])
    assert time.perf_counter() - t0 < 0.7  # sequential would take >= 0.8 s
    assert out.total.tolist() == [3.0]


def test_async_reward_timeout_and_error_are_reported():
    from mmrl.rewards import RewardError

    async def never(completions, **kw):
        await asyncio.sleep(10)

    with pytest.raises(RewardError, match="never.*timeout"):
        RewardSet([never], timeout=0.2)(["p"], ["a"])

    async def broken(completions, **kw):
        raise ZeroDivisionError("boom")

    with pytest.raises(RewardError, match="broken.*sample 0.*boom"):
        RewardSet([broken])(["p"], ["a"])


def test_async_reward_in_trainer(tmp_path):
    _fresh_event()
    last = Trainer(base(tmp_path), policy=tiny_policy("causal_lm"), dataset=text_rows(),
                   reward_funcs=[waits_for_other, sets_event, reward_len]).train()
    assert last["rewards/waits_for_other/mean"] == 1.0 and last["rewards/sets_event/mean"] == 0.5


# ------------------------------------------------------------------------------------ rewards by import path

REWARD_FILE = '''
def correctness(prompts, completions, answer, **kwargs):
    return [1.0 if a in (c[0]["content"] if isinstance(c, list) else c) else 0.0 for c, a in zip(completions, answer)]
'''


def test_reward_by_dotted_and_file_path(tmp_path, monkeypatch):
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text(REWARD_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rs = RewardSet(["my_pkg.rewards.correctness"])
    assert rs.names == ["correctness"]
    assert rs(["p", "q"], ["x 1", "y"], answer=["1", "2"]).total.tolist() == [1.0, 0.0]
    rs = RewardSet([f"{pkg / 'rewards.py'}:correctness"])
    assert rs(["p"], [[{"role": "assistant", "content": "7"}]], answer=["7"]).total.tolist() == [1.0]


def test_reward_import_errors_name_the_path(tmp_path):
    from mmrl.config.train_config import ConfigError

    with pytest.raises(ConfigError, match="no_such_pkg.rewards.fn.*does not import"):
        load_config(None, {"reward_funcs": ["no_such_pkg.rewards.fn"], "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="missing.py.*not found"):
        load_config(None, {"reward_funcs": [f"{tmp_path}/missing.py:fn"], "output_dir": str(tmp_path)})
    (tmp_path / "r.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="has no attribute 'fn'"):
        load_config(None, {"reward_funcs": [f"{tmp_path}/r.py:fn"], "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="unknown rewards \\['nope'\\]"):
        load_config(None, {"reward_funcs": ["nope"], "output_dir": str(tmp_path)})


def test_cli_train_with_reward_by_import_path(tmp_path):
    """`mmrl train` in a fresh process, as a user runs it: a reward file by path, and a package by dotted path."""
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    (tmp_path / "pkg_r").mkdir()
    (tmp_path / "pkg_r" / "__init__.py").write_text(REWARD_FILE.replace("def correctness", "def has_answer"))
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"say {i}"}], "answer": str(i)}) + "\n" for i in range(8)))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "task=jsonl", f"dataset_path={data}",
                          "--reward_funcs", f"{tmp_path}/my_rewards.py:correctness", "pkg_r.has_answer", "--max_steps", "1",
                          "num_generations=2", "per_device_train_batch_size=4", "max_completion_length=6",
                          f"output_dir={tmp_path / 'run'}", "progress_bar=false", "report_to=[jsonl]"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "rewards/correctness/mean" in rec and "rewards/has_answer/mean" in rec


def test_two_rewards_with_one_name_are_refused(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARD_FILE)
    (tmp_path / "pkg_r").mkdir()
    (tmp_path / "pkg_r" / "__init__.py").write_text(REWARD_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="appear more than once"):
        RewardSet([f"{tmp_path}/my_rewards.py:correctness", "pkg_r.correctness"])


# ------------------------------------------------------------------------------------------- truncation (TRL)

def test_responses_ending_with_eos_are_not_truncated(tmp_path):
    """8 responses that all end with EOS: clipped_ratio 0 and none is masked. Every token id is an EOS, so each
    response is one EOS token: as long as the longest response of the batch (the old rule called all truncated)."""
    policy = tiny_policy("causal_lm")
    policy.generation_defaults["eos_token_id"] = list(range(policy.vocab_size))
    cfg = base(tmp_path, mask_truncated_completions=True)
    t = Trainer(cfg, policy=policy, dataset=text_rows(), reward_funcs=[reward_len])
    last = t.train()
    assert t.buffer.rollout.response_ids.shape == (8, 1)
    assert last["completions/clipped_ratio"] == 0.0
    assert torch.equal(t.buffer.loss_mask, t.buffer.rollout.response_mask)  # nothing masked
    assert last["completions/mean_terminated_length"] == 1.0


def test_masked_diffusion_truncation_is_no_eos_in_the_span(tmp_path):
    policy = tiny_policy("masked_diffusion")
    eos_all = [i for i in range(policy.vocab_size) if i != policy.mask_token_id]
    policy.eos_token_ids = eos_all  # every generated token ends the answer
    cfg = base(tmp_path, family="masked_diffusion", max_completion_length=8, block_length=4, mask_truncated_completions=True)
    t = Trainer(cfg, policy=policy, dataset=text_rows(), reward_funcs=[reward_len])
    last = t.train()
    assert last["completions/clipped_ratio"] == 0.0
    assert torch.equal(t.buffer.loss_mask, t.buffer.rollout.response_mask)


def test_length_metrics_by_hand():
    from mmrl.reporting.completions import length_metrics

    m = length_metrics(torch.tensor([3, 5, 5, 2]), torch.tensor([True, True, False, False]))
    assert m["completions/clipped_ratio"] == 0.5
    assert (m["completions/mean_terminated_length"], m["completions/min_terminated_length"], m["completions/max_terminated_length"]) == (4.0, 3.0, 5.0)
    assert (m["completions/mean_length"], m["completions/min_length"], m["completions/max_length"]) == (3.75, 2.0, 5.0)
    none = length_metrics(torch.tensor([4, 4]), torch.tensor([False, False]))
    assert none["completions/clipped_ratio"] == 1.0 and none["completions/mean_terminated_length"] == 0.0


def test_truncated_responses_are_masked_when_asked(tmp_path):
    """The other way round: with a third of the ids as EOS and 3 new tokens, some responses end with EOS and some
    do not; exactly those without EOS lose their tokens, whatever their length."""
    policy = tiny_policy("causal_lm", max_new_tokens=3)
    policy.generation_defaults["eos_token_id"] = list(range(0, policy.vocab_size, 3))
    cfg = base(tmp_path, mask_truncated_completions=True, max_completion_length=3)
    t = Trainer(cfg, policy=policy, dataset=text_rows(), reward_funcs=[reward_len])
    last = t.train()
    term = t.buffer.rollout.extras["terminated"]
    kept = t.buffer.loss_mask.any(-1)
    assert 0 < int(term.sum()) < 8  # both kinds in the batch
    assert torch.equal(kept, term)  # exactly the responses without EOS lose their tokens
    assert last["completions/clipped_ratio"] == pytest.approx(float((~term).float().mean()))


# ------------------------------------------------------------------------------------------ completions table

def test_log_completions_writes_the_table(tmp_path):
    cfg = base(tmp_path, log_completions=True, report_to=["jsonl", "tensorboard"], max_steps=2)
    def reward_len(completions, **kwargs):  # TRL's length reward, conversational format
        return [-abs(20 - len(completion[0]["content"])) for completion in completions]

    Trainer(cfg, policy=tiny_policy("causal_lm"), dataset=chat_rows(), reward_funcs=[reward_len, format_reward_func]).train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] * 8 + [2] * 8
    for r in rows:
        assert r["prompt"].startswith("say a ") and isinstance(r["completion"], str)
        assert r["rewards"]["reward_len"] == -abs(20 - len(r["completion"]))  # TRL's reward, recomputed by hand
        assert r["rewards"]["format_reward_func"] == 0.0
        assert r["reward"] == r["rewards"]["reward_len"]
    for g in range(4):  # group advantages (r - mean) / (std + 1e-6) recomputed from the logged rewards
        grp = rows[4 * g : 4 * g + 4]
        r = torch.tensor([x["reward"] for x in grp], dtype=torch.float64)
        want = (r - r.mean()) / (r.std() + 1e-6)
        assert [x["advantage"] for x in grp] == pytest.approx(want.tolist(), abs=1e-4)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    assert any("completions" in tag for tag in acc.Tags()["tensors"])


# ---------------------------------------------------------------------------------------------------- trackers

def test_trackers_go_through_accelerate_and_wandb_resumes_the_same_run(tmp_path, monkeypatch):
    from accelerate import tracking

    started = []

    class FakeWandB(tracking.GeneralTracker):  # stands in for wandb (not installed here), same constructor call
        name = "wandb"
        requires_logging_directory = False
        main_process_only = False

        def __init__(self, run_name, **kwargs):
            super().__init__()
            self.kwargs, self.logged, self.tables = dict(kwargs, project=run_name), [], []

        def start(self):
            started.append(self)

        @property
        def tracker(self):
            return self

        def log(self, values, step=None, **kw):
            self.logged.append((step, dict(values)))

        def log_table(self, table_name, columns=None, data=None, dataframe=None, step=None, **kw):
            self.tables.append((table_name, columns, data, step))

        def finish(self):
            pass

    monkeypatch.setitem(tracking.LOGGER_TYPE_TO_CLASS, "wandb", FakeWandB)
    kw = dict(report_to=["jsonl", "wandb"], log_completions=True, save_steps=1)
    Trainer(base(tmp_path, max_steps=1, **kw), policy=tiny_policy("causal_lm"), dataset=text_rows(), reward_funcs=[reward_len]).train()
    Trainer(base(tmp_path, max_steps=2, resume_from="auto", **kw), policy=tiny_policy("causal_lm"), dataset=text_rows(),
            reward_funcs=[reward_len]).train()
    first, second = started
    assert first.kwargs["id"] == second.kwargs["id"] and second.kwargs["resume"] == "allow"
    assert first.kwargs["dir"] == str(tmp_path) and first.kwargs["project"] == "mmrl" and first.kwargs["config"]["max_steps"] == 1
    assert [s for s, _ in first.logged] == [1] and [s for s, _ in second.logged] == [2]
    assert "reward" in second.logged[0][1] and "completions/clipped_ratio" in second.logged[0][1]
    name, columns, data, step = second.tables[0]
    assert name == "completions" and columns[:3] == ["step", "prompt", "completion"] and len(data) == 8 and step == 2
    # a fresh run in a new directory gets a new W&B run
    Trainer(base(tmp_path / "new", max_steps=1, **kw), policy=tiny_policy("causal_lm"), dataset=text_rows(), reward_funcs=[reward_len]).train()
    assert started[2].kwargs["id"] != first.kwargs["id"]


def test_report_to_accepts_accelerate_tracker_names():
    from mmrl.config.train_config import ConfigError

    assert load_config(None, {"report_to": ["jsonl", "mlflow", "trackio"]}).report_to == ["jsonl", "mlflow", "trackio"]
    with pytest.raises(ConfigError, match="unknown sinks \\['tensorbord'\\]"):
        load_config(None, {"report_to": ["tensorbord"]})
