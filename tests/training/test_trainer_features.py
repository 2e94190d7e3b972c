"""LoRA with the adapter-disabled reference, token-credit pictures, logging sinks, the command line end to end."""
import json
import subprocess
import sys

import torch

from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward


def base(tmp_path, **kw):
    v = dict(family="causal_lm", max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
             learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0, dynamic_sampling=False)
    v.update(kw)
    return load_config(None, v)


def test_lora_trains_adapters_only_and_reference_is_the_base(tmp_path):
    policy = adapter_class("causal_lm").tiny(seed=0)
    base_state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    cfg = base(tmp_path, method="dmpo", use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    t = Trainer(cfg, policy=policy, dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    assert policy.ref_model is None  # no copy: the reference is the adapter-disabled base
    t.train()
    peft_model = policy.unwrapped
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    # base weights untouched
    for n, p in peft_model.get_base_model().named_parameters():
        if "lora_" not in n and ".base_layer." not in n:
            key = n
            if key in base_state:
                assert torch.equal(p, base_state[key]), n
    # the reference scores like the original model, the policy differs
    fresh = adapter_class("causal_lm").tiny(seed=0)
    rollout = policy.sample(["say a 1", "say a 2"], 2, seeds=[1, 2, 3, 4])
    with torch.no_grad():
        ref = policy.logprob(rollout, use_reference=True).logp
        orig = fresh.logprob(rollout).logp
        cur = policy.logprob(rollout).logp
    torch.testing.assert_close(ref, orig, atol=1e-6, rtol=0)
    assert not torch.allclose(cur, orig, atol=1e-4)
    # the checkpoint holds the adapter only
    ck = sorted((tmp_path / "checkpoints").glob("checkpoint-*"))[-1]
    assert (ck / "model" / "adapter_model.safetensors").is_file()


def test_token_credit_pictures_for_text(tmp_path):
    cfg = base(tmp_path, method="gcpo", credit_steps=1, max_steps=1)
    Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    html = (tmp_path / "credit" / "step-000001.html").read_text()
    assert html.count("class='r'") == 8 and "background:rgb(" in html and "reward" in html


def test_cli_train_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "train", "method=grpo", "task=countdown", "family=causal_lm",
                          "model_name_or_path=tiny", "max_steps=1", "num_generations=2", "per_device_train_batch_size=4",
                          "max_completion_length=8", f"output_dir={tmp_path}", "progress_bar=false", "dataset_path=" + str(tmp_path / "cd.jsonl")],
                         capture_output=True, text=True, input=None, cwd=tmp_path,
                         env={**__import__("os").environ, "OMP_WAIT_POLICY": "PASSIVE"}) if _write_countdown(tmp_path) else None
    assert out.returncode == 0, out.stderr[-3000:]
    assert "final step: reward=" in out.stdout
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 1 and "rewards/countdown/mean" in rec


def _write_countdown(tmp_path) -> bool:
    rows = [{"nums": [3, 4, 5], "target": 17}, {"nums": [2, 9, 7], "target": 25}, {"nums": [6, 1, 8], "target": 14}]
    (tmp_path / "cd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return True
