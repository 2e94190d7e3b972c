"""Issue 30, group 11: multi-process checkpoints keep what accelerate's `save_state` keeps per process: every random
generator's state (Python, numpy, torch CPU, CUDA) and, when the optimizer is sharded, each process's optimizer shard,
written atomically under the checkpoint's manifest and restored on resume.

Real 2-process CPU launches (gloo): the trainer under DDP (`accelerate launch`, `configs/accelerate/cpu_ddp.yaml`) is
killed after step 2 and resumed; FSDP2 (`fully_shard` over gloo, which accelerate does not run on CPU) is stopped
and resumed through the same checkpoint writer. Both end bitwise where an uninterrupted run ends."""
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmrl.checkpointing.checkpoint import (CheckpointDamaged, CheckpointIncompatible, latest_checkpoint, load_checkpoint,
                                           verify_checkpoint, write_manifest)
from mmrl.checkpointing.rank_state import Ranks
from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.reporting.metrics_log import read_metrics
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward

HERE = Path(__file__).resolve().parents[1]  # tests/
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
DDP = dict(method="grpo", family="causal_lm", max_steps=4, save_steps=2, num_generations=4, per_device_train_batch_size=4,
           max_completion_length=8, learning_rate=1e-2, progress_bar=False, dynamic_sampling=False, seed=3,
           report_to=["jsonl"])


def launch(values: dict, port_offset: int, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, **({"MMRL_KILL_AT": kill_at} if kill_at else {})}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(HERE.parent / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(29500 + (os.getpid() + port_offset) % 1000),
           str(HERE / "helpers" / "run_rank_rng.py"), json.dumps(values)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def torchrun(helper: str, args: list[str], port_offset: int) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(29500 + (os.getpid() + port_offset) % 1000), str(HERE / "helpers" / helper), *args]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]


def comparable(run: Path) -> dict[int, dict]:
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("perf/")} for r in read_metrics(run)}


def weights(ck: Path) -> dict:
    return load_file(str(next((ck / "model").glob("*.safetensors"))))


