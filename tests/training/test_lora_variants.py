"""DoRA, rsLoRA and QLoRA through config fields, with TRL's ModelConfig names (`use_dora`, `use_rslora`,
`load_in_4bit`, `load_in_8bit`, `bnb_4bit_quant_type`, `use_bnb_nested_quant`, `bnb_4bit_quant_storage`).

DoRA and rsLoRA train here on CPU. QLoRA needs bitsandbytes (`pip install 'mmrl[qlora]'`), which CI does not
install: its settings are validated everywhere, and the 4-bit training test runs where bitsandbytes is importable
(bitsandbytes >= 0.48 has a CPU backend)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from mmrl.config.train_config import ConfigError, load_config
from mmrl.models import adapter_class

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


def reward_len(completions, **kwargs):
    return [-abs(8 - len(c)) for c in completions]


def args_for(tmp_path, **kw):
    from mmrl import TrainConfig

    v = dict(max_steps=1, num_generations=4, per_device_train_batch_size=8, max_completion_length=6, learning_rate=1e-2,
             output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0, report_to=["jsonl"], use_peft=True,
             lora_r=4, lora_alpha=8)
    v.update(kw)
    return TrainConfig(**v)


def train_rows():
    import datasets

    return datasets.Dataset.from_list([{"prompt": f"say a {i}"} for i in range(8)])


def base(tmp_path, **overrides):
    d = tmp_path / "base"
    adapter_class("causal_lm").tiny(seed=0, **overrides).save_pretrained(d)
    return str(d)


def logits(model, ids=((1, 5, 9, 3, 7),)):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_dora_from_the_config_trains_and_saves_a_dora_adapter(tmp_path):
    """use_dora=true: peft's DoRA layers (a magnitude vector per adapted weight, initialised to the weight's row
    norms, so the untrained policy equals its base); one step changes the magnitudes; output_dir holds the merged
    model and adapter/ the DoRA adapter, each loading to the trained policy."""
    from transformers import AutoModelForCausalLM

    from mmrl import Trainer

    src = base(tmp_path)
    t = Trainer(src, [reward_len], args=args_for(tmp_path, use_dora=True), train_dataset=train_rows())
    model = t.accelerator.unwrap_model(t.policy.model)
    assert model.peft_config["default"].use_dora
    mags = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_magnitude_vector" in n}
    assert len(mags) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers ("all-linear")
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    w = q.base_layer.weight.detach()  # [out, in]
    assert torch.allclose(mags[next(n for n in mags if "layers.0.self_attn.q_proj" in n)], w.norm(dim=1), atol=1e-6)
    base_model = AutoModelForCausalLM.from_pretrained(src)
    assert torch.allclose(logits(model), logits(base_model), atol=1e-5)  # B = 0 and m = ||W||: the base exactly
    t.train()
    now = dict(model.named_parameters())
    assert any(not torch.equal(now[n].detach(), m0) for n, m0 in mags.items())  # the magnitudes trained
    out = tmp_path / "run"
    # the merged model in output_dir (transformers' peft integration would drop DoRA's magnitudes from an adapter
    # folder), the adapter beside it for peft
    assert not (out / "adapter_config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert torch.allclose(logits(loaded), logits(model), atol=1e-5)
    assert not torch.allclose(logits(base_model), logits(model), atol=1e-4)
    from peft import PeftModel

    assert json.loads((out / "adapter/adapter_config.json").read_text())["use_dora"] is True
    adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(src), out / "adapter")
    assert torch.allclose(logits(adapter), logits(model), atol=1e-5)


def test_rslora_from_the_config_scales_by_alpha_over_sqrt_r(tmp_path):
    from mmrl import Trainer

    t = Trainer(base(tmp_path), [reward_len], args=args_for(tmp_path, use_rslora=True, lora_r=4, lora_alpha=8),
                train_dataset=train_rows())
    q = t.accelerator.unwrap_model(t.policy.model).base_model.model.model.layers[0].self_attn.q_proj
    assert q.scaling["default"] == pytest.approx(8 / 4 ** 0.5)  # rsLoRA (Kalajdzievski 2023): alpha / sqrt(r)
    t2 = Trainer(tmp_path / "base", [reward_len], args=args_for(tmp_path, output_dir=str(tmp_path / "run2")),
                 train_dataset=train_rows())
    assert t2.accelerator.unwrap_model(t2.policy.model).base_model.model.model.layers[0].self_attn.q_proj.scaling["default"] == 2.0


def errors_of(**kw):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=kw)
    return str(e.value)


def test_dora_and_qlora_settings_are_validated_in_one_line(tmp_path):
    src = base(tmp_path)
    cfg = load_config(overrides={"use_peft": True, "use_dora": True, "model_name_or_path": src})
    assert cfg.use_dora and cfg.bnb_4bit_quant_type == "nf4"
    assert "use_dora=true configures LoRA adapters: set use_peft=true too" in errors_of(use_dora=True)
    assert "use_rslora=true configures LoRA adapters" in errors_of(use_rslora=True)
    err = errors_of(load_in_4bit=True, model_name_or_path=src)
    assert "load_in_4bit=true quantizes the frozen base, which trains through LoRA adapters only" in err
    assert "choose one" in errors_of(load_in_4bit=True, load_in_8bit=True, use_peft=True, model_name_or_path=src)
    assert "is built in memory" in errors_of(load_in_8bit=True, use_peft=True, model_name_or_path="tiny")
    assert "not family='janus'" in errors_of(load_in_4bit=True, use_peft=True, family="janus", model_name_or_path=src)
    assert "set load_in_4bit=true too" in errors_of(bnb_4bit_quant_type="fp4", use_peft=True)
    assert "bnb_4bit_quant_type" in errors_of(bnb_4bit_quant_type="int4")  # not a 4-bit type bitsandbytes has
    if not HAS_BNB:
        err = errors_of(load_in_4bit=True, use_peft=True, model_name_or_path=src)
        assert "load_in_4bit=true needs bitsandbytes, which is not installed here: pip install 'mmrl[qlora]'" in err
        assert err.count("\n  - ") == 1  # the only problem, on its own line


def test_qlora_config_is_trls(tmp_path):
    """The BitsAndBytesConfig is TRL's get_quantization_config's for the same ModelConfig values."""
    pytest.importorskip("trl")
    from trl import ModelConfig, get_quantization_config

    from mmrl.training.policy_factory import quantization_config

    cfg = load_config(overrides={"use_peft": True, "load_in_4bit": True, "bnb_4bit_quant_type": "fp4",
                                 "use_bnb_nested_quant": True, "torch_dtype": "bfloat16", "model_name_or_path": "m"},
                      validate=False)
    ours = quantization_config(cfg)
    theirs = get_quantization_config(ModelConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4", use_bnb_nested_quant=True,
                                                 dtype="bfloat16", bnb_4bit_quant_storage="uint8"))
    keys = ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype",
            "bnb_4bit_quant_storage")
    assert {k: str(getattr(ours, k)) for k in keys} == {k: str(getattr(theirs, k)) for k in keys}


@pytest.mark.skipif(not HAS_BNB, reason="QLoRA needs bitsandbytes (pip install 'mmrl[qlora]'); CI does not install it")
def test_qlora_trains_lora_on_a_4bit_base_on_cpu(tmp_path):
    """load_in_4bit=true: the base's linear layers are bitsandbytes Linear4bit (nf4), frozen; one GRPO step trains the
    adapters on them; the saved adapter loads onto the unquantized base."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    from mmrl import Trainer

    src = base(tmp_path, hidden_size=64, intermediate_size=128)  # 4-bit blocks are 64 weights: in_features >= 64
    t = Trainer(src, [reward_len], args=args_for(tmp_path, load_in_4bit=True), train_dataset=train_rows())
    model = t.accelerator.unwrap_model(t.policy.model)
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    assert isinstance(q.base_layer, bnb.nn.Linear4bit) and q.base_layer.weight.quant_state.quant_type == "nf4"
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    b0 = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    t.train()
    now = dict(model.named_parameters())
    assert any(not torch.equal(now[n].detach(), v) for n, v in b0.items())
    rows = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows if "loss" in r)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run")  # base in float32 + the trained adapter
    assert logits(loaded).shape == logits(model).shape
