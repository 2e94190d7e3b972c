"""Issue 30, group 3: every artifact is verified before it is used: `mmrl eval` checks the checkpoint's manifest,
the tiny-world model cache checks its own, and resuming a checkpoint without a manifest says so."""
import json
import shutil
import warnings

import pytest

from mmrl.checkpointing.checkpoint import latest_checkpoint, list_checkpoints, verify_checkpoint
from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # tensor data: the safetensors header stays readable, so loading alone would not notice
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def countdown_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cd")
    rows = [{"nums": [3, 4, 5], "target": 17}, {"nums": [2, 9, 7], "target": 25}]
    (d / "cd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, dict(family="masked_diffusion", method="dmpo", max_steps=1, num_generations=2,
                                 per_device_train_batch_size=2, max_completion_length=8, block_length=4,
                                 output_dir=str(d / "run"), progress_bar=False, report_to=["jsonl"], task="countdown",
                                 dataset_path=str(d / "cd.jsonl")))
    Trainer(cfg).train()
    return d


def test_eval_refuses_a_checkpoint_whose_weights_do_not_match_the_manifest(countdown_run, tmp_path, capsys):
    from mmrl.cli import main

    shutil.copytree(countdown_run / "run", tmp_path / "run")
    ck = latest_checkpoint(tmp_path / "run")
    common = ["--task", "countdown", "--dataset-path", str(countdown_run / "cd.jsonl"), "--limit", "1", "--gen-length", "8",
              "--block-length", "4", "--steps", "4"]
    flip_last_byte(ck / "model" / "model.safetensors")
    for target in (ck, ck / "model"):
        assert main(["eval", "--model", str(target), *common]) == 2
        err = capsys.readouterr().err
        assert "model/model.safetensors does not match its SHA-256 checksum" in err and "refusing to evaluate" in err
    (ck / "optimizer.pt").write_bytes(b"damaged")  # only the model's files matter to an evaluation
    flip_last_byte(ck / "model" / "model.safetensors")  # flipped back: intact again
    assert main(["eval", "--model", str(ck), *common]) == 0
    (ck / "manifest.json").unlink()
    assert main(["eval", "--model", str(ck), *common]) == 0
    assert "has no manifest.json, so its weights cannot be verified" in capsys.readouterr().err


def test_a_damaged_tiny_world_cache_is_rebuilt(tmp_path, monkeypatch):
    from mmrl.tiny_world import models

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    path = models.ensure_built("sudoku4", progress=False, steps=2)
    assert verify_checkpoint(path)  # the cache carries a manifest
    from mmrl.checkpointing.optimizer_state import OPTIMIZER_FILE

    # the weights, not the optimizer state beside them: glob order is the file system's, and the state is not part
    # of a build's identity (weights_digest leaves it out; in a full CI run its rebuild was not bitwise equal)
    weights = next(p for p in path.glob("*.safetensors") if p.name != OPTIMIZER_FILE)
    original = weights.read_bytes()
    flip_last_byte(weights)
    assert models.ensure_built("sudoku4", progress=False, steps=2) == path
    assert weights.read_bytes() == original  # rebuilt (pre-training is deterministic), not reused damaged
    (path / "manifest.json").unlink()  # a cache written before manifests: checked by loading, then given one
    assert models.ensure_built("sudoku4", progress=False, steps=2) == path and verify_checkpoint(path)


def test_resuming_a_checkpoint_without_a_manifest_says_so(tmp_path):
    base = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
                learning_rate=1e-4, progress_bar=False, save_steps=1, report_to=["jsonl"], output_dir=str(tmp_path / "run"))

    def make(**kw):
        return Trainer(load_config(None, {**base, **kw}), policy=adapter_class("causal_lm").tiny(seed=0),
                       dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])

    make(max_steps=1).train()
    (list_checkpoints(tmp_path / "run")[-1] / "manifest.json").unlink()
    t = make(max_steps=2, resume_from="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.train()
    assert t.step == 2
    assert any("has no manifest.json" in str(w.message) and "checkpoint-000001" in str(w.message) for w in caught)
