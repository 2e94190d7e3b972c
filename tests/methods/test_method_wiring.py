"""The trainer hands each method the right tensors in the right order (docs/design.md, "Methods").

Each test runs one optimizer step and checks the token credit the method handed back (advantage x token weight,
which is what the gradient sees) against weights recomputed here from independent forwards of the initial policy:
GCPO's weights come from (positive, negative) log-probs in that order, DGPO's from (policy, reference), DMPO's
importance weights are a softmax over the response's own group. Each test also checks that the wrong wiring
(swapped arguments, shifted groups) gives different numbers, so it would fail.
"""
import copy

import pytest
import torch

from mmrl.algorithms import dgpo_token_weights, gcpo_token_weights
from mmrl.algorithms.gspo import gspo_loss, gspo_sequence_ratio
from mmrl.config.train_config import load_config
from mmrl.methods import METHODS, Method, method_class
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, reward_for


def one_step(method, family, out, policy=None, **extra):
    values = dict(method=method, family=family, max_steps=1, num_generations=4, per_device_train_batch_size=4,
                  gradient_accumulation_steps=2, learning_rate=1e-2, max_completion_length=8, block_length=4,
                  output_dir=str(out), progress_bar=False, dynamic_sampling=False, num_iterations=1, save_steps=0,
                  report_to=["jsonl"], seed=0)
    values.update(extra)
    cfg = load_config(None, values)
    policy = policy or adapter_class(family).tiny(seed=0)
    initial = copy.deepcopy(policy)
    trainer = Trainer(cfg, policy=policy, dataset=dataset_for(family), reward_funcs=[reward_for(family)])
    trainer.train()
    return trainer, initial


