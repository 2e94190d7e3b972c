"""The masked-diffusion samplers draw x0 and score it only at the masked positions (issue 29), yet give bitwise the
samples of the all-positions computation: each sampler against a reference written here the straightforward way
(Gumbel-max draw, confidence and log-prob over every position of the window, then masked by `torch.where`), with the
same generators (one `torch.Generator`, per-row `RowStreams`), temperatures, noise dtypes and given positions."""
from __future__ import annotations

import pytest
import torch

from mmrl.models import dllm_samplers as ds
from mmrl.models.base import selective_log_softmax

MASK, V, P = 0, 173, 2  # V: not a multiple of the vector width, so the kernels' tails are exercised


def _model(seed: int = 0):
    """A bidirectional toy: logits of position i = emb[x_i] @ W + mean_j emb[x_j] @ U + pos_i (depends on the masks)."""
    g = torch.Generator().manual_seed(seed)
    emb, w, u = torch.randn(V, 16, generator=g), torch.randn(16, V, generator=g), torch.randn(16, V, generator=g)
    pos = torch.randn(64, V, generator=g)

    def fn(x):
        e = emb[x]  # [B, L, 16]
        return 3.0 * (e @ w + e.mean(1, keepdim=True) @ u + pos[: x.shape[1]])  # [B, L, V]
    return fn


def _gen(kind: str, rows: int, seed: int):
    return ds.RowStreams(torch.arange(rows) + 100 * seed) if kind == "rows" else torch.Generator().manual_seed(seed)


def _setup(seed: int, rows: int = 3, gen_length: int = 8, given: bool = False):
    g = torch.Generator().manual_seed(1000 + seed)
    prompt = torch.randint(1, V, (rows, P), generator=g)
    init = None
    if given:  # infilling: some span positions given, never resampled
        init = torch.where(torch.rand(rows, gen_length, generator=g) < 0.3,
                           torch.randint(1, V, (rows, gen_length), generator=g), torch.full((rows, gen_length), MASK))
    return prompt, init


# ------------------------------------------------------------------------------ references: every position
def ref_gumbel(logits, temperature, generator, rows=None, noise_dtype="float64"):
    if temperature == 0:
        return logits.argmax(-1)
    if noise_dtype != "float64":
        dt = ds.GUMBEL_DTYPES[noise_dtype]
        u = ds._uniform(logits.shape, generator, logits.device, dt, rows)
        return (logits.to(dt).exp() / (-torch.log(u)) ** temperature).argmax(-1)
    u = ds._uniform(logits.shape, generator, logits.device, torch.float64, rows).clamp_(min=1e-300)
    return (logits.double() / temperature - torch.log(-torch.log(u))).argmax(-1)


def ref_conf(logits, x0):
    return torch.softmax(logits.float(), dim=-1).gather(-1, x0[..., None]).squeeze(-1)


def ref_low_confidence(fn, prompt, *, gen_length, block_length, steps, temperature, remasking, generator, init,
                       gumbel_dtype):
    nb, spb = ds.block_schedule(gen_length, block_length, steps)
    x = ds._init_canvas(prompt, gen_length, MASK, init)
    for b in range(nb):
        s, e = P + b * block_length, P + (b + 1) * block_length
        k = ds.num_transfer_tokens((x[:, s:e] == MASK).sum(-1), spb)
        for i in range(spb):
            masked = x[:, s:e] == MASK
            logits = ds.suppress_tokens(fn(x)[:, s:e], (MASK,))
            x0 = ref_gumbel(logits, temperature, generator, noise_dtype=gumbel_dtype)
            conf = ref_conf(logits, x0) if remasking == "low_confidence" else ds._uniform(masked.shape, generator, x.device)
            conf = torch.where(masked, conf, torch.full_like(conf, -torch.inf))
            x[:, s:e] = torch.where(ds.top_k_mask(conf, k[:, i]), x0, x[:, s:e])
    return x


