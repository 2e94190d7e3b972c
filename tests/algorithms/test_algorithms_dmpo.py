"""DMPO weights, baselines, WDCE / WDDO losses, masks and ELBO helper (docs/algorithms.md section 5)."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmrl.algorithms import (
    DMPO_BASELINES,
    UnknownNameError,
    antithetic_masks,
    dmpo_baseline,
    dmpo_weights,
    effective_sample_size,
    elbo_from_masked_logp,
    wdce_loss,
    wddo_loss,
)


def loop_group_softmax(logits, g):
    out = []
    for k in range(len(logits) // g):
        grp = logits[k * g : (k + 1) * g]
        m = max(grp)
        z = sum(math.exp(x - m) for x in grp)
        out += [math.exp(x - m) / z for x in grp]
    return torch.tensor(out, dtype=torch.float64)


def inputs(seed, n):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (n,), generator=g).float() / 2  # rewards in {0, .5, 1}
    lr = 0.5 * torch.randn(n, generator=g)
    lt = 0.5 * torch.randn(n, generator=g)
    return r, lr, lt


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n,g", [(4, 2), (12, 4), (16, 16)])
@pytest.mark.parametrize("alpha,coeff", [(0.04, 1.0), (1.0, 0.5), (0.5, 1.0)])
def test_weights_and_baselines_match_loop(seed, n, g, alpha, coeff):
    r, lr, lt = inputs(seed, n)
    w = dmpo_weights(r, lr, g, alpha=alpha, coeff=coeff)
    ref = loop_group_softmax([coeff * (float(a) / alpha + float(b)) for a, b in zip(r, lr)], g)
    torch.testing.assert_close(w.double(), ref, atol=1e-6, rtol=1e-5)
    kw = dict(rewards=r, log_ref_minus_v=lr, group_size=g, alpha=alpha, coeff=coeff, log_theta_minus_v=lt)
    torch.testing.assert_close(dmpo_baseline("none", **kw), torch.zeros(n))
    torch.testing.assert_close(dmpo_baseline("group", **kw), torch.full((n,), 1 / g))
    ind = loop_group_softmax([coeff * (float(b) - float(a) / alpha) for a, b in zip(r, lr)], g)
    torch.testing.assert_close(dmpo_baseline("individual", **kw).double(), ind, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(dmpo_baseline("model", **kw).double(), loop_group_softmax(lt.tolist(), g), atol=1e-6, rtol=1e-5)


def test_weights_sum_to_one_per_group():
    r, lr, _ = inputs(5, 24)
    for g in (2, 3, 4, 6, 8, 12, 24):
        w = dmpo_weights(r, lr, g)
        torch.testing.assert_close(w.view(-1, g).sum(-1), torch.ones(24 // g), atol=1e-6, rtol=0)
        for kind in ("individual", "model"):
            b = dmpo_baseline(kind, rewards=r, log_ref_minus_v=lr, group_size=g, log_theta_minus_v=lr)
            torch.testing.assert_close(b.view(-1, g).sum(-1), torch.ones(24 // g), atol=1e-6, rtol=0)


def test_hand_computed_weights():
    # G = 2, alpha = 0.5, rewards [1, 0], log_ref_minus_v [0, ln 2]: l = [2, ln 2] -> w = e^2 / (e^2 + 2)
    w = dmpo_weights(torch.tensor([1.0, 0.0]), torch.tensor([0.0, math.log(2)]), 2, alpha=0.5)
    e2 = math.exp(2)
    torch.testing.assert_close(w, torch.tensor([e2 / (e2 + 2), 2 / (e2 + 2)]))  # [0.786986, 0.213014]
    # individual baseline: softmax(lr - r/alpha) = softmax([-2, ln 2]) = [e^-2, 2] / (e^-2 + 2) = [0.135335, 2] / 2.135335 = [0.063379, 0.936621]
    b = dmpo_baseline("individual", rewards=torch.tensor([1.0, 0.0]), log_ref_minus_v=torch.tensor([0.0, math.log(2)]), group_size=2, alpha=0.5)
    torch.testing.assert_close(b, torch.tensor([0.063379, 0.936621]), atol=1e-6, rtol=0)
    # ESS of w: 1 / (2 * (0.786986^2 + 0.213014^2)) = 1 / (2 * 0.664724) = 0.752194
    assert float(effective_sample_size(w, 2)) == pytest.approx(0.752194, abs=1e-5)


def loop_wdce(ce, m, w, num_groups):
    r, n = ce.shape
    total = 0.0
    for i in range(n):
        total += float(w[i]) * sum(float(ce[k, i]) / max(1.0, float(m[k, i])) for k in range(r)) / r
    return total / num_groups


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("r,n,g", [(4, 8, 4), (2, 6, 3), (1, 4, 2)])
def test_wdce_matches_loop(seed, r, n, g):
    gen = torch.Generator().manual_seed(seed)
    ce = 5 * torch.rand(r, n, generator=gen, dtype=torch.float64)
    m = torch.randint(0, 6, (r, n), generator=gen).double()
    rew, lr, _ = inputs(seed, n)
    w_real = (dmpo_weights(rew, lr, g) - dmpo_baseline("group", rewards=rew, log_ref_minus_v=lr, group_size=g)).double()
    assert float(wdce_loss(ce, m, w_real, n // g)) == pytest.approx(loop_wdce(ce, m, w_real, n // g), abs=1e-9)


def test_wdce_hand_computed_and_gradient():
    # R = 2 copies, N = 2 responses, one group. ce sums [[2, 3], [4, 1]], masked counts [[2, 1], [4, 0 -> 1]]
    # per-sample mean over copies: i=0: (2/2 + 4/4)/2 = 1.0; i=1: (3/1 + 1/1)/2 = 2.0
    # w_real = [0.75, -0.25] -> loss = (0.75 * 1 - 0.25 * 2) / 1 = 0.25
    ce = torch.tensor([[2.0, 3.0], [4.0, 1.0]], requires_grad=True)
    loss = wdce_loss(ce, torch.tensor([[2.0, 1.0], [4.0, 0.0]]), torch.tensor([0.75, -0.25]), num_groups=1)
    assert loss.item() == pytest.approx(0.25)
    loss.backward()
    # d loss / d ce[r, i] = w_i / (R * m[r, i]) = [[0.75/4, -0.25/2], [0.75/8, -0.25/2]]
    torch.testing.assert_close(ce.grad, torch.tensor([[0.1875, -0.125], [0.09375, -0.125]]))


def test_wddo_matches_formula_and_hand_value():
    gen = torch.Generator().manual_seed(0)
    dr, df, w = torch.randn(6, generator=gen), torch.randn(6, generator=gen), torch.rand(6, generator=gen)
    ref = -sum(float(w[i]) * math.log(1 / (1 + math.exp(-1.5 * float(dr[i])))) for i in range(6)) / 6
    ref -= 0.5 * sum(math.log(1 / (1 + math.exp(1.5 * float(df[i])))) for i in range(6)) / 6
    assert float(wddo_loss(dr, df, w, beta=1.5, alpha_ddo=0.5)) == pytest.approx(ref, abs=1e-6)
    # Delta = 0 everywhere: logsigmoid(0) = -ln 2 -> loss = mean(w) ln 2 + ln 2; w = [1, 0] -> 1.5 ln 2 = 1.039721
    assert float(wddo_loss(torch.zeros(2), torch.zeros(2), torch.tensor([1.0, 0.0]))) == pytest.approx(1.5 * math.log(2))


def test_antithetic_masks_are_complements():
    gen = torch.Generator().manual_seed(0)
    maskable = torch.ones(5, 12, dtype=torch.bool)
    maskable[:, :3] = False  # e.g. prompt positions inside the window are never masked
    maskable[4, 8:] = False
    masked, rates = antithetic_masks(maskable, 4, gen)
    assert masked.shape == (4, 5, 12) and rates.shape == (4, 5)
    for k in range(2):
        assert torch.equal(masked[k] ^ masked[k + 2], maskable)  # disjoint and together cover every maskable position
        assert not (masked[k] & masked[k + 2]).any()
        torch.testing.assert_close(rates[k] + rates[k + 2], torch.ones(5))
    assert not (masked & ~maskable).any()
    assert (rates[:2] >= 0.1).all() and (rates[:2] <= 1.0).all()
    # reproducible with the generator, rates follow lambda = 0.1 + 0.9 U (mean 0.55)
    again, _ = antithetic_masks(maskable, 4, torch.Generator().manual_seed(0))
    assert torch.equal(masked, again)
    _, many = antithetic_masks(torch.ones(4000, 1, dtype=torch.bool), 2, torch.Generator().manual_seed(1))
    assert float(many[0].mean()) == pytest.approx(0.55, abs=0.02)
    with pytest.raises(ValueError, match="even"):
        antithetic_masks(maskable, 3, gen)


def test_elbo_helper_hand_computed():
    # one response of |o| = 4 tokens, two copies: copy 0 masks 1 token with log p = -1 -> -1 * 4 / 1 = -4
    # copy 1 masks 3 tokens with summed log p = -2.4 -> -2.4 * 4 / 3 = -3.2; mean = -3.6
    out = elbo_from_masked_logp(torch.tensor([[-1.0], [-2.4]]), torch.tensor([[1.0], [3.0]]), torch.tensor([4]))
    torch.testing.assert_close(out, torch.tensor([-3.6]))


def test_no_grad_and_errors():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5], requires_grad=True)
    lr = torch.zeros(4, requires_grad=True)
    assert not dmpo_weights(r, lr, 2).requires_grad
    for kind in DMPO_BASELINES:
        assert not dmpo_baseline(kind, rewards=r, log_ref_minus_v=lr, group_size=2, log_theta_minus_v=lr).requires_grad
    with pytest.raises(UnknownNameError, match=r"\['correct_only', 'group', 'individual', 'model', 'none'\]"):
        dmpo_baseline("mean", rewards=r, log_ref_minus_v=lr, group_size=2)
    with pytest.raises(ValueError, match=r"\(4\).*group_size \(3\)"):
        dmpo_weights(r, lr, 3)
    with pytest.raises(ValueError, match="alpha"):
        dmpo_weights(r, lr, 2, alpha=0.0)
    with pytest.raises(ValueError, match="log_theta_minus_v"):
        dmpo_baseline("model", rewards=r, log_ref_minus_v=lr, group_size=2)


def test_trust_region_gate_by_hand():
    """PPO's clip carried over to WDCE: a weight stops acting once its response moved more than delta per token in
    the weight's direction; it keeps acting while it is inside the region or moved the other way."""
    from mmrl.algorithms import dmpo_trust_region_gate

    w = torch.tensor([0.5, 0.5, 0.5, -0.2, -0.2, -0.2, 0.0])
    lr = torch.tensor([0.05, 0.3, -0.9, -0.05, -0.3, 0.9, 5.0])  # current - behaviour, nats per token
    keep = dmpo_trust_region_gate(w, lr, 0.1)
    assert keep.tolist() == [True, False, True, True, False, True, True]
    assert dmpo_trust_region_gate(w, lr, 1.0).all()  # a wide region clips nothing here


