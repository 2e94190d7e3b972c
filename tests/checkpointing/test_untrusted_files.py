"""Untrusted files and paths: checkpoints and weights load as safetensors or with `weights_only=True` (a pickle that
would run code is refused and runs nothing); `trust_remote_code` is used only on request and always warns; nothing a
configuration names can make the trainer write outside its run directory."""
import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch

from mmrl.checkpointing.checkpoint import CheckpointDamaged, load_checkpoint, load_model_weights
from mmrl.config.train_config import ConfigError, load_config
from mmrl.models import adapter_class
from mmrl.core.remote_code import RemoteCodeWarning
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward


class Payload:
    """Unpickling this creates `marker` (through `open`): the proof that a loader executed pickled code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_pickle(path: Path, marker: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": Payload(marker)}, path)
    with open(path.with_suffix(".plain"), "wb") as f:  # the same payload is live under plain pickle
        pickle.dump(Payload(marker.with_suffix(".plain")), f)


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(None, dict(family="causal_lm", max_steps=1, num_generations=4, per_device_train_batch_size=4,
                                 max_completion_length=8, output_dir=str(run), progress_bar=False, report_to=["jsonl"]))
    Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    return next((run / "checkpoints").glob("checkpoint-*"))


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state_0.pt", "buffer.pt"])
def test_checkpoint_pickles_cannot_run_code(name, trained_checkpoint, tmp_path):
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(trained_checkpoint, ck)
    marker = tmp_path / "pwned"
    write_pickle(ck / name, marker)
    with open(ck / Path(name).with_suffix(".plain"), "rb") as f:
        pickle.load(f)  # the control: plain unpickling runs the payload
    assert marker.with_suffix(".plain").exists()
    with pytest.raises(CheckpointDamaged, match=rf"{name} cannot be read \(UnpicklingError: Weights only load failed") as e:
        load_checkpoint(ck)
    assert isinstance(e.value.__cause__, pickle.UnpicklingError)
    assert not marker.exists()


def test_model_weights_are_read_as_safetensors_only(trained_checkpoint, tmp_path):
    model = adapter_class("causal_lm").tiny(seed=5).model
    load_model_weights(model, trained_checkpoint / "model")  # the real checkpoint loads
    marker = tmp_path / "pwned"
    write_pickle(tmp_path / "model" / "pytorch_model.bin", marker)
    with pytest.raises(FileNotFoundError, match="no .safetensors weights"):
        load_model_weights(model, tmp_path / "model")
    assert not marker.exists()


def test_pretrained_directory_with_a_malicious_bin_runs_nothing(tmp_path):
    """A transformers checkpoint folder whose weights are a pickle: transformers loads it with weights_only=True."""
    src = adapter_class("causal_lm").tiny(seed=0)
    src.save_pretrained(tmp_path / "m")
    for f in (tmp_path / "m").glob("*.safetensors"):
        f.unlink()
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": Payload(marker)}, tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        adapter_class("causal_lm").from_pretrained(tmp_path / "m")
    assert not marker.exists()


def test_open_clip_weights_pickle_runs_nothing(tmp_path):
    """clip_score's `pretrained=<file>` goes through open_clip, which loads with weights_only=True."""
    import json

    import open_clip
    from tiny_vision import tiny_open_clip_dir

    from mmrl.rewards.image_clip import load_open_clip

    d = tiny_open_clip_dir(tmp_path / "clip")
    arch = tmp_path / "mmrl-untrusted-tiny.json"  # an architecture name for the tiny model (file stem = name)
    arch.write_text(json.dumps(json.loads((d / "open_clip_config.json").read_text())["model_cfg"]))
    open_clip.add_model_config(arch)
    marker = tmp_path / "pwned"
    torch.save({"state_dict": Payload(marker)}, tmp_path / "weights.pt")
    with pytest.raises(Exception, match="(?i)weights.only"):
        load_open_clip("mmrl-untrusted-tiny", str(tmp_path / "weights.pt"))
    assert not marker.exists()


# ----------------------------------------------------------------------------------------- trust_remote_code

def _remote_code_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RemoteCodeWarning)]


@pytest.mark.parametrize("family,build", [
    ("causal_lm", lambda: adapter_class("causal_lm").tiny(seed=0)),
    ("masked_diffusion", lambda: adapter_class("masked_diffusion").tiny(seed=0)),
    ("janus", lambda: adapter_class("janus").tiny(seed=0, grid=(2, 2), codebook_size=4)),
])
def test_trust_remote_code_only_on_request_and_always_warned(family, build, tmp_path):
    build().save_pretrained(tmp_path / "m")
    cls = adapter_class(family)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cls.from_pretrained(tmp_path / "m")
    assert _remote_code_warnings(record) == []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cls.from_pretrained(tmp_path / "m", trust_remote_code=True)
    (msg,) = _remote_code_warnings(record)
    assert str(tmp_path / "m") in msg and "may run Python code shipped with the checkpoint" in msg


def test_trust_remote_code_from_the_config_warns(tmp_path):
    from mmrl.training.policy_factory import build_policy

    adapter_class("causal_lm").tiny(seed=0).save_pretrained(tmp_path / "m")
    for trust, expected in ((False, 0), (True, 1)):
        cfg = load_config(None, {"model_name_or_path": str(tmp_path / "m"), "trust_remote_code": trust, "output_dir": str(tmp_path / "o")})
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            build_policy(cfg)
        assert len(_remote_code_warnings(record)) == expected


# ------------------------------------------------------------------------------------------ paths

def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}


def test_training_writes_only_inside_the_run_directory(tmp_path, monkeypatch):
    """Every writer (metrics, TensorBoard, checkpoints and their rotation, credit pictures) on: the files that appear
    or change anywhere under the working directory all lie inside output_dir."""
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    (work / "data" / "keep.txt").write_text("untouched")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(work / "home"))
    before = _snapshot(tmp_path)
    cfg = load_config(None, dict(method="gcpo", family="causal_lm", max_steps=3, num_generations=4, per_device_train_batch_size=4,
                                 max_completion_length=8, output_dir="runs/../runs/r1", progress_bar=False, save_steps=1,
                                 save_total_limit=1, credit_steps=1, report_to=["jsonl", "tensorboard"]))
    Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    after = _snapshot(tmp_path)
    changed = sorted(k for k in after if before.get(k) != after[k])
    run = os.path.join("work", "runs", "r1") + os.sep
    assert changed and all(k.startswith(run) for k in changed), [k for k in changed if not k.startswith(run)]
    assert {"metrics.jsonl", "checkpoints", "tensorboard", "credit"} <= {p.name for p in (work / "runs" / "r1").iterdir()}


@pytest.mark.parametrize("name", ["../../etc", "/abs/path", "a/b", ".hidden", "..", "x/../../y", ""])
def test_tiny_world_names_cannot_escape_the_cache(name):
    with pytest.raises(ConfigError, match=r"a tiny-world model name is letters, digits"):
        load_config(None, {"model_name_or_path": f"tiny-world:{name}"})
    load_config(None, {"model_name_or_path": "tiny-world:countdown3-causal_lm.v1"})  # an ordinary name is fine


def test_resume_from_must_be_a_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"resume_from='.*nowhere' is not a complete mmrl checkpoint directory"):
        load_config(None, {"resume_from": str(tmp_path / "nowhere")})
