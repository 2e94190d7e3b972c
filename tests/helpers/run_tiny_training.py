"""Runs a tiny training job from a JSON config (used by the resume, crash and distributed tests as a subprocess).

    python tests/helpers/run_tiny_training.py '{"method": "grpo", "family": "causal_lm", ...}'
"""
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["HF_HUB_OFFLINE"] = "1"
# MKL's results may depend on memory alignment, which differs between a fresh and a resumed process; strict
# conditional numerical reproducibility makes them bitwise repeatable (Intel MKL developer guide, "CNR")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers/ (the fixtures)

import torch  # noqa: E402

from mmrl.config.train_config import load_config  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402
from tiny_world_fixtures import dataset_for, reward_for  # noqa: E402


def _report_process_group() -> None:
    """Registered before the Trainer exists, so it runs after the Trainer's own exit handler (atexit is last in,
    first out): the distributed test reads whether the process group outlived the run."""
    import torch.distributed as dist

    print(f"process group alive at exit: {dist.is_available() and dist.is_initialized()}", flush=True)


def main() -> None:
    import atexit

    atexit.register(_report_process_group)
    torch.set_num_threads(1)
    values = json.loads(sys.argv[1])
    cfg = load_config(None, values)
    policy = adapter_class(cfg.family).tiny(seed=0)
    Trainer(cfg, policy=policy, dataset=dataset_for(cfg.family, 32), reward_funcs=[reward_for(cfg.family)]).train()


if __name__ == "__main__":
    main()
