"""policy_loss + aggregate: loop reference, hand-computed values, TRL's loss formulas (docs/algorithms.md section 2)."""
import math

import pytest
import torch

from mmrl.algorithms import AGGREGATIONS, UnknownNameError, aggregate, policy_loss


def loop_policy_loss(logp, old, adv, mask, eps_low, eps_high, dual_clip, ref, beta):
    n, t = logp.shape
    out = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        for j in range(t):
            if not mask[i, j]:
                continue
            a = float(adv[i, j] if adv.dim() == 2 else adv[i])
            rho = math.exp(float(logp[i, j]) - float(old[i, j]))
            clipped = min(max(rho, 1 - eps_low), 1 + eps_high)
            loss = -min(rho * a, clipped * a)
            if dual_clip is not None and a < 0:
                loss = min(loss, -dual_clip * a)
            if beta > 0:
                d = float(ref[i, j]) - float(logp[i, j])
                loss += beta * (math.exp(d) - d - 1)
            out[i, j] = loss
    return out


def loop_aggregate(loss, mask, mode):
    n, t = loss.shape
    if mode == "token_mean":
        return sum(float(loss[i, j]) for i in range(n) for j in range(t) if mask[i, j]) / max(1, int(mask.sum()))
    if mode == "seq_mean_token_mean":
        per = []
        for i in range(n):
            k = int(mask[i].sum())
            per.append(sum(float(loss[i, j]) for j in range(t) if mask[i, j]) / max(1, k))
        return sum(per) / n
    return sum(float(loss[i, j]) for i in range(n) for j in range(t) if mask[i, j]) / (n * t)


def random_inputs(seed, n, t, token_adv=False):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, t, generator=g) * 3
    old = logp + 0.4 * torch.randn(n, t, generator=g)
    ref = logp + 0.4 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, t, generator=g) if token_adv else torch.randn(n, generator=g)
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    mask[0] = True  # at least one full row
    return logp, old, adv, mask, ref


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n,t", [(4, 5), (8, 13), (3, 1)])
@pytest.mark.parametrize("token_adv", [False, True])
@pytest.mark.parametrize("opts", [dict(), dict(eps_high=0.28), dict(dual_clip=3.0, eps_high=0.28), dict(beta=0.04)])
def test_matches_loop_reference(seed, n, t, token_adv, opts):
    logp, old, adv, mask, ref = random_inputs(seed, n, t, token_adv)
    kw = dict(eps_low=0.2, eps_high=0.2, dual_clip=None, beta=0.0) | opts
    got, metrics = policy_loss(logp, old, adv, mask, ref_logp=ref if kw["beta"] > 0 else None, **kw)
    want = loop_policy_loss(logp, old, adv, mask, kw["eps_low"], kw["eps_high"], kw["dual_clip"], ref, kw["beta"])
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    for mode in AGGREGATIONS:
        torch.testing.assert_close(float(aggregate(got, mask, mode)), loop_aggregate(want, mask, mode), atol=1e-5, rtol=1e-5)
    # clip metrics, TRL's definitions, by loop
    a = adv if adv.dim() == 2 else adv[:, None].expand(n, t)
    rho = torch.exp(logp - old)
    low = [(rho[i, j] < 1 - kw["eps_low"]) and a[i, j] < 0 for i in range(n) for j in range(t) if mask[i, j]]
    high = [(rho[i, j] > 1 + kw["eps_high"]) and a[i, j] > 0 for i in range(n) for j in range(t) if mask[i, j]]
    assert float(metrics["clip_ratio/low_mean"]) == pytest.approx(sum(low) / len(low))
    assert float(metrics["clip_ratio/high_mean"]) == pytest.approx(sum(high) / len(high))
    assert float(metrics["clip_ratio/region_mean"]) == pytest.approx(sum(l or h for l, h in zip(low, high)) / len(low))


