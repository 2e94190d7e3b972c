"""A tiny training job whose reward draws from the global random generators of each process (Python's `random`,
numpy's `np.random`, torch's), seeded differently on every rank as accelerate's `set_seed(..., device_specific=True)`
does, so its metrics depend on every generator of every process; after training each process writes its next draws
to `<output_dir>/draws-<rank>.json`. Used by the multi-process resume tests:

    accelerate launch --config_file configs/accelerate/cpu_ddp.yaml tests/helpers/run_rank_rng.py '{...config...}'
"""
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # bitwise repeatable MKL results across processes (run_tiny_training.py)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/helpers/

import numpy as np  # noqa: E402
import torch  # noqa: E402
from clean_exit import leave  # noqa: E402

from mmrl.config.train_config import load_config  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402
from tiny_world_fixtures import dataset_for, vowel_reward  # noqa: E402


def noisy_vowel_reward(prompts, completions, **kwargs):
    """The vowel fraction plus noise from all three global generators (a user reward breaking ties at random)."""
    base = vowel_reward(prompts, completions)
    return [b + 0.1 * (random.random() + float(np.random.rand()) + float(torch.rand(()))) for b in base]


def draws() -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(()))]


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_config(None, json.loads(sys.argv[1]))
    policy = adapter_class(cfg.family).tiny(seed=0)
    rank = int(os.environ.get("RANK", "0"))
    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)
    Trainer(cfg, policy=policy, dataset=dataset_for(cfg.family, 32), reward_funcs=[noisy_vowel_reward]).train()
    (Path(cfg.output_dir) / f"draws-{rank}.json").write_text(json.dumps(draws()))


if __name__ == "__main__":
    main()
    leave()
