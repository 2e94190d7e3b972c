"""TRL's call form and outputs: `from mmrl import Trainer, TrainConfig`; `Trainer(model=<path or PreTrainedModel>,
reward_funcs=..., args=..., train_dataset=..., peft_config=LoraConfig(...))` with the family picked from the model;
the final model in output_dir, loadable by `AutoModelForCausalLM.from_pretrained(output_dir)`; `save_model()`; the
model card; a relative LoRA base path kept relative; `push_to_hub` at the Hub client's boundary."""
from __future__ import annotations

import json

import pytest
import torch

from mmrl.models import adapter_class


def reward_len(completions, **kwargs):  # TRL's docs' length reward
    return [-abs(8 - len(c)) for c in completions]


def args_for(tmp_path, **kw):
    from mmrl import TrainConfig

    v = dict(max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=6, learning_rate=1e-2,
             output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0, report_to=["jsonl"])
    v.update(kw)
    return TrainConfig(**v)


def train_rows():
    import datasets

    return datasets.Dataset.from_list([{"prompt": f"say a {i}"} for i in range(16)])


@pytest.fixture()
def base_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    adapter_class("causal_lm").tiny(seed=0).save_pretrained(tmp_path / "base")
    return "base"  # relative to the working directory, as a user types it


def same_logits(a, b):
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    with torch.no_grad():
        return torch.allclose(a(ids).logits, b(ids).logits, atol=1e-5)


def test_trl_call_form_with_a_model_object_and_peft_config(tmp_path, base_dir):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from mmrl import Trainer

    model = AutoModelForCausalLM.from_pretrained(base_dir)
    t = Trainer(model=model, reward_funcs=reward_len, args=args_for(tmp_path), train_dataset=train_rows(),
                peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True))
    assert t.cfg.family == "causal_lm" and t.cfg.use_peft and t.cfg.model_name_or_path == "base"
    assert t.policy.model.peft_config["default"].use_rslora  # the user's LoraConfig, as given
    t.train()
    out = tmp_path / "run"
    adapter_cfg = json.loads((out / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == "base"  # relative, as configured
    loaded = AutoModelForCausalLM.from_pretrained(out)  # transformers' peft integration: base + adapter
    trained = t.accelerator.unwrap_model(t.policy.model)
    assert same_logits(loaded, trained)
    assert not same_logits(AutoModelForCausalLM.from_pretrained(base_dir), trained)  # the adapters trained
    card = (out / "README.md").read_text()
    assert "reward_len" in card and "**grpo**" in card and "LoRA adapter" in card


def test_trl_call_form_with_a_path_saves_a_full_model_and_save_model(tmp_path, base_dir):
    from transformers import AutoModelForCausalLM

    from mmrl import Trainer

    t = Trainer(base_dir, [reward_len], args=args_for(tmp_path, learning_rate=3e-2), train_dataset=train_rows())
    assert t.cfg.family == "causal_lm" and t.cfg.model_name_or_path == "base"
    t.train()
    out = tmp_path / "run"
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert same_logits(loaded, t.accelerator.unwrap_model(t.policy.model))
    assert adapter_class("causal_lm").from_pretrained(out).family == "causal_lm"  # mmrl's own loader too
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers") and "learning_rate: 0.03" in card and "`reward_len`" in card
    elsewhere = t.save_model(tmp_path / "copy")  # TRL: trainer.save_model(output_dir)
    assert same_logits(AutoModelForCausalLM.from_pretrained(elsewhere), loaded)


def test_the_family_comes_from_the_model(tmp_path):
    from mmrl.training.trl_api import ModelFamilyError, family_from_config, family_of_path

    assert family_from_config("qwen2_5_vl", ["Qwen2_5_VLForConditionalGeneration"]) == "vlm"
    assert family_from_config("llada", ["LLaDAModelLM"]) == "masked_diffusion"
    assert family_from_config("dream", ["DreamModel"]) == "masked_diffusion"
    assert family_from_config("llama", ["LlamaForCausalLM"]) == "causal_lm"
    assert family_from_config("bert", ["BertForMaskedLM"]) is None
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(ModelFamilyError, match="cannot tell the family from its config.json"):
        family_of_path(tmp_path / "m")
    with pytest.raises(ModelFamilyError, match="not a model directory"):
        family_of_path(tmp_path / "nothing")


def test_push_to_hub_uploads_the_final_model_only(tmp_path, base_dir, monkeypatch):
    import huggingface_hub

    from mmrl import Trainer

    calls = {}

    class HubBoundary:  # the Hub client: no network in tests
        def create_repo(self, repo_id, private=None, exist_ok=False):
            calls["create"] = (repo_id, private)
            return type("Url", (), {"repo_id": f"me/{repo_id}"})()

        def upload_folder(self, repo_id, folder_path, allow_patterns, commit_message):
            calls["upload"] = (repo_id, folder_path, sorted(allow_patterns))

    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub, "HfApi", HubBoundary)
    Trainer(base_dir, reward_len, args=args_for(tmp_path, max_steps=1, push_to_hub=True, hub_model_id="tiny-grpo",
                                                hub_private_repo=True), train_dataset=train_rows()).train()
    assert calls["create"] == ("tiny-grpo", True)
    repo, folder, files = calls["upload"]
    assert repo == "me/tiny-grpo" and folder == str(tmp_path / "run")
    assert {"config.json", "model.safetensors", "README.md", "mmrl_adapter.json"} <= set(files)
    assert not [f for f in files if "metrics" in f or "checkpoint" in f]
