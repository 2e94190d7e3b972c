"""SIGTERM and Ctrl-C (SIGINT): the current step finishes, a checkpoint of it is written, the run stops, and a resume
continues from it; a second Ctrl-C stops at once with the last checkpoint intact."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from mmrl.checkpointing.checkpoint import latest_checkpoint, load_checkpoint
from mmrl.config.train_config import load_config
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer, TrainingStopped
from tiny_world_fixtures import dataset_for, vowel_reward


def cfg_for(tmp_path, **kw):
    values = dict(method="grpo", family="causal_lm", max_steps=4, num_generations=4, per_device_train_batch_size=8,
                  max_completion_length=8, learning_rate=1e-3, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
                  report_to=["jsonl"])
    return load_config(None, {**values, **kw})


def signalling_reward(at_call: int, *signals: int):
    """A reward that sends itself `signals` on its `at_call`-th call (during that step's rollout)."""
    calls = {"n": 0}

    def reward(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == at_call:
            for s in signals:
                os.kill(os.getpid(), s)
        return vowel_reward(prompts, completions)

    return reward


def run(cfg, reward):
    return Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[reward]).train()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_finishes_the_step_writes_a_checkpoint_and_resume_continues(sig, tmp_path):
    before = signal.getsignal(sig)
    with pytest.raises(TrainingStopped) as e:
        run(cfg_for(tmp_path), signalling_reward(2, sig))
    assert isinstance(e.value, KeyboardInterrupt) and e.value.signum == sig
    assert f"stopped by {signal.Signals(sig).name} after step 2; checkpoint written to" in str(e.value)
    assert signal.getsignal(sig) is before  # the handlers are put back
    ck = latest_checkpoint(tmp_path)
    assert ck == e.value.checkpoint and load_checkpoint(ck)["state"]["step"] == 2  # save_steps=0: written for the stop
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    run(cfg_for(tmp_path, resume_from="auto"), vowel_reward)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_second_ctrl_c_stops_at_once_and_keeps_the_last_checkpoint(tmp_path):
    with pytest.raises(KeyboardInterrupt) as e:
        run(cfg_for(tmp_path, save_steps=1), signalling_reward(2, signal.SIGINT, signal.SIGINT))
    assert not isinstance(e.value, TrainingStopped) and "second Ctrl-C" in str(e.value)
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["step"] == 1  # step 2 was never finished


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_mmrl_train_process_stops_with_a_checkpoint(sig, tmp_path):
    rows = [{"nums": [3, 4, 5], "target": 17}, {"nums": [2, 9, 7], "target": 25}, {"nums": [6, 1, 8], "target": 14}]
    (tmp_path / "cd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "mmrl.cli", "train", "method=grpo", "task=countdown", "family=causal_lm",
                             "model_name_or_path=tiny", "max_steps=100000", "num_generations=2", "per_device_train_batch_size=4",
                             "max_completion_length=8", f"output_dir={run_dir}", "progress_bar=false", "save_steps=0",
                             f"dataset_path={tmp_path / 'cd.jsonl'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    try:
        deadline = time.monotonic() + 300
        while len(read_metrics(run_dir)) < 2:  # training is under way (the handlers are installed)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err[-3000:]
    last = read_metrics(run_dir)[-1]["step"]
    assert f"mmrl train: stopped by {signal.Signals(sig).name} after step {last}; checkpoint written to" in err
    assert "Traceback" not in err
    ck = latest_checkpoint(run_dir)
    assert ck.name == f"checkpoint-{last:06d}" and load_checkpoint(ck)["state"]["step"] == last


def test_a_signal_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """Under DDP only rank 1 is signalled; the stop is agreed (an all-reduce), so rank 0 stops after the same step and
    writes the checkpoint, instead of waiting forever for a process that left."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1]  # tests/
    values = dict(family="causal_lm", method="grpo", max_steps=50, num_generations=4, per_device_train_batch_size=4,
                  max_completion_length=8, save_steps=0, progress_bar=False, report_to=["jsonl"], output_dir=str(tmp_path),
                  signal_rank=1)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(here.parent / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(29600 + os.getpid() % 1000), str(here / "helpers" / "run_rank_signal.py"), json.dumps(values)]
    # a process that stopped alone would leave the other waiting in a collective: the timeout turns that into a failure
    r = subprocess.run(cmd, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-5000:]
    for rank in (0, 1):
        assert f"rank {rank}: stopped by SIGTERM after step 2; checkpoint written to" in r.stdout, r.stdout + r.stderr[-3000:]
    assert [rec["step"] for rec in read_metrics(tmp_path)] == [1, 2]
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["step"] == 2
