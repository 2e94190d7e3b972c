"""Issue 17, item 16: a frozen peer (SIGSTOP) does not make the other rank wait forever: past `ddp_timeout` it stops
with a message naming the cause and the intact checkpoint."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mmrl.checkpointing.checkpoint import latest_checkpoint

HERE = Path(__file__).resolve().parents[1]  # tests/


def test_a_frozen_peer_stops_the_surviving_rank_with_a_clear_message(tmp_path):
    pid_file = tmp_path / "frozen.pid"
    values = dict(family="causal_lm", method="grpo", max_steps=50, num_generations=4, per_device_train_batch_size=4,
                  max_completion_length=8, save_steps=1, progress_bar=False, report_to=["jsonl"], output_dir=str(tmp_path / "run"),
                  ddp_timeout=5, freeze_rank=1, pid_file=str(pid_file))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(HERE.parent / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(29700 + os.getpid() % 1000), str(HERE / "helpers" / "run_rank_freeze.py"), json.dumps(values)]
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    stopped = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("stopped:"):
                stopped.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert stopped.wait(240), "".join(lines)[-5000:]  # without ddp_timeout rank 0 would wait forever
    finally:
        if pid_file.exists():  # the frozen process would otherwise wait for the launcher's 30 s SIGTERM grace
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(10)
    out = "".join(lines)
    assert proc.returncode != 0
    msg = next(line for line in lines if line.startswith("stopped:"))
    assert "rank 0: another process did not answer within ddp_timeout=5 s" in msg, out[-3000:]
    assert "The last checkpoint, checkpoint-000001, is intact; resume with resume_from=auto" in msg
    assert latest_checkpoint(tmp_path / "run").name == "checkpoint-000001"


def test_sharded_runs_checkpoint_the_gathered_full_weights(tmp_path):
    """FSDP / ZeRO-3: the state dict comes from accelerate's `get_state_dict` (a collective on every process) and
    replaces the shard `save_pretrained` would write; `load_model_weights` reads it back. (accelerate's FSDP runs
    only on accelerator processes, so the launch itself is not exercised on this CPU machine.)"""
    from types import SimpleNamespace

    import torch
    from accelerate.utils import DistributedType

    from mmrl.checkpointing.checkpoint import load_model_weights
    from mmrl.checkpointing.sharded_save import gather_full_state_dict, write_full_weights

    full = torch.nn.Linear(3, 2)
    calls = []

    def get_state_dict(model, unwrap=True):
        calls.append(unwrap)
        return full.state_dict()

    for kind, main in ((DistributedType.FSDP, True), (DistributedType.DEEPSPEED, True), (DistributedType.FSDP, False)):
        acc = SimpleNamespace(distributed_type=kind, is_main_process=main, get_state_dict=get_state_dict)
        state = gather_full_state_dict(acc, full)
        assert (state is not None) == main
    assert calls == [True, True, True]  # every process takes part in the gather
    assert gather_full_state_dict(SimpleNamespace(distributed_type=DistributedType.MULTI_CPU), full) is None
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"a shard")
    write_full_weights(model_dir, gather_full_state_dict(SimpleNamespace(distributed_type=DistributedType.FSDP, is_main_process=True,
                                                                         get_state_dict=get_state_dict), full))
    other = torch.nn.Linear(3, 2)
    load_model_weights(other, model_dir)
    assert torch.equal(other.weight, full.weight) and torch.equal(other.bias, full.bias)
