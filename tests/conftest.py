"""Test-wide settings. Runs before any test module imports torch."""
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see docs/sources.md, "CPU measurements behind defaults"
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# the shared fixtures (tiny_world_fixtures, tiny_vision) and the subprocess scripts live in tests/helpers/
sys.path.insert(0, str(Path(__file__).resolve().parent / "helpers"))

import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

import mmrl.tiny_world  # noqa: E402

# the tests use the tiny world's tasks and rewards as an application would (tests/core/test_architecture.py checks
# that the engine alone does not know them)
mmrl.tiny_world.register()


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smoke_cache(tmp_path_factory) -> Path:
    """One tiny-world cache for the session's smoke runs: each smoke base (`SMOKE_BASE_STEPS`) is built once, not
    once per test (tests that check what a build writes keep their own cache)."""
    return tmp_path_factory.mktemp("tiny-world-cache")
