"""Fork server for the crash tests: imports torch, transformers and mmrl once, then runs each tiny training job in a
forked child, which a fault point (`MMRL_KILL_AT`) or a timer kills with SIGKILL. A fresh interpreter per job would
spend ~5 s importing; a fork starts in milliseconds, so tens of killed and resumed runs fit in a short test.

The child reports every fault point it passes (`mmrl.core.faults`, e.g. `after_step:3`) on a pipe, so that a timer can
start from the run's own progress rather than from its start: "SIGKILL 0.12 s after the child finished step 3" lands in
step 4 of every run that does step 4, however fast or loaded the machine is and whichever step the run resumed from.

Protocol, one JSON object per line:
    stdin:  {"values": {config}, "env": {"MMRL_KILL_AT": "..."}, "kill_after": seconds or null,
             "kill_from": a fault point `point:K` the timer starts at (null: the job's start)}
    stdout: {"rc": exit status (-9: killed by SIGKILL), "wall": seconds the job ran,
             "events": [[`point:K`, seconds since the job's start], ...] the fault points the child passed, in order,
             "killed_at": seconds since the job's start the timer fired (null: it did not)}
The jobs' own output goes to stderr. The job is `tests/helpers/run_tiny_training.py`'s: a tiny causal LM on
`tiny_world_fixtures` prompts and reward.
"""
import json
import os
import signal
import sys
import time
import traceback

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # bitwise-repeatable MKL results (see run_tiny_training.py)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers/ (the fixtures)

import torch  # noqa: E402

torch.set_num_threads(1)  # before any parallel region: a forked child must not inherit a thread pool

import accelerate  # noqa: E402,F401
import transformers  # noqa: E402

from mmrl.config.train_config import load_config  # noqa: E402
from mmrl.core import faults  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402
from tiny_world_fixtures import dataset_for, reward_for  # noqa: E402

# resolve transformers' lazy modules in the parent so that children do not import them again
transformers.Qwen2ForCausalLM, transformers.Qwen2Config, transformers.get_scheduler  # noqa: B018
adapter_class("causal_lm")


def report_fault_points(fd: int) -> None:
    """Make every fault point of the trainer and the checkpoint writer write `point:K\\n` to `fd` before it (maybe)
    kills the process; one small write(2) each, which reaches the parent even if the kill follows at once."""
    import mmrl.checkpointing.checkpoint as checkpoint_module
    import mmrl.training.trainer as trainer_module

    original = faults.fault_point

    def reporting(point: str, step: int) -> None:
        os.write(fd, f"{point}:{step}\n".encode())
        original(point, step)

    trainer_module.fault_point = checkpoint_module.fault_point = reporting


def child(job: dict, progress_fd: int) -> None:
    os.dup2(2, 1)  # the job's prints must not reach the protocol stream
    os.environ.update(job.get("env") or {})
    report_fault_points(progress_fd)
    torch.set_num_threads(1)
    cfg = load_config(None, job["values"])
    policy = adapter_class(cfg.family).tiny(seed=0)
    Trainer(cfg, policy=policy, dataset=dataset_for(cfg.family, 32), reward_funcs=[reward_for(cfg.family)]).train()


def run(job: dict) -> dict:
    read_fd, write_fd = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            child(job, write_fd)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    events, pending = [], b""

    def read_events() -> None:
        nonlocal pending
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            now = time.monotonic() - t0
            events.extend([line.decode(), now] for line in lines)

    delay, start_at = job.get("kill_after"), job.get("kill_from")
    deadline = None if delay is None or start_at else t0 + float(delay)
    killed_at = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        read_events()
        if done:
            break
        if deadline is None and delay is not None and any(e == start_at for e, _ in events):
            deadline = t0 + next(t for e, t in events if e == start_at) + float(delay)
        if deadline is not None and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            killed_at = time.monotonic() - t0
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.002)
    read_events()
    os.close(read_fd)
    return {"rc": os.waitstatus_to_exitcode(status), "wall": time.monotonic() - t0, "events": events,
            "killed_at": killed_at}


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