@pytest.mark.parametrize("negative_forward", ["separate", "batched"])
def test_gcpo_weights_come_from_positive_then_negative(tmp_path, negative_forward):
    # info gain (logp_pos - logp_neg) is antisymmetric: a swap reverses the token ranks the weights are made of
    trainer, initial = one_step("gcpo", "causal_lm", tmp_path, gcpo_divergence="info_gain",
                                gcpo_negative_forward=negative_forward)
    buf, cfg = trainer.buffer, trainer.cfg
    with torch.no_grad():
        pos = initial.logprob(buf.rollout).logp  # [N, T]
        neg = initial.logprob(buf.rollout, condition="negative").logp  # [N, T]
    assert not torch.allclose(pos, neg), "the negative condition must change the log-probs for this test to mean anything"
    opts = dict(divergence=cfg.gcpo_divergence, normalization=cfg.gcpo_normalization, top_fraction=cfg.gcpo_top_fraction,
                target_mass=cfg.gcpo_target_mass)
    mask = buf.loss_mask
    right = buf.advantages[:, None] * gcpo_token_weights(pos, neg, mask, **opts) * mask
    swapped = buf.advantages[:, None] * gcpo_token_weights(neg, pos, mask, **opts) * mask
    assert not torch.allclose(right, swapped, atol=1e-4), "swapping must change the weights"
    torch.testing.assert_close(buf.credit, right, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_iterations", [1, 2], ids=["weights-in-update", "weights-at-buffer-time"])
def test_dgpo_weights_come_from_policy_against_reference(tmp_path, num_iterations):
    policy = adapter_class("causal_lm").tiny(seed=0)
    ref = adapter_class("causal_lm").tiny(seed=1).model.requires_grad_(False).eval()
    with torch.no_grad():  # a sharp reference (low entropy) beside the near-uniform random policy
        ref.get_output_embeddings().weight.mul_(30.0)
    policy.ref_model = ref
    trainer, initial = one_step("dgpo", "causal_lm", tmp_path, policy=policy, num_iterations=num_iterations, max_steps=1)
    buf = trainer.buffer
    reverse = copy.deepcopy(initial)
    reverse.model, reverse.ref_model = initial.ref_model, initial.model
    with torch.no_grad():
        right = initial.logprob(buf.rollout, stats=("h2", "entropy"), stats_against="reference").stats
        wrong = reverse.logprob(buf.rollout, stats=("h2", "entropy"), stats_against="reference").stats
    mask, v = buf.loss_mask, initial.vocab_size
    want = buf.advantages[:, None] * dgpo_token_weights(right["h2"], right["entropy"], mask, vocab_size=v) * mask
    other = buf.advantages[:, None] * dgpo_token_weights(wrong["h2"], wrong["entropy"], mask, vocab_size=v) * mask
    assert not torch.allclose(want, other, atol=1e-4), "the entropy gate is the policy's: swapping must change the weights"
    torch.testing.assert_close(buf.credit, want, rtol=1e-5, atol=1e-6)


def test_dmpo_weights_are_a_softmax_over_the_responses_group(tmp_path):
    trainer, _ = one_step("dmpo", "causal_lm", tmp_path, dmpo_target="behaviour", dmpo_baseline="group", dmpo_alpha=0.5)
    buf, G = trainer.buffer, trainer.cfg.num_generations
    logits = buf.rewards.float() / 0.5  # [N]; the behaviour target has log p_ref - log p_v = 0
    want = torch.softmax(logits.view(-1, G), dim=-1).flatten()  # [N]
    shifted = torch.softmax(logits.roll(1).view(-1, G), dim=-1).flatten().roll(-1)  # groups off by one response
    assert not torch.allclose(want, shifted, atol=1e-4)
    torch.testing.assert_close(buf.method_state["weights"], want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(buf.method_state["weights"].view(-1, G).sum(-1), torch.ones(buf.rewards.numel() // G))
    # the credit is w_real = w - 1/G (group baseline) on every valid token
    torch.testing.assert_close(buf.credit, (want - 1.0 / G)[:, None] * buf.loss_mask, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------- GSPO, the 8th method

def test_gspo_loss_hand_computed():
    # response 0: token log-ratios 0.2, 0.0 (+ one padding token with a wild value): s0 = exp(0.1) = 1.10517
    # response 1: token log-ratios -0.1, -0.1: s1 = exp(-0.1) = 0.904837
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, 0.0, 50.0], [-0.1, -0.1, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = torch.tensor([1.0, -1.0])
    s = gspo_sequence_ratio(logp, old, mask)
    torch.testing.assert_close(s, torch.tensor([1.1051709, 0.9048374]))
    # wide clip range: nothing clipped, loss_i = -s_i * A_i
    loss, m = gspo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.1051709, 0.9048374]))
    assert float(m["clip_ratio/region_mean"]) == 0.0
    # d loss_0 / d logp_0t = -A_0 * s_0 / |o_0| on valid tokens, 0 on padding
    loss[0].backward()
    torch.testing.assert_close(logp.grad[0], torch.tensor([-1.1051709 / 2, -1.1051709 / 2, 0.0]))
    # narrow range (0.05): s0 > 1.05 with A > 0 -> -1.05; s1 < 0.95 with A < 0 -> min(-0.9048, -0.95) -> 0.95
    loss, m = gspo_loss(logp.detach(), old, adv, mask, eps_low=0.05, eps_high=0.05)
    torch.testing.assert_close(loss, torch.tensor([-1.05, 0.95]))
    assert float(m["clip_ratio/region_mean"]) == 1.0


def test_gspo_is_one_registered_file_with_defaults(tmp_path):
    assert method_class("gspo") is METHODS["gspo"] and issubclass(METHODS["gspo"], Method)
    cfg = load_config(None, dict(method="gspo"))
    assert (cfg.epsilon, cfg.eps_high, cfg.beta) == (3e-4, 4e-4, 0.0)
    trainer, _ = one_step("gspo", "masked_diffusion", tmp_path, num_iterations=2, max_steps=2, learning_rate=1e-1)
    import json

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["gspo/ratio_mean"] == 1.0  # the first step's ratio is exactly 1 (same code, same masks)
    assert records[1]["gspo/ratio_mean"] != 1.0  # after one update the ratio moves
    with pytest.raises(ValueError, match="valid names.*gspo"):
        method_class("gspo2")


def test_method_hooks_validate_and_shape_the_rewards(tmp_path):
    from mmrl.models import FAMILIES

    # family support and the refusal are the method's (config_errors / supports_family), before any model loads
    with pytest.raises(ValueError, match=r"method 'stage' compares the code vectors of image tokens; family 'causal_lm'"):
        load_config(None, dict(method="stage", family="causal_lm")).validate()
    assert [f for f in FAMILIES if METHODS["stage"].supports_family(adapter_class(f))] == ["janus"]
    assert METHODS["grpo"].needs_reference(load_config(None, dict(method="grpo", gcpo_entropy_reward=0.4)))
    assert not METHODS["grpo"].needs_reference(load_config(None, dict(method="grpo")))
    # the trainer adds what the method's shape_rewards gives, before the advantages, and logs its metrics
    cfg = load_config(None, dict(method="grpo", family="causal_lm", max_steps=1, num_generations=4,
                                 per_device_train_batch_size=4, max_completion_length=4, output_dir=str(tmp_path),
                                 progress_bar=False, save_steps=0, dynamic_sampling=False))
    from tiny_world_fixtures import dataset_for

    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(prompts)])
    t.method.shape_rewards = lambda rollout, rewards, mbs, k: (rewards + torch.arange(rewards.numel()) % 2, {"rewards/x": 3.0})
    buf = t._collect()
    assert buf.rewards.tolist() == [0.0, 1.0, 0.0, 1.0] and buf.metrics["rewards/x"] == 3.0
    assert buf.advantages.tolist() == pytest.approx([-0.866, 0.866, -0.866, 0.866], abs=1e-3)  # (r - 0.5) / std


