"""Sharded-checkpoint resume check for machines with two or more GPUs (issue 30, group 11): the CPU tests
(`tests/checkpointing/test_faults_rank_state.py`) cover DDP through the trainer and FSDP2 over gloo; this runs the
same on GPUs, where accelerate really shards.

1. `fsdp2`: `tests/helpers/run_fsdp2_resume.py` on 2 GPUs (NCCL, data drawn on the GPU, so the CUDA generators are
   checked): 4 steps with a checkpoint at step 2, then fresh processes resume it; parameters, optimizer shards and
   the next draws must be bitwise equal.
2. `trainer_fsdp`: the trainer under `configs/accelerate/fsdp.yaml` (2 processes, no mixed precision) on the tiny
   causal LM (`tests/helpers/run_rank_rng.py`), killed after step 2 and resumed; `metrics.jsonl` must equal an
   uninterrupted run's.

    python benchmarks/sharded_resume_check.py --out bench_results/gpu/sharded_resume.json [--device cpu]

With fewer than 2 GPUs it writes `{"skipped": ...}` and exits 0 (`--device cpu` runs check 1 over gloo instead).
Exit status 1 if a check that ran failed."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers"
TRAIN = dict(method="grpo", family="causal_lm", max_steps=4, save_steps=2, num_generations=4, per_device_train_batch_size=4,
             max_completion_length=8, learning_rate=1e-2, progress_bar=False, dynamic_sampling=False, seed=3,
             report_to=["jsonl"])


def run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def check_fsdp2(work: Path, env: dict) -> dict:
    ref, res = work / "fsdp2_ref", work / "fsdp2_resumed"
    ref.mkdir()
    res.mkdir()
    tr = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29631",
          str(HELPERS / "run_fsdp2_resume.py")]
    r = run(tr + [str(ref), "4", "2", "0"], env, 300)
    if r.returncode:
        return {"ok": False, "error": r.stderr[-2000:]}
    shutil.copytree(ref / "checkpoints", res / "checkpoints")
    r = run(tr + [str(res), "4", "0", "1"], env, 300)
    if r.returncode:
        return {"ok": False, "error": r.stderr[-2000:]}
    same = {}
    for rank in (0, 1):
        a = torch.load(ref / f"final-{rank}.pt", weights_only=True)
        b = torch.load(res / f"final-{rank}.pt", weights_only=True)
        same[f"rank{rank}/params"] = all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
        same[f"rank{rank}/optimizer"] = all(torch.equal(a["optimizer"]["state"][i][k], b["optimizer"]["state"][i][k])
                                            for i in a["optimizer"]["state"] for k in a["optimizer"]["state"][i])
        same[f"rank{rank}/draws"] = torch.equal(a["draws"], b["draws"])
    return {"ok": all(same.values()), "bitwise_equal": same}


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def check_trainer_fsdp(work: Path, env: dict) -> dict:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs/accelerate/fsdp.yaml"),
              "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "29632", str(HELPERS / "run_rank_rng.py")]
    ref, res = work / "trainer_ref", work / "trainer_resumed"
    r = run(launch + [json.dumps({**TRAIN, "output_dir": str(ref)})], env, 600)
    if r.returncode:
        return {"ok": False, "stage": "uninterrupted run", "error": r.stderr[-2000:]}
    r = run(launch + [json.dumps({**TRAIN, "output_dir": str(res)})], {**env, "MMRL_KILL_AT": "after_step:2"}, 600)
    if not (res / "checkpoints" / "checkpoint-000002").is_dir():
        return {"ok": False, "stage": "killed run", "error": r.stderr[-2000:]}
    r = run(launch + [json.dumps({**TRAIN, "output_dir": str(res), "resume_from": "auto"})], env, 600)
    if r.returncode:
        return {"ok": False, "stage": "resume", "error": r.stderr[-2000:]}
    files = sorted(p.name for p in (res / "checkpoints" / "checkpoint-000004").iterdir())
    return {"ok": metrics(ref) == metrics(res), "checkpoint_files": files}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result: dict = {"device": args.device}
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        result["skipped"] = f"needs 2 GPUs, {torch.cuda.device_count()} visible"
    else:
        env["MMRL_FSDP_DEVICE"] = args.device
        with tempfile.TemporaryDirectory() as d:
            result["fsdp2"] = check_fsdp2(Path(d), env)
            if args.device == "cuda":
                result["trainer_fsdp"] = check_trainer_fsdp(Path(d), env)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 1 if any(isinstance(v, dict) and not v.get("ok", True) for v in result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