def test_trust_region_gate_bounds_the_unlikelihood_push():
    """Gradient steps on `sum w_real * log p` with the gate re-evaluated after each step: a negatively weighted
    response's log-likelihood stops falling about `delta` below where it started; ungated it keeps falling."""
    from mmrl.algorithms import dmpo_trust_region_gate

    def run(delta):
        logit = torch.zeros(3, requires_grad=True)  # a 3-way categorical "policy"; responses are outcomes 0 and 1
        start = torch.log_softmax(logit.detach(), -1)[:2]
        w = torch.tensor([0.5, -0.5])
        opt = torch.optim.SGD([logit], lr=0.5)
        for _ in range(60):
            lp = torch.log_softmax(logit, -1)[:2]  # [2] one token per response
            keep = dmpo_trust_region_gate(w, lp.detach() - start, delta) if delta else torch.ones(2, dtype=torch.bool)
            loss = -(w * keep * lp).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return torch.log_softmax(logit.detach(), -1)[:2] - start

    gated, free = run(0.2), run(None)
    assert -0.2 - 0.2 < gated[1] <= -0.2  # one SGD step (< 0.2 nats here) past the edge at most, then held
    assert free[1] < -2.0  # without the region the push down does not stop
    assert gated[0] > 0  # the positively weighted response still went up