def test_hand_computed_clip_and_kl():
    # one sequence, three tokens, A = +1 for the row; eps 0.2
    # token 0: rho = e^0 = 1            -> loss = -1
    # token 1: rho = e^0.5 = 1.6487     -> clipped to 1.2, min(1.6487, 1.2) = 1.2 -> loss = -1.2
    # token 2: rho = e^-0.5 = 0.60653   -> clip 0.8; min(0.60653, 0.8) = 0.60653 -> loss = -0.60653
    logp = torch.tensor([[-1.0, -0.5, -1.5]])
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask)
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -1.2, -0.606531]]), atol=1e-6, rtol=0)
    assert float(m["clip_ratio/high_mean"]) == pytest.approx(1 / 3)  # token 1 clipped above with A > 0
    assert float(m["clip_ratio/low_mean"]) == 0.0  # token 2 is below 0.8 but A > 0: not a clip event
    # token_mean = (-1 - 1.2 - 0.606531) / 3 = -0.935510
    assert float(aggregate(loss, mask, "token_mean")) == pytest.approx(-0.935510, abs=1e-6)
    # A = -1: token 2: rho 0.60653 -> -min(-0.60653, -0.8) = 0.8; token 1: -min(-1.6487, -1.2) = 1.6487
    # dual clip c = 1.5 bounds token 1 at -c*A = 1.5
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, dual_clip=1.5)
    torch.testing.assert_close(loss, torch.tensor([[1.0, 1.5, 0.8]]), atol=1e-6, rtol=0)
    # k3 KL with beta 0.1, ref = [-1.2, -0.5, -1.0]: d = ref - logp = [-0.2, 0, 0.5]
    # k3 = e^d - d - 1 = [0.018731, 0, 0.148721]
    ref = torch.tensor([[-1.2, -0.5, -1.0]])
    loss_kl, m = policy_loss(logp, old, torch.tensor([1.0]), mask, ref_logp=ref, beta=0.1)
    torch.testing.assert_close(loss_kl - loss_kl.new_tensor([[-1.0, -1.2, -0.606531]]), torch.tensor([[0.0018731, 0.0, 0.0148721]]), atol=1e-6, rtol=0)
    assert float(m["kl"]) == pytest.approx((0.018731 + 0.148721) / 3, abs=1e-6)


def test_hand_computed_aggregations():
    # loss rows [1, 2, 3 | pad] and [4 | pad pad pad]; mask counts 3 and 1
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert float(aggregate(loss, mask, "token_mean")) == pytest.approx((1 + 2 + 3 + 4) / 4)  # 2.5
    assert float(aggregate(loss, mask, "seq_mean_token_mean")) == pytest.approx((2.0 + 4.0) / 2)  # 3.0
    assert float(aggregate(loss, mask, "seq_mean_token_sum_norm")) == pytest.approx(10 / (2 * 4))  # 1.25
    assert float(aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=10)) == pytest.approx(10 / 20)
    assert float(aggregate(loss, mask, "token_mean", num_items=8)) == pytest.approx(10 / 8)


def trl_loss(logp, old, adv, mask, ref, loss_type, eps_low, eps_high, beta, max_completion_length):
    """TRL 1.16 `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py, token-level importance sampling, one
    process, no gradient accumulation), restated from its documented formulas:
        coef_1 = exp(logp - old); coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        per_token_loss = -min(coef_1 * A, coef_2 * A) (+ beta * (exp(ref - logp) - (ref - logp) - 1))
        grpo:    ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        dr_grpo: (per_token_loss * mask).sum() / (B * max_completion_length)
        dapo:    (per_token_loss * mask).sum() / num_items_in_batch   (active tokens of the batch)
    """
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    per = -torch.min(coef_1 * a, coef_2 * a)
    if beta != 0.0:
        per = per + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    m = mask.float()
    if loss_type == "grpo":
        return ((per * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per * m).sum() / (per.size(0) * max_completion_length)
    return (per * m).sum() / m.sum().clamp(min=1.0)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_loss_as_trl(loss_type, beta, seed):
    logp, old, adv, mask, ref = random_inputs(seed, 8, 12)
    logp.requires_grad_(True)
    per, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, ref_logp=ref, beta=beta)
    ours = aggregate(per, mask, loss_type)
    theirs = trl_loss(logp, old, adv, mask, ref, loss_type, 0.2, 0.28, beta, max_completion_length=12)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    g1, = torch.autograd.grad(ours, logp)
    g2, = torch.autograd.grad(theirs, logp)
    torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-6)


def test_padding_is_inert_and_empty_rows():
    logp = torch.tensor([[-1.0, float("-inf")], [float("nan"), float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[True, False], [False, False]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, 1.0]), mask, ref_logp=old, beta=0.1)
    assert torch.isfinite(loss).all() and loss[0, 1] == 0 and (loss[1] == 0).all()
    for mode in AGGREGATIONS:
        total = aggregate(loss, mask, mode)
        total.backward(retain_graph=True)
        assert torch.isfinite(total) and torch.isfinite(logp.grad).all()
    empty = torch.zeros(2, 3, dtype=torch.bool)
    assert float(aggregate(torch.ones(2, 3), empty, "token_mean")) == 0.0
    assert float(aggregate(torch.ones(2, 3), empty, "seq_mean_token_mean")) == 0.0


def test_one_valid_token():
    loss, _ = policy_loss(torch.tensor([[-0.3, 0.0]]), torch.tensor([[-0.3, 0.0]]), torch.tensor([2.0]), torch.tensor([[True, False]]))
    assert loss.tolist() == [[-2.0, 0.0]]


def test_bad_arguments():
    x = torch.zeros(2, 2)
    m = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(UnknownNameError, match="valid"):
        aggregate(x, m, "sum")
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(x, x, torch.zeros(2), m, beta=0.1)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(x, x, torch.zeros(2), m, dual_clip=0.5)