def test_dmpo_kl_term_is_beta_times_the_token_mean_k3_to_the_reference(tmp_path):
    # DMPO's optional KL term (issue 24 item 2): loss(beta) - loss(0) on the same buffer and weights must be beta x
    # the global token mean of k3(policy, reference), with the reference's scores, not the policy's (k3 is asymmetric)
    import dataclasses

    from mmrl.methods.base import MicroBatch

    policy = adapter_class("causal_lm").tiny(seed=0)
    ref = adapter_class("causal_lm").tiny(seed=1).model.requires_grad_(False).eval()
    with torch.no_grad():  # a sharp reference far from the near-uniform policy: k3 is far from 0
        ref.get_output_embeddings().weight.mul_(30.0)
    policy.ref_model = ref
    beta = 0.3
    trainer, initial = one_step("dmpo", "causal_lm", tmp_path, policy=policy, beta=beta, dmpo_target="behaviour",
                                dmpo_baseline="group", gradient_accumulation_steps=1, per_device_train_batch_size=8)
    buf, method = trainer.buffer, trainer.method
    with torch.no_grad():
        want_ref = initial.logprob(buf.rollout, use_reference=True).logp  # [N, T]
        behaviour = initial.logprob(buf.rollout).logp  # [N, T]
    mask = buf.loss_mask.bool()
    torch.testing.assert_close(buf.ref_logp[0] * mask, want_ref * mask, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want_ref * mask, behaviour * mask, atol=1e-2), "the reference must differ for the test to mean anything"
    idx = torch.arange(buf.rollout.num_responses)
    g_tokens = float(mask.sum())
    mb = MicroBatch(idx, 0, 0, 0, 0, g_tokens, float(len(idx)), float(len(idx) // trainer.cfg.num_generations))
    no_kl = type(method)(dataclasses.replace(trainer.cfg, beta=0.0), policy, method.estimator_options)
    cur = policy.logprob(buf.rollout).logp  # [N, T] the updated policy, with its gradient
    d = want_ref - cur
    k3 = ((torch.exp(d) - d - 1) * mask).sum() / g_tokens
    swapped = (((torch.exp(-d) + d - 1) * mask).sum() / g_tokens).detach()
    assert abs(float(k3.detach()) - float(swapped)) > 1e-3
    with_kl = method.loss(buf, mb)
    without = no_kl.loss(buf, mb)
    torch.testing.assert_close(with_kl.loss - without.loss, beta * k3, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(torch.tensor(with_kl.metrics["kl"]), k3.detach(), rtol=1e-4, atol=1e-6)
    # and the gradient the KL adds is beta x grad k3
    params = [p for p in policy.model.parameters() if p.requires_grad]
    g_with = torch.autograd.grad(with_kl.loss, params, allow_unused=True)
    g_without = torch.autograd.grad(without.loss, params, allow_unused=True)
    g_k3 = torch.autograd.grad(beta * k3, params, allow_unused=True)
    for a, b, c in zip(g_with, g_without, g_k3):
        if c is not None:
            torch.testing.assert_close(a - b, c, rtol=1e-3, atol=1e-6)


def test_tokens_for_mass_by_hand():
    """The share of an answer's tokens carrying half its |weight|: uniform 4 tokens -> 2/4; one heavy token of
    weight 3 among three of 1/3 (total 4) -> 1/4; the mask's padding is not counted; no token -> nan."""
    from mmrl.methods.base import tokens_for_mass, weight_metrics

    w = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 1 / 3, 1 / 3, 1 / 3], [1.0, 1.0, 9.0, 9.0], [1.0, 1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    got = tokens_for_mass(w, mask)
    assert got[:3].tolist() == pytest.approx([0.5, 0.25, 0.5]) and torch.isnan(got[3])
    assert weight_metrics("x", w, mask)["x/tokens_for_half"] == pytest.approx((0.5 + 0.25 + 0.5) / 3)
