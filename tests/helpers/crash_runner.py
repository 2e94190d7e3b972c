"""Fork server for the crash tests: imports torch, transformers and mmrl once, then runs each tiny training job in a
forked child, which a fault point (`MMRL_KILL_AT`) or a timer kills with SIGKILL. A fresh interpreter per job would
spend ~5 s importing; a fork starts in milliseconds, so tens of killed and resumed runs fit in a short test.

Protocol, one JSON object per line:
    stdin:  {"values": {config}, "env": {"MMRL_KILL_AT": "..."}, "kill_after": seconds or null}
    stdout: {"rc": exit status (-9: killed by SIGKILL), "wall": seconds the job ran}
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
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402
from tiny_world_fixtures import dataset_for, reward_for  # noqa: E402

# resolve transformers' lazy modules in the parent so that children do not import them again
transformers.Qwen2ForCausalLM, transformers.Qwen2Config, transformers.get_scheduler  # noqa: B018
adapter_class("causal_lm")


def child(job: dict) -> None:
    os.dup2(2, 1)  # the job's prints must not reach the protocol stream
    os.environ.update(job.get("env") or {})
    torch.set_num_threads(1)
    cfg = load_config(None, job["values"])
    policy = adapter_class(cfg.family).tiny(seed=0)
    Trainer(cfg, policy=policy, dataset=dataset_for(cfg.family, 32), reward_funcs=[reward_for(cfg.family)]).train()


def run(job: dict) -> dict:
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child(job)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    deadline = None if job.get("kill_after") is None else t0 + float(job["kill_after"])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if deadline is not None and time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.002)
    return {"rc": os.waitstatus_to_exitcode(status), "wall": time.monotonic() - t0}


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
