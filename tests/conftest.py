"""Test-wide settings. Runs before any test module imports torch."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see reference/tiny_world_measurements.md
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))
