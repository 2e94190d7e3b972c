"""GCPO token weights: loop reference, hand-computed values and the properties of docs/algorithms.md section 3."""
import math

import pytest
import torch

from mmrl.algorithms import TOKEN_WEIGHTS, UnknownNameError, gcpo_token_weights, gcpo_weights_from_scores, rank_power_alpha

ALPHA = math.log(1 - 0.8) / math.log(1 - 0.4) - 1


def loop_divergence(lp, ln, kind):
    if kind == "k3":
        r = min(max(ln - lp, -20.0), 20.0)
        return min(max(math.exp(r) - r - 1, 0.0), 10.0)
    if kind == "abs":
        return abs(lp - ln)
    return lp - ln


def loop_weights(scores, mask, normalization, alpha=ALPHA):
    n_rows, t = scores.shape
    out = torch.zeros(n_rows, t, dtype=torch.float64)
    for i in range(n_rows):
        valid = [j for j in range(t) if mask[i, j]]
        n = len(valid)
        for j in valid:
            less = sum(1 for k in valid if scores[i, k] < scores[i, j])
            equal = sum(1 for k in valid if scores[i, k] == scores[i, j])
            rank = less + (equal + 1) / 2  # average of ranks less+1 .. less+equal
            out[i, j] = rank / n if normalization == "cdf" else (rank / n) ** alpha
        if normalization == "rank_power" and n:
            total = sum(float(out[i, j]) for j in valid)
            for j in valid:
                out[i, j] = out[i, j] * n / total
    return out


def inputs(seed, n, t, ties=False):
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(n, t, generator=g)
    ln = lp + torch.randn(n, t, generator=g)
    if ties:
        ln[:, ::3] = lp[:, ::3]  # divergence exactly 0 at every third token
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None] < lengths[:, None]
    return lp, ln, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n,t", [(3, 7), (6, 20), (2, 1)])
@pytest.mark.parametrize("divergence", ["k3", "abs", "info_gain"])
@pytest.mark.parametrize("normalization", ["rank_power", "cdf"])
def test_matches_loop_reference(seed, n, t, divergence, normalization):
    lp, ln, mask = inputs(seed, n, t, ties=seed == 2)
    got = gcpo_token_weights(lp, ln, mask, divergence=divergence, normalization=normalization)
    d = torch.tensor([[loop_divergence(float(lp[i, j]), float(ln[i, j]), divergence) for j in range(t)] for i in range(n)])
    want = loop_weights(d.float(), mask, normalization)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_hand_computed_rank_power():
    # scores [0.3, 0.1, 0.2] -> ranks [3, 1, 2] -> p = [1, 1/3, 2/3]; alpha = ln 0.2 / ln 0.6 - 1 = 2.150660
    # p^alpha = [1, exp(-2.150660 * 1.098612) = 0.094162, exp(-2.150660 * 0.405465) = 0.418107]; sum = 1.512269
    # w = 3 * p^alpha / sum = [1.983774, 0.186796, 0.829430]
    w = gcpo_weights_from_scores(torch.tensor([[0.3, 0.1, 0.2, 5.0]]), torch.tensor([[1, 1, 1, 0]], dtype=torch.bool))
    torch.testing.assert_close(w, torch.tensor([[1.983774, 0.186796, 0.829430, 0.0]]), atol=1e-5, rtol=0)
    assert rank_power_alpha() == pytest.approx(2.150660, abs=1e-6)


def test_hand_computed_k3():
    # logp_pos = -1, logp_neg = -2: r = -1, d = e^-1 + 1 - 1 = 0.367879
    # logp_pos = -1, logp_neg = -1: d = 0;  logp_pos = -2, logp_neg = 0: r = 2, d = e^2 - 3 = 4.389056
    # ranks by d: [2, 1, 3] -> cdf [2/3, 1/3, 1]
    w = gcpo_token_weights(torch.tensor([[-1.0, -1.0, -2.0]]), torch.tensor([[-2.0, -1.0, 0.0]]), torch.ones(1, 3, dtype=torch.bool), normalization="cdf")
    torch.testing.assert_close(w, torch.tensor([[2 / 3, 1 / 3, 1.0]]))
    # clamp: r = 30 -> clamped to 20 -> d = e^20 - 21 -> clamped to 10; r = -30 -> -20 -> e^-20 + 19 -> 10
    from mmrl.algorithms.gcpo import _k3

    assert _k3(torch.tensor([0.0, 0.0]), torch.tensor([30.0, -30.0])).tolist() == [10.0, 10.0]


def test_properties_rank_power():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 50, generator=g)
    mask = torch.ones(4, 50, dtype=torch.bool)
    mask[1, 30:] = False
    mask[2, 1:] = False
    mask[3] = False
    w = gcpo_weights_from_scores(scores, mask)
    # mean 1 over valid tokens (rows with >= 1 valid token); padding 0; one valid token -> 1; empty row -> 0
    for i in range(3):
        assert float(w[i][mask[i]].mean()) == pytest.approx(1.0, abs=1e-5)
    assert (w[~mask] == 0).all() and float(w[2, 0]) == 1.0 and (w[3] == 0).all()
    # monotone in the score
    for i in range(2):
        s, ww = scores[i][mask[i]], w[i][mask[i]]
        order = torch.argsort(s)
        assert (ww[order][1:] >= ww[order][:-1]).all()
    # invariant under strictly increasing transforms
    for f in (lambda x: 3 * x + 7, torch.exp, lambda x: x**3, torch.sigmoid):
        torch.testing.assert_close(gcpo_weights_from_scores(f(scores), mask), w)
    # ties get equal weight
    tied = torch.tensor([[0.5, 0.1, 0.5, 0.9, 0.5, 0.1]])
    wt = gcpo_weights_from_scores(tied, torch.ones_like(tied, dtype=torch.bool))
    assert wt[0, 0] == wt[0, 2] == wt[0, 4] and wt[0, 1] == wt[0, 5]


def test_top_40_percent_carry_80_percent():
    scores = torch.randperm(1000, generator=torch.Generator().manual_seed(3)).float()[None]
    w = gcpo_weights_from_scores(scores, torch.ones_like(scores, dtype=torch.bool))[0]
    top = w[scores[0] >= 600].sum() / w.sum()
    assert abs(float(top) - 0.80) <= 0.01
    assert float(w.max()) == pytest.approx(ALPHA + 1, rel=0.01)  # about 3.15 (reference notes)


def test_no_grad_and_errors():
    lp = torch.randn(2, 4, requires_grad=True)
    w = gcpo_token_weights(lp, lp * 2, torch.ones(2, 4, dtype=torch.bool))
    assert not w.requires_grad and w.dtype == torch.float32
    with pytest.raises(UnknownNameError, match=r"valid names: \['abs', 'info_gain', 'k3'\]"):
        gcpo_token_weights(lp, lp, torch.ones(2, 4, dtype=torch.bool), divergence="js")
    with pytest.raises(UnknownNameError, match="valid names"):
        gcpo_weights_from_scores(lp, torch.ones(2, 4, dtype=torch.bool), normalization="minmax")
    with pytest.raises(ValueError, match="full_kl"):
        gcpo_token_weights(lp, lp, torch.ones(2, 4, dtype=torch.bool), divergence="full_kl")
    with pytest.raises(ValueError, match="top_fraction"):
        gcpo_weights_from_scores(lp, torch.ones(2, 4, dtype=torch.bool), top_fraction=1.5)
    assert "rank_power" in TOKEN_WEIGHTS and "softmax" in TOKEN_WEIGHTS
