"""DGPO: hellinger_entropy and dgpo_token_weights against loops over the vocabulary (docs/algorithms.md section 4)."""
import math

import pytest
import torch

from mmrl.algorithms import aggregate, dgpo_token_weights, hellinger_entropy, policy_loss, token_distribution_stats


def loop_stats(p_logits, q_logits):
    n, t, v = p_logits.shape
    h2 = torch.zeros(n, t, dtype=torch.float64)
    ent = torch.zeros(n, t, dtype=torch.float64)
    kl = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        for j in range(t):
            zp = [math.exp(float(x)) for x in p_logits[i, j].double()]
            zq = [math.exp(float(x)) for x in q_logits[i, j].double()]
            p = [x / sum(zp) for x in zp]
            q = [x / sum(zq) for x in zq]
            h2[i, j] = 1 - sum(math.sqrt(a * b) for a, b in zip(p, q))
            ent[i, j] = -sum(a * math.log(a) for a in p if a > 0)
            kl[i, j] = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0)
    return h2, ent, kl


def loop_dgpo(h2, ent, mask, v, tau, kappa):
    n, t = h2.shape
    out = torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        valid = [j for j in range(t) if mask[i, j]]
        s = {j: float(h2[i, j]) * min(max(float(ent[i, j]) / math.log(v), 0), 1) ** kappa for j in valid}
        z = sum(math.exp(s[j] / tau) for j in valid)
        for j in valid:
            out[i, j] = len(valid) * math.exp(s[j] / tau) / z
    return out


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("n,t,v", [(2, 3, 5), (3, 4, 17), (1, 6, 40)])
@pytest.mark.parametrize("chunk_size", [None, 1, 5])
def test_stats_match_loop(seed, n, t, v, chunk_size):
    g = torch.Generator().manual_seed(seed)
    p = 2 * torch.randn(n, t, v, generator=g)
    q = p + torch.randn(n, t, v, generator=g)
    h2, ent = hellinger_entropy(p, q, chunk_size=chunk_size)
    rh2, rent, rkl = loop_stats(p, q)
    torch.testing.assert_close(h2.double(), rh2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ent.double(), rent, atol=1e-5, rtol=1e-4)
    kl = token_distribution_stats(p, q, stats=("kl",), chunk_size=chunk_size)["kl"]
    torch.testing.assert_close(kl.double(), rkl, atol=1e-5, rtol=1e-4)


def test_chunked_equals_unchunked_bf16():
    g = torch.Generator().manual_seed(0)
    p = (3 * torch.randn(4, 33, 301, generator=g)).bfloat16()
    q = (p.float() + torch.randn(4, 33, 301, generator=g)).bfloat16()
    full = hellinger_entropy(p, q, chunk_size=4 * 33)  # one chunk
    for cs in (1, 7, 64):
        for a, b in zip(hellinger_entropy(p, q, chunk_size=cs), full):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # and the unchunked textbook formula in float32
    lp, lq = torch.log_softmax(p.float(), -1), torch.log_softmax(q.float(), -1)
    torch.testing.assert_close(full[0], 1 - torch.exp(torch.logsumexp(0.5 * (lp + lq), -1)), atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(full[1], -(lp.exp() * lp).sum(-1), atol=1e-5, rtol=1e-5)


def test_h2_bounds_and_equality():
    g = torch.Generator().manual_seed(1)
    p = 10 * torch.randn(3, 5, 50, generator=g)
    q = -10 * torch.randn(3, 5, 50, generator=g)
    h2, ent = hellinger_entropy(p, q)
    assert (h2 >= 0).all() and (h2 <= 1).all() and (ent >= 0).all()
    h2_same, _ = hellinger_entropy(p, p.clone())
    assert (h2_same == 0).all()
    # disjoint supports -> h2 = 1
    a = torch.tensor([[[0.0, -1e4]]])
    b = torch.tensor([[[-1e4, 0.0]]])
    assert float(hellinger_entropy(a, b)[0]) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tau,kappa", [(0.5, 1.0), (1.0, 2.0), (0.1, 0.5)])
def test_weights_match_loop(seed, tau, kappa):
    g = torch.Generator().manual_seed(seed)
    n, t, v = 4, 9, 100
    h2 = torch.rand(n, t, generator=g)
    ent = torch.rand(n, t, generator=g) * math.log(v)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    w = dgpo_token_weights(h2, ent, mask, vocab_size=v, tau=tau, kappa=kappa)
    torch.testing.assert_close(w.double(), loop_dgpo(h2, ent, mask, v, tau, kappa), atol=1e-5, rtol=1e-5)
    assert (w[~mask] == 0).all()


def test_hand_computed_weights():
    # V = e^2 (ln V = 2 -> use vocab_size 7.389..., not an int): use V = 100, ln V = 4.605170
    # h2 = [0.5, 0, 0.25], entropy = [4.605170, 2.302585, 0] -> H~ = [1, 0.5, 0]; s = [0.5, 0, 0]
    # tau 0.5: exp(s / tau) = [e, 1, 1] = [2.718282, 1, 1]; sum = 4.718282; w = 3 * [.576117, .211942, .211942]
    w = dgpo_token_weights(torch.tensor([[0.5, 0.0, 0.25]]), torch.tensor([[4.605170, 2.302585, 0.0]]), torch.ones(1, 3, dtype=torch.bool), vocab_size=100)
    torch.testing.assert_close(w, torch.tensor([[1.728350, 0.635825, 0.635825]]), atol=1e-5, rtol=0)


def test_policy_equals_reference_gives_exactly_base_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 31, generator=g)
    h2, ent = hellinger_entropy(logits, logits.clone())
    lengths = torch.tensor([7, 1, 3, 0, 5])
    mask = torch.arange(7)[None] < lengths[:, None]
    w = dgpo_token_weights(h2, ent, mask, vocab_size=31)
    assert (w[mask] == 1.0).all() and (w[~mask] == 0).all()
    logp = -torch.rand(5, 7, generator=g)
    old = logp + 0.1 * torch.randn(5, 7, generator=g)
    adv = torch.randn(5, generator=g)
    base = aggregate(policy_loss(logp, old, adv, mask, eps_high=0.28)[0], mask, "token_mean")
    dgpo = aggregate(policy_loss(logp, old, adv[:, None] * w, mask, eps_high=0.28)[0], mask, "token_mean")
    assert torch.equal(base, dgpo)


def test_no_grad_and_errors():
    p = torch.randn(2, 3, 8, requires_grad=True)
    h2, ent = hellinger_entropy(p, p.detach() + 1)
    assert not h2.requires_grad and not ent.requires_grad
    w = dgpo_token_weights(h2, ent, torch.ones(2, 3, dtype=torch.bool), vocab_size=8)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="tau"):
        dgpo_token_weights(h2, ent, torch.ones(2, 3, dtype=torch.bool), vocab_size=8, tau=0)
    with pytest.raises(ValueError, match="differ in shape"):
        hellinger_entropy(p, torch.zeros(2, 3, 9))
    with pytest.raises(ValueError, match="unknown statistics"):
        token_distribution_stats(p, p, stats=("js",))