def assert_same(a, b, what: str) -> None:
    """Nested dicts / lists / tuples of tensors and plain values, equal bitwise."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), what
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_same(a[k], b[k], f"{what}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{i}]")
    else:
        assert a == b, what


def test_two_process_run_killed_after_step_2_resumes_every_generator_of_every_rank(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    r = launch({**DDP, "output_dir": str(ref)}, 0)
    assert r.returncode == 0, r.stderr[-4000:]
    r = launch({**DDP, "output_dir": str(run)}, 1, kill_at="after_step:2")  # SIGKILL on both ranks, after checkpoint 2
    assert r.returncode != 0 and latest_checkpoint(run).name == "checkpoint-000002" and not (run / "draws-0.json").exists()
    ck2 = latest_checkpoint(run)
    assert {"rng_state_0.pt", "rng_state_1.pt"} <= set(json.loads((ck2 / "manifest.json").read_text())["files"])
    saved = [load_checkpoint(ck2, rank)["rng"] for rank in (0, 1)]
    assert set(saved[0]) >= {"python", "numpy", "torch"}
    assert not torch.equal(saved[0]["python"]["state"], saved[1]["python"]["state"])  # each rank its own generators
    assert not torch.equal(saved[0]["torch"], saved[1]["torch"])
    r = launch({**DDP, "output_dir": str(run), "resume_from": "auto"}, 2)
    assert r.returncode == 0, r.stderr[-4000:]
    # the reward drew from every generator of every rank at every step: the metrics match only if all were restored
    assert sorted(comparable(ref)) == [1, 2, 3, 4] and comparable(run) == comparable(ref)
    for rank in (0, 1):
        assert json.loads((run / f"draws-{rank}.json").read_text()) == json.loads((ref / f"draws-{rank}.json").read_text())
    assert json.loads((ref / "draws-0.json").read_text()) != json.loads((ref / "draws-1.json").read_text())
    a, b = latest_checkpoint(ref), latest_checkpoint(run)
    assert_same(weights(a), weights(b), "weights")
    for rank in (0, 1):
        x, y = load_checkpoint(a, rank), load_checkpoint(b, rank)
        for part in ("rng", "optimizer", "scheduler"):
            assert_same(x[part], y[part], f"rank {rank} {part}")
        for ck in (x, y):  # the buffer's timings differ by nature
            ck["buffer"]["metrics"] = {k: v for k, v in ck["buffer"]["metrics"].items() if not k.startswith("perf/")}
        assert_same(x["buffer"], y["buffer"], f"rank {rank} buffer")
        assert {**x["state"], "config": None} == {**y["state"], "config": None}  # (the configs name their output_dir)

    # a per-rank file missing or damaged: named in one line (the manifest covers it)
    bad = tmp_path / "bad"
    shutil.copytree(ck2, bad)
    (bad / "rng_state_1.pt").unlink()
    with pytest.raises(CheckpointDamaged, match=r"rng_state_1\.pt is missing") as e:
        verify_checkpoint(bad)
    assert "\n" not in str(e.value)
    shutil.copy(ck2 / "rng_state_1.pt", bad / "rng_state_1.pt")
    data = bytearray((bad / "rng_state_1.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (bad / "rng_state_1.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointDamaged, match=r"rng_state_1\.pt does not match its SHA-256 checksum"):
        verify_checkpoint(bad)
    # without a manifest, reading the file names it (on the rank that needs it)
    (bad / "manifest.json").unlink()
    (bad / "rng_state_1.pt").unlink()
    assert load_checkpoint(bad, 0)["rng"]["torch"].numel() > 0
    with pytest.raises(CheckpointDamaged, match=r"rng_state_1\.pt is missing"):
        load_checkpoint(bad, 1)
    with pytest.raises(CheckpointIncompatible, match="written by 2 processes; this run has 1"):
        load_checkpoint(bad, 0, world=1)
    # ... so in two processes, rank 0 would resume it and rank 1 the intact older one: both stop, naming the choices
    split = tmp_path / "split"
    shutil.copytree(ck2, split / "checkpoints" / "checkpoint-000002")
    shutil.copytree(bad, split / "checkpoints" / "checkpoint-000003")
    torchrun("run_resume_choice.py", [str(split)], 3)
    for rank in (0, 1):
        msg = (split / f"choice-{rank}.txt").read_text()
        assert msg.startswith("CheckpointDamaged: the processes resumed different checkpoints") and "\n" not in msg, msg
        assert "rank 0: " + str(split / "checkpoints" / "checkpoint-000003") in msg
        assert "rank 1: " + str(split / "checkpoints" / "checkpoint-000002") in msg
    assert (split / "checkpoints" / "checkpoint-000003").is_dir()  # nothing moved aside before the processes agree


def test_fsdp2_sharded_optimizer_resumes_bitwise(tmp_path):
    """FSDP2 over gloo: each rank saves its own optimizer shard (uneven: 5 rows split 3 + 2) and its generators; fresh
    processes resuming checkpoint 2 (the full weights sliced into the shards by `load_model_weights`) end at step 4
    with the parameters, optimizer shards and next random draws of the run that went on."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref.mkdir()
    torchrun("run_fsdp2_resume.py", [str(ref), "4", "2", "0"], 10)  # 4 steps, checkpoint at step 2 written on the way
    ck = latest_checkpoint(ref)
    names = set(json.loads((ck / "manifest.json").read_text())["files"])
    assert {"optimizer_shard_0.pt", "optimizer_shard_1.pt", "rng_state_0.pt", "rng_state_1.pt"} <= names
    assert "optimizer.pt" not in names
    shards = [load_checkpoint(ck, rank, world=2, sharded=True)["optimizer"]["state"] for rank in (0, 1)]
    shapes = [[tuple(s["exp_avg"].shape) for _, s in sorted(sh.items())] for sh in shards]
    assert shapes == [[(8, 6), (8,), (3, 16), (3,)], [(8, 6), (8,), (2, 16), (2,)]]  # a real shard on each rank
    with pytest.raises(CheckpointIncompatible, match="per-process optimizer shards"):
        load_checkpoint(ck, 0, world=2, sharded=False)
    run.mkdir()
    shutil.copytree(ref / "checkpoints", run / "checkpoints")
    torchrun("run_fsdp2_resume.py", [str(run), "4", "0", "1"], 11)  # fresh processes: resume checkpoint 2, train steps 3-4
    for rank in (0, 1):
        a = torch.load(ref / f"final-{rank}.pt", weights_only=True)
        b = torch.load(run / f"final-{rank}.pt", weights_only=True)
        assert_same(a, b, f"rank {rank}")
        assert not torch.equal(a["optimizer"]["state"][0]["exp_avg"], shards[rank][0]["exp_avg"])  # steps 3-4 did move


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory):
    """A 3-step single-process run with checkpoints at steps 2 and 3."""
    run = tmp_path_factory.mktemp("one") / "run"
    Trainer(config(run, 3), policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
            reward_funcs=[vowel_reward]).train()
    return run


