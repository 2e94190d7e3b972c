"""CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5) against hand-computed values; `loss_type=cispo` end to end."""
import math

import pytest
import torch

from mmrl.algorithms import LOSS_TYPES, POLICY_LOSSES, accumulated_loss, cispo_loss, policy_loss, surrogate_loss


def test_cispo_by_hand():
    # rho = [2, 1, 0.1]: the first weight is clipped at 1 + 0.28, the third keeps 0.1 (no lower bound)
    old = torch.log(torch.tensor([[0.25, 0.25, 0.5]]))
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.05]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = cispo_loss(logp, old, adv, mask, eps_high=0.28)
    want = [-1.28 * math.log(0.5), -1.0 * math.log(0.25), 0.1 * math.log(0.05)]
    torch.testing.assert_close(loss.detach(), torch.tensor([want]))
    loss.sum().backward()
    # the weight is a constant: d loss / d logp = -w * A, also where the weight is clipped (PPO's clip drops it)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -1.0, 0.1]]))
    assert float(m["cispo_clip_ratio"]) == pytest.approx(1 / 3)


def test_cispo_gradient_equals_the_clipped_surrogate_where_nothing_is_clipped():
    torch.manual_seed(0)
    old = torch.randn(3, 5) * 0.01 - 2
    logp = (old + torch.randn(3, 5) * 0.01).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.rand(3, 5) > 0.2
    g1, = torch.autograd.grad(cispo_loss(logp, old, adv, mask, eps_high=0.5)[0].sum(), logp)
    g2, = torch.autograd.grad(policy_loss(logp, old, adv, mask, eps_low=0.5, eps_high=0.5)[0].sum(), logp)
    torch.testing.assert_close(g1, g2)
    assert (g1[~mask] == 0).all()


def test_padding_gives_zero_even_with_minus_infinity():
    logp = torch.tensor([[-1.0, float("-inf")]])
    loss, _ = cispo_loss(logp, torch.tensor([[-1.0, -1.0]]), torch.tensor([1.0]), torch.tensor([[True, False]]))
    assert loss[0, 1] == 0 and torch.isfinite(loss).all()


def test_cispo_is_a_registered_loss_with_the_token_mean():
    assert POLICY_LOSSES["cispo"] is cispo_loss and surrogate_loss("cispo") is cispo_loss
    assert surrogate_loss("dapo") is policy_loss and LOSS_TYPES["cispo"] == "token_mean"
    per_token = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # TRL's cispo normalisation: the valid tokens of the whole accumulated batch (here 6 over all micro-batches)
    assert float(accumulated_loss(per_token, mask, "cispo", global_tokens=6, global_seqs=4, max_len=2)) == pytest.approx(1.0)


def test_loss_type_cispo_trains(tmp_path):
    from mmrl.config.train_config import load_config
    from mmrl.models import adapter_class
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for, vowel_reward

    cfg = load_config(None, dict(method="grpo", loss_type="cispo", family="causal_lm", max_steps=2, num_iterations=2,
                                 num_generations=4, per_device_train_batch_size=4, max_completion_length=6,
                                 learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
                                 dynamic_sampling=False))
    out = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                  reward_funcs=[vowel_reward]).train()
    assert math.isfinite(out["loss"]) and "cispo_clip_ratio" in out and "clip_ratio/region_mean" not in out
