"""The authors' T2I variants by name (issue 26): STAGE's similarity masks and KL mask, GCPO T2I's KL mask, the
advantage epsilon, against hand-computed numbers; the STAGE and GCPO presets train two steps with their KL masks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def close(t: torch.Tensor, expected, rtol: float = 1e-6) -> bool:
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=1e-7)


# ------------------------------------------------------------------------------ STAGE and the KL masks


def test_stage_masks_on_a_hand_computed_group():
    from mmrl.algorithms.stage import opposite_advantage_similarity, stage_kl_mask, stage_token_masks, weighted_mean_weights

    # one group of 3 images of 2 tokens, 2-d code vectors; A = (1, -0.5, -0.5): image 0 is opposite to 1 and 2,
    # images 1 and 2 only to 0
    codes = torch.tensor([[[1.0, 0.0], [1.0, 0.0]],
                          [[0.0, 1.0], [-1.0, 0.0]],
                          [[2.0, 0.0], [0.0, 3.0]]])  # [N=3, T=2, C=2] (scale does not matter)
    adv = torch.tensor([1.0, -0.5, -0.5])
    sim = opposite_advantage_similarity(codes, adv, 3)
    # image 0: t0 (cos 0 + cos 1) / 2, t1 (cos -1 + cos 0) / 2; image 1: against 0 only; image 2: against 0 only
    assert close(sim, [[0.5, -0.5], [0.0, -1.0], [1.0, 0.0]])
    assert close(stage_token_masks(sim), [[0.25, 0.75], [0.5, 1.0], [0.0, 0.5]])
    assert close(stage_kl_mask(sim), [[1.0, 0.75], [1.0, 0.5], [1.0, 1.0]])
    # the mask-weighted token mean: masks sum to 3 over the group's 6 tokens, so w = m * 6 / (3 + 1e-6)
    w = weighted_mean_weights(stage_token_masks(sim), torch.ones(3, 2, dtype=torch.bool), 3)
    assert close(w, [[0.5, 1.5], [1.0, 2.0], [0.0, 1.0]])
    # a group of zero advantages: every image is "opposite" to every image, itself included (counted, cosine not
    # added), as the authors' `A_i A_j <= 0` pair mask
    sim0 = opposite_advantage_similarity(codes[:2], torch.zeros(2), 2)
    assert close(sim0, [[0.0, -0.5], [0.0, -0.5]])


def test_gcpo_t2i_kl_mask_and_the_weighted_kl_term():
    from mmrl.algorithms import policy_loss
    from mmrl.algorithms.stage import gcpo_kl_mask

    w = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0, 3.0]])
    assert close(gcpo_kl_mask(w), [[1.0, 1.0, 1.0, 0.75, 0.5, 0.5]])
    # the KL term is beta * m * k3: with logp - ref = log 2 on every token, k3 = 1/2 - log(1/2) - 1 = log 2 - 1/2
    logp = torch.zeros(1, 6)
    ref = torch.full((1, 6), -float(torch.log(torch.tensor(2.0))))
    mask = torch.ones(1, 6, dtype=torch.bool)
    k3 = float(torch.log(torch.tensor(2.0))) - 0.5
    loss, m = policy_loss(logp, logp, torch.zeros(1), mask, ref_logp=ref, beta=0.03, kl_weights=gcpo_kl_mask(w))
    assert close(loss, [[0.03 * k3 * x for x in (1.0, 1.0, 1.0, 0.75, 0.5, 0.5)]], rtol=1e-5)
    assert float(m["kl"]) == pytest.approx(k3)  # the metric stays the unweighted KL


def test_advantage_epsilon_reaches_the_advantages():
    from mmrl.config import load_config
    from mmrl.training.advantages import compute_advantages

    rewards = torch.tensor([0.0, 1e-3, 0.0, 1.0])  # a group of nearly equal rewards, and a clear one
    std = 1e-3 / 2 ** 0.5  # unbiased std of (0, 1e-3)
    for eps in (1e-6, 1e-4):
        cfg = load_config(None, dict(method="grpo", num_generations=2, advantage_epsilon=eps))
        adv = compute_advantages(rewards, torch.ones(4, dtype=torch.bool), cfg, accelerator=None, world=1)
        assert adv[:2].tolist() == pytest.approx([-5e-4 / (std + eps), 5e-4 / (std + eps)], rel=1e-5)
    # 1e-6: +-0.7061; the authors' 1e-4: +-0.6195 (the smaller push on near-ties)
    gcpo = load_config(ROOT / "configs/gcpo_janus_pro_7b_geneval.yaml")
    stage = load_config(ROOT / "configs/stage_janus_pro_7b_geneval.yaml")
    assert gcpo.advantage_epsilon == stage.advantage_epsilon == 1e-4 and gcpo.kl_reweight and stage.kl_reweight
    assert gcpo.reward_funcs == stage.reward_funcs == ["geneval_flow_grpo"]
    assert stage.method == "stage" and stage.num_generations == 8 and stage.beta == 0.03
    grpo = load_config(ROOT / "configs/grpo_janus_pro_7b_geneval.yaml")
    assert grpo.method == "grpo" and not grpo.kl_reweight
    with pytest.raises(Exception, match="kl_reweight=true weights the KL"):
        load_config(None, dict(method="grpo", kl_reweight=True))


@pytest.mark.parametrize("preset", ["stage_janus_pro_7b_geneval", "gcpo_janus_pro_7b_geneval"])
def test_stage_and_gcpo_presets_train_two_steps_with_their_kl_masks(tmp_path, preset, monkeypatch):
    from mmrl.algorithms import policy_loss as plain_policy_loss
    from mmrl.config import load_config
    from mmrl.methods import policy_gradient
    from mmrl.training.trainer import Trainer

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("kl_weights"))
        return plain_policy_loss(*args, **kwargs)

    monkeypatch.setattr(policy_gradient, "surrogate_loss", lambda loss_type: recording)
    cfg = load_config(ROOT / f"configs/{preset}.yaml", dict(
        model_name_or_path="tiny", max_steps=2, num_generations=4, per_device_train_batch_size=4, save_steps=0,
        torch_dtype="float32", mixed_precision="no", output_dir=str(tmp_path / "run"), reward_funcs=[]))

    def reward(prompts, completions, **kw):
        return [float(i % 3) for i in range(len(prompts))]

    t = Trainer(cfg, reward_funcs=[reward])
    t.train()
    assert len(seen) == 2 and all(k is not None for k in seen)
    for k in seen:  # STAGE: 0.5 + 0.5 clamp(c + 1, 0, 1); GCPO: 0.5 + 0.5 clamp(2 - 2w, 0, 1): both in [0.5, 1]
        assert float(k.min()) >= 0.5 and float(k.max()) <= 1.0
    assert any(float(k.min()) < 1.0 for k in seen)


