"""Issue 17, items 1-5: damaged checkpoints are found and skipped, resume settings are checked, one trainer per
output_dir, seeds are range-checked. Tiny causal LM, CPU, a few steps each."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch

from mmrl.checkpointing.checkpoint import CheckpointDamaged, list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint
from mmrl.config.train_config import ConfigError, load_config
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.checkpointing.resume_settings import ResumeWarning
from mmrl.checkpointing.run_lock import LOCK_NAME, RunLock, RunLocked, remove_unfinished_run
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward

BASE = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
            learning_rate=1e-4, progress_bar=False, save_steps=1, save_total_limit=2, report_to=["jsonl"])


def make(run, **kw):
    cfg = load_config(None, {**BASE, "output_dir": str(run), **kw})
    return Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A finished 2-step run with checkpoints 1 and 2 (copied by each test before it is damaged)."""
    run = tmp_path_factory.mktemp("base") / "run"
    make(run, max_steps=2).train()
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-000001", "checkpoint-000002"]
    return run


def copy_run(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst)
    return dst


def damage_tensor_bytes(path):
    """Overwrite the last 64 bytes (tensor data; the safetensors header at the start stays intact) with random bytes."""
    data = bytearray(path.read_bytes())
    data[-64:] = os.urandom(64)
    path.write_bytes(bytes(data))


def weights_finite(trainer):
    return all(bool(torch.isfinite(p).all()) for p in trainer.policy.unwrapped.parameters())


# ------------------------------------------------------------------------------------------- 1. silent damage

def test_manifest_records_every_file_and_detects_a_flipped_byte(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    ck = list_checkpoints(run)[-1]
    manifest = json.loads((ck / "manifest.json").read_text())["files"]
    on_disk = sorted(p.relative_to(ck).as_posix() for p in ck.rglob("*") if p.is_file() and p.name != "manifest.json")
    assert sorted(manifest) == on_disk and "model/model.safetensors" in manifest and "optimizer.pt" in manifest
    assert verify_checkpoint(ck) is True
    damage_tensor_bytes(ck / "model" / "model.safetensors")
    with pytest.raises(CheckpointDamaged, match=r"model/model\.safetensors does not match its SHA-256"):
        verify_checkpoint(ck)


def test_damaged_latest_checkpoint_falls_back_to_the_previous_one_and_is_kept_aside(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    damage_tensor_bytes(run / "checkpoints" / "checkpoint-000002" / "model" / "model.safetensors")
    t = make(run, max_steps=3, resume_from="auto")
    with pytest.warns(RuntimeWarning, match=r"checkpoint-000002: model/model\.safetensors does not match") as rec:
        t.train()
    assert any("moved aside" in str(w.message) for w in rec)
    assert weights_finite(t)
    steps = [r["step"] for r in read_metrics(run)]
    assert steps == [1, 2, 3]  # resumed from step 1: steps 2 and 3 retrained
    assert all(math.isfinite(r["loss"]) for r in read_metrics(run))
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-000002", "checkpoint-000003"]
    for ck in list_checkpoints(run):
        assert verify_checkpoint(ck)
    kept = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".damaged-checkpoint-000002-")]
    assert len(kept) == 1  # the damaged copy is kept for inspection, out of the listing


