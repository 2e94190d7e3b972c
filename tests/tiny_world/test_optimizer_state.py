"""The pre-training AdamW state of a base (mmrl/checkpointing/optimizer_state.py, issue 24 item 5): a real tiny
masked-diffusion model pre-trained for a few steps saves it (safetensors), loading gives back exactly the saved
moments, one AdamW step from the loaded state is the hand-computed AdamW step, the weights digest ignores the file,
and a base or folder without it (or a model it was not saved for) is a one-line error."""
import pytest
import torch

from mmrl.checkpointing.optimizer_state import (OPTIMIZER_FILE, adamw_state_tensors, init_adamw_from, load_adamw_state,
                                                named_trainable, pretraining_optimizer_file, save_adamw_state)
from mmrl.config.train_config import load_config
from mmrl.core.optim import build_optimizer
from mmrl.models import adapter_class
from mmrl.tiny_world.models import model_dir, weights_digest
from mmrl.tiny_world.pretrain import masked_diffusion_sft

PROMPTS = ["1 2 3 -> 6", "2 3 4 -> 9", "1 1 5 -> 7", "3 3 1 -> 7"]
TARGETS = ["(1+2)+3", "(2+3)+4", "(1+1)+5", "(3+3)+1"]


def _pretrained(steps: int = 3):
    """A real tiny masked-diffusion adapter after `steps` pre-training steps, and its final AdamW."""
    policy = adapter_class("masked_diffusion").tiny(seed=0, gen_length=8, block_length=8, steps=8)
    kept = []
    masked_diffusion_sft(policy, PROMPTS, TARGETS, gen_length=8, steps=steps, batch_size=4, progress=False,
                         keep_optimizer=kept.append)
    return policy, kept[0]


def test_saved_state_loads_back_exactly(tmp_path):
    policy, opt = _pretrained()
    path = save_adamw_state(policy.model, opt, tmp_path)
    assert path.name == OPTIMIZER_FILE
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # a safetensors file (never a pickle)
        assert f.metadata()["format"] == "mmrl-adamw-state"
    loaded = load_adamw_state(path)
    named = named_trainable(policy.model)
    assert set(loaded) == {n for n, _ in named}
    for name, p in named:
        st = opt.state[p]
        assert torch.equal(loaded[name]["exp_avg"], st["exp_avg"]) and torch.equal(loaded[name]["exp_avg_sq"], st["exp_avg_sq"])
        assert float(loaded[name]["step"]) == float(st["step"]) == 3.0
    fresh = torch.optim.AdamW([p for _, p in named], lr=1e-3)
    assert init_adamw_from(fresh, named, loaded) == len(named)
    again = adamw_state_tensors(policy.model, fresh)  # the loaded optimizer holds exactly the saved state
    saved = adamw_state_tensors(policy.model, opt)
    assert set(again) == set(saved) and all(torch.equal(again[k], saved[k]) for k in saved)


def test_one_step_from_the_loaded_state_is_the_hand_computed_adamw_step(tmp_path):
    policy, opt = _pretrained()
    state = load_adamw_state(save_adamw_state(policy.model, opt, tmp_path))
    cfg = load_config(None, dict(learning_rate=5e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.01))
    named = named_trainable(policy.model)
    rl_opt = build_optimizer([p for _, p in named], cfg)  # the trainer's AdamW
    init_adamw_from(rl_opt, named, state)
    before = {n: p.detach().clone() for n, p in named}
    g = torch.Generator().manual_seed(1)
    grads = {n: torch.randn(p.shape, generator=g) * 1e-3 for n, p in named}
    for n, p in named:
        p.grad = grads[n].clone()
    rl_opt.step()
    lr, b1, b2, eps, wd = 5e-4, 0.9, 0.999, 1e-8, 0.01
    t = 3 + 1  # the saved step count, plus this step
    for n, p in named:  # AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW's documented update)
        m = b1 * state[n]["exp_avg"] + (1 - b1) * grads[n]
        v = b2 * state[n]["exp_avg_sq"] + (1 - b2) * grads[n] ** 2
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        expected = before[n] * (1 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps)
        assert torch.allclose(p.detach(), expected, rtol=1e-5, atol=1e-8), n
    # from zeros (a fresh AdamW) the same gradient moves every weight by about lr instead
    fresh_policy, _ = _pretrained()
    fnamed = named_trainable(fresh_policy.model)
    fresh = build_optimizer([p for _, p in fnamed], cfg)
    fbefore = [p.detach().clone() for _, p in fnamed]
    for (n, p) in fnamed:
        p.grad = grads[n].clone()
    fresh.step()
    moved = torch.cat([(p.detach() - b * (1 - lr * wd)).abs().flatten() for (_, p), b in zip(fnamed, fbefore)])
    assert float(moved.mean()) == pytest.approx(lr, rel=1e-3)


