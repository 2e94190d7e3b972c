"""Issue 30, groups 5 and 6: nothing lost at the edges of a run. An evaluation error at the final step keeps that
step's checkpoint; a rerun moves the earlier log aside instead of deleting it; the logs are fsynced before every
checkpoint; a full disk is named with the path; resume streams the logs and skips damaged lines."""
import json
import os
import tracemalloc

import pytest

from mmrl.checkpointing.checkpoint import list_checkpoints
from mmrl.config.train_config import load_config
from mmrl.reporting.metrics_log import MetricLogger, keep_records_up_to, read_metrics
from mmrl.models import adapter_class
from mmrl.core.registry import REWARDS
from mmrl.training.trainer import Trainer, TrainingError
from tiny_world_fixtures import dataset_for, vowel_reward

BASE = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
            learning_rate=1e-4, progress_bar=False, report_to=["jsonl"])


def make(run, reward=vowel_reward, **kw):
    cfg = load_config(None, {**BASE, "output_dir": str(run), **kw})
    evaluated = bool(kw.get("eval_steps"))
    return Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                   reward_funcs=[reward], eval_dataset=list(dataset_for("causal_lm"))[:2] if evaluated else None,
                   eval_metric="faults_eval_metric" if evaluated else None)


def failing_metric(prompts, completions, **kw):
    raise RuntimeError("the metric's server is down")


def test_an_evaluation_error_at_the_final_step_keeps_that_steps_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setitem(REWARDS, "faults_eval_metric", failing_metric)
    t = make(tmp_path / "run", max_steps=2, save_steps=100, eval_steps=100)  # evaluated only at the final step
    with pytest.raises(TrainingError, match=r"evaluation at step 2 failed .*checkpoint was written first.*checkpoint-000002"):
        t.train()
    assert [c.name for c in list_checkpoints(tmp_path / "run")] == ["checkpoint-000002"]
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2]


def test_a_rerun_before_the_first_checkpoint_moves_the_earlier_log_aside(tmp_path):
    calls = {"n": 0}

    def fails_on_the_second_batch(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ValueError("reward bug")
        return [1.0 if i % 2 else 0.0 for i in range(len(completions))]

    run = tmp_path / "run"
    with pytest.raises(Exception):
        make(run, reward=fails_on_the_second_batch, max_steps=3, save_steps=100).train()
    assert not list_checkpoints(run)
    first = (run / "metrics.jsonl").read_bytes()
    assert [json.loads(x)["step"] for x in first.splitlines()] == [1]
    make(run, max_steps=1, resume_from="auto").train()  # nothing to resume yet: a fresh run in the same directory
    assert (run / "metrics.previous-1.jsonl").read_bytes() == first  # the earlier log kept, byte for byte
    assert [r["step"] for r in read_metrics(run)] == [1]


def test_the_logs_are_fsynced_before_each_checkpoint(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    make(tmp_path / "run", max_steps=2, save_steps=1).train()
    metrics = str(tmp_path / "run" / "metrics.jsonl")
    first_ckpt = next(i for i, p in enumerate(synced) if "checkpoint-000001" in p)
    assert metrics in synced[:first_ckpt]  # step 1's record is on disk before checkpoint 1 is
    assert synced.count(metrics) >= 2  # and again before checkpoint 2


def test_a_full_disk_is_named_with_the_log_path(tmp_path):
    log = MetricLogger(tmp_path, ["jsonl"])
    os.symlink("/dev/full", log.path)  # every write to /dev/full fails with ENOSPC, as on a full disk
    with pytest.raises(OSError, match=rf"No space left on device while appending to {tmp_path}/metrics\.jsonl.*resume_from=auto"):
        log.log(1, {"loss": 1.0})


def test_resume_skips_a_damaged_line_and_a_cut_trailing_line(tmp_path):
    run = tmp_path / "run"
    make(run, max_steps=2, save_steps=1, log_completions=True).train()
    for name in ("metrics.jsonl", "completions.jsonl"):
        with open(run / name, "ab") as f:
            f.write(b'{"step": 1, "note": "caf\xe9"}\n{"step": 2, "loss": 0.')  # a non-UTF-8 byte, then a cut line
    ck = list_checkpoints(run)[0]
    make(run, max_steps=2, save_steps=1, log_completions=True, resume_from=str(ck)).train()
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    for line in (run / "completions.jsonl").read_bytes().splitlines():
        json.loads(line.decode("utf-8"))  # every line left is valid


def test_resume_streams_a_large_log(tmp_path):
    path = tmp_path / "completions.jsonl"
    line = json.dumps({"step": 1, "completion": "x" * 4000}) + "\n"
    with open(path, "w") as f:
        for step in (1, 2):
            f.write(line.replace('"step": 1', f'"step": {step}') * 2500)  # 2 x 10 MB
    tracemalloc.start()
    keep_records_up_to(path, 1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert path.stat().st_size == len(line) * 2500
    assert peak < 2**20  # one line at a time, not the 20 MB file