@pytest.mark.parametrize("bad", [0.0, -0.1])
def test_trust_region_gate_rejects_bad_delta(bad):
    from mmrl.algorithms import dmpo_trust_region_gate

    with pytest.raises(ValueError, match="trust region delta"):
        dmpo_trust_region_gate(torch.ones(2), torch.zeros(2), bad)


def test_trust_region_config_check():
    from mmrl.config import load_config

    with pytest.raises(Exception, match="dmpo_trust_region"):
        load_config(None, {"method": "dmpo", "dmpo_trust_region": 0.0})
    assert load_config(None, {"method": "dmpo", "dmpo_trust_region": 0.1}).dmpo_trust_region == 0.1


def test_correct_only_baseline_puts_weight_on_right_answers_only():
    from mmrl.algorithms.dmpo import dmpo_real_weights

    # G = 4, 1 / 0 rewards: a mixed group, a group with no right answer, a group all right
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    lr = torch.zeros(12)
    w = dmpo_weights(r, lr, 4, alpha=0.04)
    kw = dict(rewards=r, log_ref_minus_v=lr, group_size=4, alpha=0.04)
    real = dmpo_real_weights(w, dmpo_baseline("correct_only", **kw), 1.0)
    assert (real >= 0).all() and (real[r == 0] == 0).all()
    # softmax(25 * r): the two right answers of group 1 split its mass, e^0 / (2 e^25 + 2) ~ 7e-12 on the wrong ones
    torch.testing.assert_close(real, torch.tensor([0.5, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.25, 0.25]))
    # "none" fits the group with no right answer at 1/G each; "group" gives negative weights
    none = dmpo_real_weights(w, dmpo_baseline("none", **kw), 1.0)
    torch.testing.assert_close(none[4:8], torch.full((4,), 0.25))
    assert (dmpo_real_weights(w, dmpo_baseline("group", **kw), 1.0) < 0).any()