def config(run: Path, max_steps: int, **extra):
    return load_config(None, {**DDP, "max_steps": max_steps, "output_dir": str(run), **extra})


def resumed(run: Path, max_steps: int):
    return Trainer(config(run, max_steps, resume_from="auto"), policy=adapter_class("causal_lm").tiny(seed=0),
                   dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])


def copy_until_step_2(src: Path, dest: Path) -> Path:
    dest.mkdir()
    shutil.copytree(src / "checkpoints" / "checkpoint-000002", dest / "checkpoints" / "checkpoint-000002")
    lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    (dest / "metrics.jsonl").write_text("".join(line for line in lines if json.loads(line)["step"] <= 2))
    return dest / "checkpoints" / "checkpoint-000002"


def test_an_older_checkpoint_without_rank_files_resumes_with_a_warning(one_process_run, tmp_path):
    run = tmp_path / "run"
    ck = copy_until_step_2(one_process_run, run)
    # what an older mmrl wrote: rng.pt (torch's CPU state only), no rng_state_<i>.pt, no rank_files record
    torch.save(torch.load(ck / "rng_state_0.pt", weights_only=True)["torch"], ck / "rng.pt")
    (ck / "rng_state_0.pt").unlink()
    state = json.loads((ck / "trainer_state.json").read_text())
    del state["rank_files"]
    (ck / "trainer_state.json").write_text(json.dumps(state))
    (ck / "manifest.json").unlink()
    write_manifest(ck)
    with pytest.raises(CheckpointIncompatible, match="older mmrl, which saved only the main process's optimizer shard"):
        load_checkpoint(ck, sharded=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed(run, 3).train()
    assert any("written by an older mmrl: it holds torch's CPU RNG state only" in str(w.message) for w in caught)
    assert comparable(run) == comparable(one_process_run)  # the trainer's own streams are derived from (seed, step)


def test_a_missing_rank_file_stops_the_resume_in_one_line(one_process_run, tmp_path):
    run = tmp_path / "run"
    ck = copy_until_step_2(one_process_run, run)
    (ck / "rng_state_0.pt").unlink()
    with pytest.raises(CheckpointDamaged) as e:
        resumed(run, 3).train()
    msg = str(e.value)
    assert "rng_state_0.pt is missing" in msg and "no intact checkpoint to resume from" in msg and "\n" not in msg


class RankZeroOfTwo(Ranks):
    """Rank 0 of a 2-process run whose rank 1 failed to write its files: the collectives' results as rank 0 receives
    them (a real failure on another process needs a launch; the collectives themselves are torch.distributed's)."""

    def __init__(self):
        super().__init__(0, 2)

    def broadcast(self, obj):
        return obj

    def gather(self, obj):
        return [obj, "OSError: [Errno 28] No space left on device"]


def test_a_write_failing_on_another_rank_fails_the_checkpoint_and_keeps_the_previous(tmp_path):
    from mmrl.checkpointing.checkpoint import CheckpointWriteFailed, save_checkpoint

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def save(step, ranks):
        return save_checkpoint(tmp_path, step, save_model=lambda p: p.mkdir(), optimizer=opt, scheduler=sched, buffer=None,
                               state={"step": step}, keep=2, ranks=ranks)

    first = save(1, Ranks())
    with pytest.raises(CheckpointWriteFailed, match=r"writing checkpoint 2 .* failed on rank 1: OSError: \[Errno 28\] No "
                                                    r"space left on device; the previous checkpoint is intact"):
        save(2, RankZeroOfTwo())
    assert latest_checkpoint(tmp_path) == first and verify_checkpoint(first)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [first.name]  # the partial copy is gone
