"""A tiny distributed training job in which the process of rank `freeze_rank` freezes itself (SIGSTOP, as a hung
driver or a debugger would) in its reward function during the rollout of step 2; it writes its pid first.

    accelerate launch --config_file configs/accelerate/cpu_ddp.yaml tests/helpers/run_rank_freeze.py '{"freeze_rank": 1, ...}'
"""
import json
import os
import signal
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers/ (the fixtures)

import torch  # noqa: E402

from mmrl.config.train_config import load_config  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer, TrainingError  # noqa: E402
from tiny_world_fixtures import dataset_for, vowel_reward  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    values = json.loads(sys.argv[1])
    target, pid_file = values.pop("freeze_rank"), values.pop("pid_file")
    calls = {"n": 0}

    def reward(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == 2 and int(os.environ.get("RANK", "0")) == target:
            with open(pid_file, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        return vowel_reward(prompts, completions)

    cfg = load_config(None, values)
    trainer = Trainer(cfg, policy=adapter_class(cfg.family).tiny(seed=0), dataset=dataset_for(cfg.family, 32), reward_funcs=[reward])
    try:
        trainer.train()
    except TrainingError as e:
        print(f"stopped: {e}", flush=True)
        sys.exit(1)
    print(f"rank {trainer.rank}: finished", flush=True)


if __name__ == "__main__":
    main()
