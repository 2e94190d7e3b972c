"""Two CPU processes launched by accelerate (gloo) give the same parameters after one step as one process on the same
global batch (tolerance 1e-5).

accelerate's `--cpu --num_processes 2` starts several processes only through mpirun; without MPI the launch is the
torchrun one (`--multi_gpu --num_processes 2`, or `configs/accelerate/cpu_ddp.yaml`), and the trainer selects gloo
because no accelerator is present."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parents[1]  # tests/
# Adam's first update is lr * g / (|g| + eps): with the default eps = 1e-8 it is lr * sign(g), so a gradient that is 0
# up to rounding (summation order differs between 1 and 2 processes) could flip by 2 * lr. A larger eps makes the
# update smooth in g, so the comparison tests the gradients, not the sign of rounding noise.
BASE = dict(family="causal_lm", max_steps=1, num_generations=4, gradient_accumulation_steps=1, learning_rate=1e-3,
            adam_epsilon=1e-3, max_completion_length=8, save_steps=0, progress_bar=False, dynamic_sampling=False, seed=5)


def weights(run_dir: Path) -> dict:
    ck = sorted((run_dir / "checkpoints").glob("checkpoint-*"))[-1]
    return load_file(next((ck / "model").glob("*.safetensors")))


@pytest.mark.parametrize("method,loss_type", [("grpo", "grpo"), ("dapo", "dapo"), ("dmpo", None)])
def test_two_processes_equal_one(method, loss_type, tmp_path):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    extra = {"loss_type": loss_type} if loss_type else {}
    one = {**BASE, **extra, "method": method, "per_device_train_batch_size": 16, "output_dir": str(tmp_path / "one")}
    two = {**BASE, **extra, "method": method, "per_device_train_batch_size": 8, "output_dir": str(tmp_path / "two")}
    r = subprocess.run([sys.executable, str(HERE / "helpers" / "run_tiny_training.py"), json.dumps(one)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(HERE.parent / "configs/accelerate/cpu_ddp.yaml"),
           "--main_process_port", str(29500 + os.getpid() % 1000),
           str(HERE / "helpers" / "run_tiny_training.py"), json.dumps(two)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
    # both ranks end their gloo group before interpreter teardown (`mmrl.training.process_group`)
    assert r.stdout.count("process group alive at exit: False") == 2, r.stdout[-2000:]
    w1, w2 = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert w1.keys() == w2.keys()
    moved = 0.0
    for k in w1:
        assert (w1[k] - w2[k]).abs().max() <= 1e-5, k
    # and the step did something: compare against the untouched tiny model
    from mmrl.models import adapter_class

    init = dict(adapter_class("causal_lm").tiny(seed=0).model.state_dict())
    for k in w1:
        moved = max(moved, float((w1[k] - init[k]).abs().max()))
    assert moved > 1e-4