def test_no_intact_checkpoint_stops_naming_every_damaged_file_and_deletes_nothing(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    for ck in list_checkpoints(run):
        damage_tensor_bytes(ck / "optimizer.pt")
    t = make(run, max_steps=3, resume_from="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(CheckpointDamaged, match=r"no intact checkpoint.*checkpoint-000002: optimizer\.pt.*checkpoint-000001: optimizer\.pt"):
            t.train()
    assert [p.name for p in list_checkpoints(run)] == ["checkpoint-000001", "checkpoint-000002"]
    assert not (run / LOCK_NAME).exists()  # the lock was released


def test_rotation_never_deletes_the_checkpoint_just_written(tmp_path):
    """Resuming an older step next to a stale newer checkpoint: keep=1 used to delete the new checkpoint itself."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (1, 3, 2):
        save_checkpoint(tmp_path, step, save_model=lambda p: p.mkdir(), optimizer=opt, scheduler=sched, buffer=None,
                        state={"step": step}, keep=1)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert "checkpoint-000002" in names and "checkpoint-000001" not in names


# ------------------------------------------------------------------------------------------- 2. corrupt latest

def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


CORRUPTIONS = {
    "truncated_safetensors": ("model/model.safetensors", _truncate),
    "missing_optimizer": ("optimizer.pt", lambda p: p.unlink()),
    "truncated_optimizer": ("optimizer.pt", _truncate),
    "broken_trainer_state": ("trainer_state.json", lambda p: p.write_text('{"step": 2, "rollout')),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
@pytest.mark.parametrize("manifest", [True, False], ids=["verified", "no_manifest"])
def test_corrupt_latest_checkpoint_is_named_and_skipped(two_step_run, tmp_path, kind, manifest):
    """With a manifest the checksum check names the file; without one (older checkpoints) reading it does."""
    run = copy_run(two_step_run, tmp_path)
    rel, corrupt = CORRUPTIONS[kind]
    latest = run / "checkpoints" / "checkpoint-000002"
    if not manifest:
        for ck in list_checkpoints(run):
            (ck / "manifest.json").unlink()
    corrupt(latest / rel)
    t = make(run, max_steps=2, resume_from="auto")
    name = rel.split("/")[-1].replace(".", r"\.")
    with pytest.warns(RuntimeWarning, match=rf"checkpoint-000002.*{name}"):
        t.train()
    assert weights_finite(t) and t.step == 2
    assert [r["step"] for r in read_metrics(run)] == [1, 2]


def test_explicit_resume_from_a_damaged_checkpoint_stops_naming_the_file(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    ck = run / "checkpoints" / "checkpoint-000001"
    (ck / "scheduler.pt").unlink()
    t = make(run, max_steps=2, resume_from=str(ck))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(CheckpointDamaged, match=r"checkpoint-000001: scheduler\.pt is missing"):
            t.train()


# ------------------------------------------------------------------------------------------- 3. resume settings

def test_changed_learning_rate_on_resume_keeps_the_checkpoints_and_records_it(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    t = make(run, max_steps=3, resume_from="auto", learning_rate=0.01)
    with pytest.warns(ResumeWarning, match=r"learning_rate=0\.0001 \(not 0\.01\)"):
        t.train()
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert load_checkpoint(list_checkpoints(run)[-1])["state"]["config"]["learning_rate"] == pytest.approx(1e-4)


def test_other_changed_settings_are_applied_with_a_warning(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    t = make(run, max_steps=3, resume_from="auto", epsilon=0.3)
    with pytest.warns(ResumeWarning, match=r"epsilon 0\.2 -> 0\.3"):
        t.train()
    assert load_checkpoint(list_checkpoints(run)[-1])["state"]["config"]["epsilon"] == 0.3


@pytest.mark.parametrize("field,value", [("seed", 7), ("num_generations", 2), ("method", "dr_grpo")])
def test_settings_that_fix_the_run_are_refused_on_resume_before_the_model_loads(two_step_run, tmp_path, field, value):
    run = copy_run(two_step_run, tmp_path)
    cfg = load_config(None, {**BASE, "output_dir": str(run), "max_steps": 3, "resume_from": "auto", field: value,
                             "model_name_or_path": str(tmp_path / "no-model-needed")})
    with pytest.raises(ConfigError, match=rf"cannot resume .*{field}={value!r} \(the checkpoint has"):
        Trainer(cfg, dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])


def test_longer_max_steps_on_resume_is_silent(two_step_run, tmp_path):
    run = copy_run(two_step_run, tmp_path)
    t = make(run, max_steps=3, resume_from="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        t.train()
    assert t.step == 3


# ------------------------------------------------------------------------------------------- 4. one trainer per dir

def test_a_second_trainer_on_the_same_output_dir_is_refused_until_the_first_finishes(tmp_path):
    first = make(tmp_path, max_steps=1)
    with pytest.raises(RunLocked, match=rf"in use by another trainer \(pid {os.getpid()} on"):
        make(tmp_path, max_steps=1, resume_from="auto")
    first.train()
    assert not (tmp_path / LOCK_NAME).exists()  # released on exit
    make(tmp_path, max_steps=2, resume_from="auto").train()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_lock_left_by_a_killed_process_is_stale_and_taken_over(tmp_path):
    code = ("import sys, time; from mmrl.checkpointing.run_lock import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(RunLocked, match=rf"pid {p.pid} on"):
            RunLock(tmp_path).acquire()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {p.pid}")  # the file outlives its killed owner ...
    deadline = time.time() + 10
    while True:  # ... but its lock does not (the kernel releases it with the process)
        try:
            lock = RunLock(tmp_path).acquire()
            break
        except RunLocked:
            assert time.time() < deadline
            time.sleep(0.05)
    assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()}")
    lock.release()



def test_an_unfinished_run_is_removed_but_not_a_live_one(tmp_path):
    """The comparison runners clear a stopped run's folder before running it again (`remove_unfinished_run`); a folder
    a live trainer holds is refused, with its files and its lock intact (a second job on the same output used to
    delete the running job's lock and train beside it into the same files)."""
    run = tmp_path / "arm-seed0"
    (run / "checkpoints" / "step-3").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    live = RunLock(run).acquire()  # another open file description: conflicts like another process
    try:
        with pytest.raises(RunLocked, match="in use by another trainer"):
            remove_unfinished_run(run)
        assert (run / "metrics.jsonl").exists() and (run / "checkpoints" / "step-3").is_dir()
        assert (run / LOCK_NAME).read_text().startswith(f"pid {os.getpid()}")
    finally:
        live.release()
    remove_unfinished_run(run)  # stopped: nothing holds it
    assert not run.exists()
    remove_unfinished_run(run)  # absent: nothing to do

# ------------------------------------------------------------------------------------------- 5. seed range

@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_seed_out_of_range_is_refused(seed, tmp_path):
    with pytest.raises(ConfigError, match=rf"seed={seed} must be an integer in \[0, 2\*\*63 - 1\]"):
        load_config(None, {**BASE, "output_dir": str(tmp_path), "seed": seed})


def test_largest_seed_trains_and_evaluates(tmp_path):
    from mmrl.training.evaluate import evaluate

    policy = adapter_class("causal_lm").tiny(seed=0)
    res = evaluate(policy, [{"prompt": "say a"}, {"prompt": "say b"}], "gsm8k_int", progress=False, seed=2**63 - 1,
                   max_new_tokens=4, temperature=1.0)
    assert len(res.scores) == 2
