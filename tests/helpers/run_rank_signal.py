"""A tiny distributed training job (as `run_tiny_training.py`) in which only the process of rank `signal_rank` gets
SIGTERM, from its own reward function during the rollout of step 2. Every process prints what stopped it.

    accelerate launch --config_file configs/accelerate/cpu_ddp.yaml tests/helpers/run_rank_signal.py '{"signal_rank": 1, ...}'
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
from mmrl.training.trainer import Trainer, TrainingStopped  # noqa: E402
from tiny_world_fixtures import dataset_for, vowel_reward  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)
    values = json.loads(sys.argv[1])
    target = values.pop("signal_rank")
    calls = {"n": 0}

    def reward(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] == 2 and int(os.environ.get("RANK", "0")) == target:
            os.kill(os.getpid(), signal.SIGTERM)
        return vowel_reward(prompts, completions)

    cfg = load_config(None, values)
    trainer = Trainer(cfg, policy=adapter_class(cfg.family).tiny(seed=0), dataset=dataset_for(cfg.family, 32), reward_funcs=[reward])
    try:
        trainer.train()
    except TrainingStopped as e:
        print(f"rank {trainer.rank}: {e}", flush=True)
        return
    print(f"rank {trainer.rank}: finished", flush=True)


if __name__ == "__main__":
    main()