def ref_threshold(fn, prompt, *, gen_length, block_length, threshold, temperature, generator, init):
    x = ds._init_canvas(prompt, gen_length, MASK, init)
    for b in range(gen_length // block_length):
        s, e = P + b * block_length, P + (b + 1) * block_length
        while True:
            masked = x[:, s:e] == MASK
            active = masked.any(-1)
            if not bool(active.any()):
                break
            logits = ds.suppress_tokens(fn(x)[:, s:e], (MASK,))
            x0 = ref_gumbel(logits, temperature, generator, rows=active)
            conf = torch.where(masked, ref_conf(logits, x0), torch.tensor(-torch.inf))
            pick = ds.top_k_mask(conf, active.long()) | (masked & (conf >= threshold))
            x[:, s:e] = torch.where(pick, x0, x[:, s:e])
    return x


def ref_dream_conf(logits, alg, temperature, top_p, generator):
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    scaled = ds.top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)
    if temperature > 0:
        x0 = ref_gumbel(scaled, 1.0, generator)
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    else:
        conf, x0 = probs.max(-1)
    if alg == "topk_margin":
        top2 = probs.topk(2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif alg == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    return conf, x0


def ref_dream(fn, prompt, *, gen_length, steps, alg, block_length, temperature, top_p, generator, init, eps=1e-3):
    nb, spb = ds.block_schedule(gen_length, block_length, steps)
    x = ds._init_canvas(prompt, gen_length, MASK, init)
    ts = torch.linspace(1, eps, spb + 1)
    for b in range(nb):
        s, e = P + b * block_length, P + (b + 1) * block_length
        for i in range(spb):
            masked = x[:, s:e] == MASK
            conf, x0 = ref_dream_conf(ds.suppress_tokens(fn(x)[:, s:e], (MASK,)), alg, temperature, top_p, generator)
            n = masked.sum(-1)
            k = (n.float() * (1 - ts[i + 1] / ts[i])).long() if i < spb - 1 else n
            conf = torch.where(masked, conf, torch.full_like(conf, -torch.inf))
            x[:, s:e] = torch.where(ds.top_k_mask(conf, k), x0, x[:, s:e])
    return x


def ref_random_order(fn, prompt, *, gen_length, block_length, steps, temperature, generator, init):
    nb, spb = ds.block_schedule(gen_length, block_length, steps)
    x = ds._init_canvas(prompt, gen_length, MASK, init)
    bsz = prompt.shape[0]
    logp = torch.zeros(bsz, gen_length)
    order = torch.zeros(bsz, gen_length, dtype=torch.long)
    bounds = ds.num_transfer_tokens(torch.tensor([block_length]), spb)[0].cumsum(0)
    for b in range(nb):
        s, e = P + b * block_length, P + (b + 1) * block_length
        step_of = torch.searchsorted(bounds, ds._uniform((bsz, block_length), generator, x.device).argsort(-1).argsort(-1),
                                     right=True)
        free = x[:, s:e] == MASK
        order[:, s - P:e - P] = torch.where(free, step_of + b * spb, torch.full_like(step_of, -1))
        for i in range(spb):
            reveal = (step_of == i) & free
            if not bool(reveal.any()):
                continue
            logits = ds.suppress_tokens(fn(x)[:, s:e], (MASK,))
            x0 = ref_gumbel(logits, temperature, generator)
            lp = selective_log_softmax(logits, x0, temperature=temperature if temperature > 0 else 1.0)
            x[:, s:e] = torch.where(reveal, x0, x[:, s:e])
            logp[:, s - P:e - P] = torch.where(reveal, lp, logp[:, s - P:e - P])
    return x, logp, order


def ref_easy_first(fn, prompt, *, gen_length, steps, temperature, generator, init):
    x = ds._init_canvas(prompt, gen_length, MASK, init)
    given = x[:, P:] != MASK
    keep_n = ds.num_transfer_tokens((~given).sum(-1), steps).cumsum(-1)
    score = torch.full(given.shape, -torch.inf)
    for i in range(steps):
        span = x[:, P:]
        masked = span == MASK
        logits = ds.suppress_tokens(fn(x)[:, P:], (MASK,))
        x0 = ref_gumbel(logits, temperature, generator)
        conf = ref_conf(logits, x0)
        cand = torch.where(masked, x0, span)
        cand_score = torch.where(masked, conf, score)
        cand_score = torch.where(given, torch.full_like(cand_score, -torch.inf), cand_score)
        keep = ds.top_k_mask(cand_score, keep_n[:, i]) | given
        x[:, P:] = torch.where(keep, cand, torch.full_like(cand, MASK))
        score = torch.where(keep & ~given, cand_score, torch.full_like(score, -torch.inf))
    return x


# ------------------------------------------------------------------------------ new == reference, bitwise
CASES = [(kind, seed, given) for kind in ("gen", "rows") for seed, given in ((0, False), (1, True))]


@pytest.mark.parametrize("kind,seed,given", CASES)
def test_low_confidence_equals_all_positions_reference(kind, seed, given):
    fn, (prompt, init) = _model(seed), _setup(seed, given=given)
    for temperature, remasking, dtype in ((1.0, "low_confidence", "float64"), (0.7, "low_confidence", "bfloat16"),
                                          (1.0, "low_confidence", "float32"), (1.0, "random", "float64"),
                                          (0.0, "low_confidence", "float64")):
        kw = dict(gen_length=8, block_length=4, steps=4, temperature=temperature, remasking=remasking, init=init,
                  gumbel_dtype=dtype)
        new = ds.generate_low_confidence(fn, prompt, mask_id=MASK, generator=_gen(kind, 3, seed), **kw)
        ref = ref_low_confidence(fn, prompt, generator=_gen(kind, 3, seed), **kw)
        assert torch.equal(new, ref), (temperature, remasking, dtype)
    # the draw itself: only `where` computed, the generator left where the full draw leaves it
    logits = fn(ds._init_canvas(prompt, 8, MASK))[:, P:]
    where = torch.rand(3, 8, generator=torch.Generator().manual_seed(seed)) < 0.5
    ga, gb = _gen(kind, 3, seed), _gen(kind, 3, seed)
    got = ds.gumbel_argmax(logits, 1.0, ga, where=where)
    assert torch.equal(got[where], ref_gumbel(logits, 1.0, gb)[where]) and (got[~where] == 0).all()
    assert torch.equal(ds._uniform((3, 5), ga, "cpu"), ds._uniform((3, 5), gb, "cpu"))  # same stream position


@pytest.mark.parametrize("kind,seed,given", CASES)
def test_threshold_equals_all_positions_reference(kind, seed, given):
    fn, (prompt, init) = _model(seed), _setup(seed, given=given)
    for temperature, threshold in ((1.0, 0.3), (0.0, 0.5)):
        kw = dict(gen_length=8, block_length=4, threshold=threshold, temperature=temperature, init=init)
        new = ds.generate_threshold(fn, prompt, mask_id=MASK, generator=_gen(kind, 3, seed), **kw)
        assert torch.equal(new, ref_threshold(fn, prompt, generator=_gen(kind, 3, seed), **kw)), (temperature, threshold)


@pytest.mark.parametrize("kind,seed,given", CASES)
def test_dream_equals_all_positions_reference(kind, seed, given):
    fn, (prompt, init) = _model(seed), _setup(seed, given=given)
    for alg in ds.DREAM_ORDERS:
        for temperature, top_p in ((1.0, 0.9), (0.5, None), (0.0, None)):
            kw = dict(gen_length=8, steps=4, alg=alg, block_length=4, temperature=temperature, top_p=top_p, init=init)
            new = ds.generate_dream(fn, prompt, mask_id=MASK, generator=_gen(kind, 3, seed), **kw)
            assert torch.equal(new, ref_dream(fn, prompt, generator=_gen(kind, 3, seed), **kw)), (alg, temperature)


@pytest.mark.parametrize("kind,seed,given", CASES)
def test_random_order_equals_all_positions_reference(kind, seed, given):
    fn, (prompt, init) = _model(seed), _setup(seed, given=given)
    for temperature, steps in ((1.0, 8), (0.8, 4), (0.0, 8)):
        kw = dict(gen_length=8, block_length=4, steps=steps, temperature=temperature, init=init)
        ids, logp, order = ds.generate_random_order(fn, prompt, mask_id=MASK, generator=_gen(kind, 3, seed), **kw)
        rids, rlogp, rorder = ref_random_order(fn, prompt, generator=_gen(kind, 3, seed), **kw)
        assert torch.equal(ids, rids) and torch.equal(order, rorder), (temperature, steps)
        assert torch.equal(logp, rlogp), (temperature, steps)  # rows of < 32k elements: serial sums, the same bits


@pytest.mark.parametrize("kind,seed,given", CASES)
def test_easy_first_equals_all_positions_reference(kind, seed, given):
    fn, (prompt, init) = _model(seed), _setup(seed, given=given)
    for temperature, steps in ((1.0, 8), (0.6, 3), (0.0, 4)):
        kw = dict(gen_length=8, steps=steps, temperature=temperature, init=init)
        new = ds.generate_easy_first(fn, prompt, mask_id=MASK, generator=_gen(kind, 3, seed), **kw)
        assert torch.equal(new, ref_easy_first(fn, prompt, generator=_gen(kind, 3, seed), **kw)), (temperature, steps)


def test_where_must_match_the_logits_positions():
    with pytest.raises(ValueError, match="where must have the logits' leading shape"):
        ds.gumbel_argmax(torch.zeros(2, 3, 5), 1.0, where=torch.ones(2, 4, dtype=torch.bool))


def test_row_streams_rand_at_is_the_full_draw_at_those_positions():
    where = torch.tensor([[True, False, True, True], [False, False, False, False], [False, True, False, False]])
    rows = torch.tensor([True, True, False])  # row 2 does not draw (0.5), row 1 draws but keeps nothing
    for dtype in (torch.float64, torch.bfloat16):
        a, b = ds.RowStreams([5, 6, 7]), ds.RowStreams([5, 6, 7])
        got = a.rand_at((3, 4, 9), where, dtype, rows)
        assert got.shape == (4, 9) and torch.equal(got, b.rand((3, 4, 9), dtype, rows)[where])
        assert bool((got[3] == 0.5).all())
        assert torch.equal(a.rand((3, 2), dtype), b.rand((3, 2), dtype))  # the streams advanced alike
