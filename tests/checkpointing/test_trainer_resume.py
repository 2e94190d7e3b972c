"""Resume: 4 steps straight vs 2 steps, process killed (SIGKILL), resume for 2: identical losses and parameters."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parents[1]  # tests/


def run(values: dict, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env_extra or {})}
    return subprocess.run([sys.executable, str(HERE / "helpers" / "run_tiny_training.py"), json.dumps(values)], env=env, capture_output=True, text=True, timeout=600)


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def final_weights(run_dir: Path) -> dict:
    ck = sorted((run_dir / "checkpoints").glob("checkpoint-*"))[-1]
    return load_file(next((ck / "model").glob("*.safetensors")))


@pytest.mark.parametrize("method", ["grpo", "dmpo"])
def test_kill_and_resume_matches_straight_run(method, tmp_path):
    # num_iterations = 3: the step after the kill (step 3) still uses the rollout buffer of step 1, restored from the
    # checkpoint, and step 4 draws a new buffer with the restored prompt position
    base = dict(method=method, family="causal_lm", max_steps=4, num_generations=4, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=1e-2, max_completion_length=8, num_iterations=3,
                save_steps=1, progress_bar=False, dynamic_sampling=False, lr_scheduler_type="linear", seed=3)
    straight = tmp_path / "straight"
    r = run({**base, "output_dir": str(straight)})
    assert r.returncode == 0, r.stderr[-3000:]
    killed = tmp_path / "killed"
    r = run({**base, "output_dir": str(killed)}, {"MMRL_KILL_AT": "after_step:2"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])
    assert sorted(p.name for p in (killed / "checkpoints").glob("checkpoint-*"))[-1] == "checkpoint-000002"
    r = run({**base, "output_dir": str(killed), "resume_from": "auto"})
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = losses(straight), losses(killed)
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    assert a == b  # bitwise: every random stream is derived from (seed, step), the buffer is restored
    wa, wb = final_weights(straight), final_weights(killed)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert (wa[k] == wb[k]).all(), k