def test_a_mismatched_state_is_a_clear_error(tmp_path):
    policy, opt = _pretrained(steps=1)
    state = load_adamw_state(save_adamw_state(policy.model, opt, tmp_path))
    named = named_trainable(policy.model)
    fresh = torch.optim.AdamW([p for _, p in named])
    first = named[0][0]
    renamed = {("other." + k if k == first else k): v for k, v in state.items()}
    with pytest.raises(ValueError, match=f"no AdamW state for parameter '{first}'"):
        init_adamw_from(fresh, named, renamed)
    with pytest.raises(ValueError, match="has AdamW state for 'extra.weight'"):
        init_adamw_from(fresh, named, {**state, "extra.weight": state[first]})
    bad = {**state, first: {**state[first], "exp_avg": torch.zeros(3)}}
    with pytest.raises(ValueError, match=rf"{first}.exp_avg has shape \(3,\)"):
        init_adamw_from(fresh, named, bad)


def test_weights_digest_leaves_the_optimizer_file_out(tmp_path):
    policy, opt = _pretrained(steps=1)
    policy.save_pretrained(tmp_path)
    without = weights_digest(tmp_path)
    save_adamw_state(policy.model, opt, tmp_path)
    assert (tmp_path / OPTIMIZER_FILE).is_file() and weights_digest(tmp_path) == without
    (tmp_path / "extra.safetensors").write_bytes((tmp_path / OPTIMIZER_FILE).read_bytes())
    assert weights_digest(tmp_path) != without  # any other weight file still counts


def test_a_base_without_the_file_is_a_one_line_error_naming_the_rebuild(tmp_path, monkeypatch):
    import mmrl.tiny_world

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    mmrl.tiny_world.register()
    folder = model_dir("countdown3-md")
    folder.mkdir(parents=True)
    (folder / "tiny_spec.json").write_text("{}")  # a cache of a build before bases kept their AdamW state
    with pytest.raises(FileNotFoundError) as err:
        pretraining_optimizer_file("tiny-world:countdown3-md")
    msg = str(err.value)
    assert "\n" not in msg and "'countdown3-md'" in msg and "mmrl pretrain-tiny --force --no-eval countdown3-md" in msg
    with pytest.raises(FileNotFoundError, match=f"has no {OPTIMIZER_FILE}"):
        pretraining_optimizer_file(str(tmp_path / "plain-model"))
    with pytest.raises(ValueError, match="keeps no optimizer state"):
        pretraining_optimizer_file("tiny-world:shapes")  # a janus base: its build saves none


def test_the_trainer_starts_from_the_saved_moments_and_refuses_a_folder_without_them(tmp_path):
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for, reward_for

    policy, opt = _pretrained(steps=2)
    policy.save_pretrained(tmp_path / "base")
    values = dict(method="diffu_grpo", family="masked_diffusion", model_name_or_path=str(tmp_path / "base"), max_steps=1,
                  num_generations=4, per_device_train_batch_size=4, learning_rate=1e-3, max_completion_length=8,
                  block_length=8, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0, report_to=["jsonl"],
                  init_optimizer_from_base=True)
    with pytest.raises(FileNotFoundError, match=f"has no {OPTIMIZER_FILE}"):  # before the model loads
        Trainer(load_config(None, values), dataset=dataset_for("masked_diffusion", 8), reward_funcs=[reward_for("masked_diffusion")])
    save_adamw_state(policy.model, opt, tmp_path / "base")
    trainer = Trainer(load_config(None, {**values, "output_dir": str(tmp_path / "run2")}),
                      dataset=dataset_for("masked_diffusion", 8), reward_funcs=[reward_for("masked_diffusion")])
    got = adamw_state_tensors(trainer.policy.model, trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer)
    saved = adamw_state_tensors(policy.model, opt)
    assert set(got) == set(saved) and all(torch.equal(got[k], saved[k]) for k in saved)
