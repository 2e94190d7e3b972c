"""Checkpoint folders load as TRL's do: `from_pretrained(".../checkpoints/checkpoint-N")` gives the model of step N
(the files of `model/` hard-linked at the top of the checkpoint, no second copy on disk), for a full fine-tune and
for LoRA; the manifest covers both paths, and the free-space estimate counts a linked file once."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from mmrl.checkpointing.checkpoint import CheckpointDamaged, checkpoint_bytes, list_checkpoints, verify_checkpoint
from mmrl.models import adapter_class


def reward_len(completions, **kwargs):
    return [-abs(8 - len(c)) for c in completions]


def run(tmp_path, **kw):
    import datasets

    from mmrl import Trainer, TrainConfig

    src = tmp_path / "base"
    adapter_class("causal_lm").tiny(seed=0).save_pretrained(src)
    v = dict(max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=6, learning_rate=3e-2,
             output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=1, save_total_limit=5, report_to=["jsonl"])
    v.update(kw)
    t = Trainer(str(src), [reward_len], args=TrainConfig(**v),
                train_dataset=datasets.Dataset.from_list([{"prompt": f"say a {i}"} for i in range(16)]))
    t.train()
    return t, src


def logits(model):
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 3, 7]])).logits


def test_full_checkpoints_load_with_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t, src = run(tmp_path)
    cks = list_checkpoints(tmp_path / "run")
    assert [c.name for c in cks] == ["checkpoint-000001", "checkpoint-000002"]
    first = AutoModelForCausalLM.from_pretrained(cks[0])
    last = AutoModelForCausalLM.from_pretrained(cks[1])
    assert torch.allclose(logits(last), logits(t.accelerator.unwrap_model(t.policy.model)), atol=1e-6)
    assert not torch.allclose(logits(first), logits(last), atol=1e-4)  # step 1's weights, not the last ones
    for c in cks:  # the checkpoint's model/ and its top level are the same weights, stored once
        assert os.path.samefile(c / "model.safetensors", c / "model" / "model.safetensors")
        sd, ref = load_file(c / "model.safetensors"), load_file(c / "model" / "model.safetensors")
        assert sd.keys() == ref.keys() and all(torch.equal(sd[k], ref[k]) for k in sd)
    assert AutoTokenizer.from_pretrained(cks[1]).get_vocab() == AutoTokenizer.from_pretrained(src).get_vocab()
    ck = cks[1]
    files = [p for p in ck.rglob("*") if p.is_file()]
    inodes = {p.stat().st_ino: p.stat().st_size for p in files}
    assert checkpoint_bytes(ck) == sum(inodes.values()) < sum(p.stat().st_size for p in files)
    manifest = json.loads((ck / "manifest.json").read_text())["files"]
    assert manifest["model.safetensors"] == manifest["model/model.safetensors"]
    assert verify_checkpoint(ck) is True
    data = bytearray((ck / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (ck / "model.safetensors").unlink()
    (ck / "model.safetensors").write_bytes(bytes(data))  # a new file in place of the link: model/ is intact
    with pytest.raises(CheckpointDamaged, match=r"model\.safetensors does not match its SHA-256"):
        verify_checkpoint(ck)
    assert verify_checkpoint(ck, under="model") is True  # what resume and evaluation load


def test_lora_checkpoints_load_with_from_pretrained(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    t, src = run(tmp_path, use_peft=True, lora_r=4, lora_alpha=8)
    ck = list_checkpoints(tmp_path / "run")[-1]
    assert (ck / "adapter_config.json").is_file() and (ck / "adapter_model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(ck)  # transformers' peft integration: base + step 2's adapter
    trained = t.accelerator.unwrap_model(t.policy.model)
    assert torch.allclose(logits(loaded), logits(trained), atol=1e-5)
    assert not torch.allclose(logits(AutoModelForCausalLM.from_pretrained(src)), logits(trained), atol=1e-4)