def test_correct_token_mask_and_token_masked_sum_by_hand():
    """Issue 24 item 5's control: a blank cell is kept only when its digit is the solution's; the kept sum drops
    the wrong and unmasked terms, and WDCE's normaliser stays the copy's masked count."""
    from mmrl.algorithms.dmpo import correct_token_mask, token_masked_sum, wdce_loss

    resp = torch.tensor([[1, 2, 3, 4], [1, 3, 2, 4]])  # [N=2, T=4]
    sol = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    maskable = torch.tensor([[False, True, True, True], [False, True, True, False]])  # given cell 0; row 1 cell 3 given
    keep = correct_token_mask(resp, sol, maskable)
    assert keep.tolist() == [[False, True, True, True], [False, False, False, False]]
    lp = torch.tensor([[[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, -0.25, 0.0]]])  # [R=1, N=2, T=4], 0 where unmasked
    s = token_masked_sum(lp, keep)  # row 0: -1 - 2 (cells 1, 2 masked and right); row 1: nothing right
    assert s.tolist() == [[-3.0, 0.0]]
    n_masked = torch.tensor([[2.0, 2.0]])
    loss = wdce_loss(-s, n_masked, torch.tensor([0.5, 0.5]), num_groups=1)
    assert float(loss) == pytest.approx(0.5 * 3.0 / 2)  # row 1 (no right cell) contributes 0
    with pytest.raises(ValueError, match="must all be"):
        correct_token_mask(resp, sol[:, :3], maskable)
    with pytest.raises(ValueError, match="keep"):
        token_masked_sum(lp, keep[:, :3])
