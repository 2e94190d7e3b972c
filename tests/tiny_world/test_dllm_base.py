"""The masked-diffusion Countdown base (`countdown3-md`): the SFT loss variants by hand, the causal phase of the
AR-to-diffusion adaptation, and a smoke build through the cache."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.models.masked_diffusion import MaskedDiffusionAdapter
from mmrl.tiny_world import pretrain as pt


def test_time_weights_by_hand():
    t = torch.tensor([[0.25], [0.5], [1.0]])
    assert pt.diffusion_time_weights(t, "inv_t").flatten().tolist() == [4.0, 2.0, 1.0]
    assert pt.diffusion_time_weights(t, "linear").flatten().tolist() == [0.75, 0.5, 0.0]
    assert pt.diffusion_time_weights(t, "none").flatten().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="time_weight 'cosine'"):
        pt.diffusion_time_weights(t, "cosine")


def test_mgdm_token_weights_by_hand():
    ce = torch.tensor([0.0, math.log(2.0), 3.0])  # p(target) = 1, 1/2, e^-3
    out = pt.mgdm_token_weights(ce, 0.25, 2.0)
    want = [0.0, 0.25 * 0.5 ** 2 * math.log(2.0), 0.25 * (1 - math.exp(-3.0)) ** 2 * 3.0]
    assert out.tolist() == pytest.approx(want)
    assert out[2] / ce[2] > out[1] / ce[1]  # hard tokens weigh more
    with pytest.raises(ValueError, match="alpha > 0"):
        pt.mgdm_token_weights(ce, 0.0, 2.0)


def _policy(**kw):
    return MaskedDiffusionAdapter.tiny(seed=0, gen_length=6, hidden_size=32, **kw)


@pytest.mark.parametrize("time_weight,normalise", [("inv_t", "length"), ("none", "masked"), ("linear", "masked")])
def test_masked_sft_loss_matches_an_independent_computation(time_weight, normalise):
    """Same draws (t, then the masks) from a copy of the generator, the loss recomputed from the logits by hand."""
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,3=4"])
    x_r = torch.tensor([[6, 7, 8, 2, 2, 2], [9, 10, 11, 12, 2, 2]])
    fixed = torch.zeros_like(x_r, dtype=torch.bool)
    fixed[1, 0] = True
    g = torch.Generator().manual_seed(3)
    g2 = torch.Generator().manual_seed(3)
    loss = pt.masked_sft_loss(policy, x_p, m_p, x_r, fixed, g, time_weight=time_weight, normalise=normalise)
    t = 1e-3 + (1 - 1e-3) * torch.rand(2, 1, generator=g2)
    masked = (torch.rand(2, 6, generator=g2) < t) & ~fixed
    noisy = torch.where(masked, torch.full_like(x_r, policy.mask_token_id), x_r)
    with torch.no_grad():
        logits = policy.backbone_logits(m_p, 6, policy.model)(torch.cat([x_p, noisy], 1))[:, -6:]
    total, count = 0.0, 0
    for i in range(2):
        w = {"inv_t": 1 / t[i, 0], "none": 1.0, "linear": 1 - t[i, 0]}[time_weight]
        for j in range(6):
            if masked[i, j]:
                total += float(w * -torch.log_softmax(logits[i, j], -1)[x_r[i, j]])
                count += 1
    den = count if normalise == "masked" else 2 * 6 - 1
    assert loss.item() == pytest.approx(total / max(den, 1), rel=1e-5)


def test_causal_phase_trains_next_token_and_restores_bidirectional_attention():
    policy = _policy(shift_logits=True)
    cfg = policy.model.config
    prompts, targets = ["1,2=3", "2,2=4"] * 8, ["1+2", "2+2"] * 8
    hist = pt.causal_phase(policy, prompts, targets, steps=30, batch_size=16, lr=1e-2, seed=0)
    assert hist[-1]["loss"] < 0.5 * hist[0]["loss"]  # it learns the two targets
    assert cfg.is_causal is False  # the diffusion model is bidirectional again
    # with shifted logits the causal phase's alignment carries over: greedy decoding writes the trained targets
    out = policy.sample(["1,2=3"], 1, temperature=0.0, gen_length=6, steps=6, block_length=1)
    assert out.completions[0].startswith("1+2")


def test_causal_phase_needs_shifted_logits():
    with pytest.raises(ValueError, match="shift_logits=True"):
        pt.causal_phase(_policy(), ["1=1"], ["1"], steps=1, batch_size=1, lr=1e-3, seed=0)


def test_bad_recipe_options_fail_before_training():
    policy = _policy()
    with pytest.raises(ValueError, match="normalise 'tokens'"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, normalise="tokens", progress=False)
    with pytest.raises(ValueError, match="token_reweight"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, token_reweight=[0.25], progress=False)


def test_countdown3_md_smoke_build(tmp_path, monkeypatch):
    """`mmrl pretrain-tiny countdown3-md` at 3 + 3 steps: builds into the cache, loads back bidirectional with
    shifted logits, and samples well-formed responses."""
    from mmrl.tiny_world import models

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    path = models.ensure_built("countdown3-md", progress=False, steps=3)
    assert path.is_relative_to(tmp_path)
    policy = models.load_base_policy("countdown3-md", progress=False, steps=3)
    assert policy.shift_logits and policy.model.config.is_causal is False
    out = policy.sample(["3,4,5=27"], 2, temperature=1.0)
    assert out.response_ids.shape == (2, 16) and len(out.completions) == 2


def test_suffix_masks_by_hand():
    fixed = torch.tensor([[False, False, False, False], [True, False, False, False], [False, False, False, False]])
    cut = torch.tensor([[2], [0], [3]])
    want = [[False, False, True, True], [False, True, True, True], [False, False, False, True]]
    assert pt.suffix_masks(fixed, cut).tolist() == want  # the given cell of row 1 stays visible


def test_suffix_frac_one_masks_a_suffix_of_every_row():
    """With `suffix_frac=1` every row's masked set is a suffix: the loss equals the hand computation over the suffix
    the same generator draws (t first, the random masks, then the cut and the pick)."""
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,3=4"])
    x_r = torch.tensor([[6, 7, 8, 2, 2, 2], [9, 10, 11, 12, 2, 2]])
    fixed = torch.zeros_like(x_r, dtype=torch.bool)
    g, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    loss = pt.masked_sft_loss(policy, x_p, m_p, x_r, fixed, g, time_weight="none", normalise="masked", suffix_frac=1.0)
    torch.rand(2, 1, generator=g2)
    torch.rand(2, 6, generator=g2)
    cut = torch.randint(0, 6, (2, 1), generator=g2)
    masked = torch.arange(6)[None] >= cut
    noisy = torch.where(masked, torch.full_like(x_r, policy.mask_token_id), x_r)
    with torch.no_grad():
        logits = policy.backbone_logits(m_p, 6, policy.model)(torch.cat([x_p, noisy], 1))[:, -6:]
    ce = -torch.log_softmax(logits, -1).gather(-1, x_r[..., None]).squeeze(-1)
    assert loss.item() == pytest.approx(float(ce[masked].mean()), rel=1e-5)


def test_suffix_frac_zero_leaves_the_default_draws_unchanged():
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3"])
    x_r = torch.tensor([[6, 7, 8, 2, 2, 2]])
    fixed = torch.zeros_like(x_r, dtype=torch.bool)
    a = pt.masked_sft_loss(policy, x_p, m_p, x_r, fixed, torch.Generator().manual_seed(1))
    b = pt.masked_sft_loss(policy, x_p, m_p, x_r, fixed, torch.Generator().manual_seed(1), suffix_frac=0.0)
    assert a.item() == b.item()


def test_bad_diffusion_phase_options_fail_before_training():
    policy = _policy()
    with pytest.raises(ValueError, match="suffix_frac must lie in"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, suffix_frac=1.5, progress=False)
    with pytest.raises(ValueError, match="diffusion_lr must be > 0"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, diffusion_lr=0.0, progress=False)


def test_diffusion_lr_sets_the_diffusion_steps_learning_rate():
    """`lr` stays the causal phase's; a vanishing `diffusion_lr` leaves the weights where the causal phase put them."""
    policy = _policy(shift_logits=True)
    before = [p.detach().clone() for p in policy.model.parameters()]
    pt.masked_diffusion_sft(policy, ["1,2=3"] * 4, ["1+2"] * 4, gen_length=6, steps=2, batch_size=4, lr=1e-2,
                            diffusion_lr=1e-30, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))
    pt.masked_diffusion_sft(policy, ["1,2=3"] * 4, ["1+2"] * 4, gen_length=6, steps=2, batch_size=4, lr=1e-2, progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.model.parameters()))


def test_anneal_share_by_hand():
    assert [pt.anneal_share(d, 4) for d in (0, 1, 2, 4, 9)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="anneal_steps > 0"):
        pt.anneal_share(0, 0)


def test_annealed_attention_by_hand():
    """3 positions: causal at share 0, full at share 1; at share 0.5 the future keys whose draw is below 0.5."""
    u = torch.tensor([[0.9, 0.4, 0.6], [0.0, 0.7, 0.3], [0.2, 0.8, 0.99]])
    causal = [[True, False, False], [True, True, False], [True, True, True]]
    assert pt.annealed_attention(u, 0.0).tolist() == causal
    assert pt.annealed_attention(u, 1.0).tolist() == [[True] * 3] * 3
    # future entries: (0,1) u=0.4 < 0.5 allowed, (0,2) u=0.6 not, (1,2) u=0.3 allowed; the past always
    assert pt.annealed_attention(u, 0.5).tolist() == [[True, True, False], [True, True, True], [True, True, True]]
    with pytest.raises(ValueError, match="share must lie in"):
        pt.annealed_attention(u, 1.5)


def test_annealed_attention_grows_with_the_share():
    u = torch.rand(2, 7, 7, generator=torch.Generator().manual_seed(0))
    pats = [pt.annealed_attention(u, pt.anneal_share(d, 5)) for d in range(7)]
    for a, b in zip(pats, pats[1:]):
        assert bool((a <= b).all())  # every pattern contains the one before
    assert pats[0].sum() == 2 * 28 and bool(pats[5].all())  # causal (28 = 7 * 8 / 2 per row), then full
    assert pats[0].sum() < pats[2].sum() < pats[4].sum() < pats[5].sum()


def test_attend_causal_and_full_patterns_reproduce_the_causal_and_bidirectional_forwards():
    """Through `backbone_logits(attend=...)` with a left-padded batch: the causal pattern gives the logits of the same
    weights under `config.is_causal = True`, the full pattern those of the default bidirectional forward."""
    policy = _policy(shift_logits=True)
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,34=46"])  # row 0 left padded
    assert not bool(m_p.all())
    x_r = torch.tensor([[6, 7, policy.mask_token_id, 2, 2, 2], [9, policy.mask_token_id, 11, 12, 2, 2]])
    x = torch.cat([x_p, x_r], 1)
    width = x.shape[1]
    causal = pt.annealed_attention(torch.rand(2, width, width), 0.0)
    full = pt.annealed_attention(torch.rand(2, width, width), 1.0)
    with torch.no_grad():
        bidir = policy.backbone_logits(m_p, 6, policy.model)(x)[:, -6:]
        got_full = policy.backbone_logits(m_p, 6, policy.model, attend=full)(x)[:, -6:]
        got_causal = policy.backbone_logits(m_p, 6, policy.model, attend=causal)(x)[:, -6:]
        policy.model.config.is_causal = True
        try:
            want_causal = policy.backbone_logits(m_p, 6, policy.model)(x)[:, -6:]
        finally:
            policy.model.config.is_causal = False
    assert torch.allclose(got_full, bidir, atol=1e-5)
    assert torch.allclose(got_causal, want_causal, atol=1e-5)
    assert not torch.allclose(got_causal, bidir, atol=1e-3)  # the pattern matters


def test_anneal_steps_trains_and_rejects_bad_values():
    policy = _policy(shift_logits=True)
    with pytest.raises(ValueError, match="anneal_steps must be an integer >= 0"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, anneal_steps=-1, progress=False)
    hist = pt.masked_diffusion_sft(policy, ["1,2=3", "12,34=46"] * 4, ["1+2", "12+34"] * 4, gen_length=6, steps=4,
                                   batch_size=4, lr=1e-2, anneal_steps=2, progress=False)
    assert len(hist) == 4 and all(math.isfinite(h["loss"]) for h in hist)


def test_through_first_eos_by_hand():
    x_r = torch.tensor([[6, 7, 2, 2, 9], [2, 5, 5, 5, 5], [6, 7, 8, 9, 10]])
    want = [[True, True, True, False, False], [True, False, False, False, False], [True] * 5]  # no EOS: keep all
    assert pt.through_first_eos(x_r, [2]).tolist() == want
    assert pt.through_first_eos(x_r, [9]).tolist()[2] == [True, True, True, True, False]  # any of the EOS ids


_PAD_ROWS = torch.tensor([[6, 7, 8, 2, 2, 2], [9, 10, 11, 12, 2, 2], [9, 2, 2, 2, 2, 2]])  # EOS = 2, then padding


def _draws(seed, b, t_len, fixed):
    """The t and masks `masked_sft_loss` draws from a generator seeded `seed` (no suffix masks)."""
    g = torch.Generator().manual_seed(seed)
    t = 1e-3 + (1 - 1e-3) * torch.rand(b, 1, generator=g)  # [B, 1]
    return t, (torch.rand(b, t_len, generator=g) < t) & ~fixed  # [B, T]


@pytest.mark.parametrize("time_weight,normalise", [("none", "masked"), ("inv_t", "length")])
def test_pad_loss_false_is_the_mean_over_masked_positions_through_the_first_eos(time_weight, normalise):
    """The loss by hand: only masked positions at or before the row's first EOS count, in the sum and in the
    normaliser (masked: those positions; length: the free positions through the first EOS)."""
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,3=4", "1,1=2"])
    x_r = _PAD_ROWS
    fixed = torch.zeros_like(x_r, dtype=torch.bool)
    fixed[1, 0] = True
    seed = 11
    loss = pt.masked_sft_loss(policy, x_p, m_p, x_r, fixed, torch.Generator().manual_seed(seed), time_weight=time_weight,
                              normalise=normalise, pad_loss=False)
    t, masked = _draws(seed, 3, 6, fixed)
    assert masked[:, 4:].any()  # the draw masks some post-EOS padding, so leaving it out matters
    noisy = torch.where(masked, torch.full_like(x_r, policy.mask_token_id), x_r)
    with torch.no_grad():
        logits = policy.backbone_logits(m_p, 6, policy.model)(torch.cat([x_p, noisy], 1))[:, -6:]
    first_eos = [3, 4, 1]
    total, count = 0.0, 0
    for i in range(3):
        w = {"inv_t": 1 / t[i, 0], "none": 1.0}[time_weight]
        for j in range(first_eos[i] + 1):
            if masked[i, j]:
                total += float(w * -torch.log_softmax(logits[i, j], -1)[x_r[i, j]])
                count += 1
    den = count if normalise == "masked" else sum(first_eos) + 3 - 1  # free positions through the EOS (one fixed)
    assert loss.item() == pytest.approx(total / den, rel=1e-5)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), tokens=st.lists(st.integers(5, 90), min_size=18, max_size=18))
def test_pad_loss_false_ignores_what_is_written_after_the_first_eos(seed, tokens):
    """Property: rewriting the masked positions after each row's first EOS (the input is the same: they are mask
    tokens) leaves the `pad_loss=False` loss exactly unchanged, whatever is written there."""
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,3=4", "1,1=2"])
    fixed = torch.zeros_like(_PAD_ROWS, dtype=torch.bool)
    _, masked = _draws(seed, 3, 6, fixed)
    after = ~pt.through_first_eos(_PAD_ROWS, [2])  # [B, T]
    other = torch.where(masked & after, torch.tensor(tokens).view(3, 6), _PAD_ROWS)
    kw = dict(time_weight="none", normalise="masked", pad_loss=False)
    a = pt.masked_sft_loss(policy, x_p, m_p, _PAD_ROWS, fixed, torch.Generator().manual_seed(seed), **kw)
    b = pt.masked_sft_loss(policy, x_p, m_p, other, fixed, torch.Generator().manual_seed(seed), **kw)
    assert a.item() == b.item()


def test_pad_loss_true_is_the_old_loss_bit_for_bit_and_false_differs():
    """`pad_loss=True` (the default) is the loss before the option existed: the sum over every masked position
    divided by the masked count, recomputed here with the old code's operations, compared exactly."""
    policy = _policy()
    x_p, m_p = policy.encode_prompts(["1,2=3", "12,3=4", "1,1=2"])
    fixed = torch.zeros_like(_PAD_ROWS, dtype=torch.bool)
    seed = 11
    kw = dict(time_weight="none", normalise="masked")
    default = pt.masked_sft_loss(policy, x_p, m_p, _PAD_ROWS, fixed, torch.Generator().manual_seed(seed), **kw)
    true = pt.masked_sft_loss(policy, x_p, m_p, _PAD_ROWS, fixed, torch.Generator().manual_seed(seed), pad_loss=True, **kw)
    false = pt.masked_sft_loss(policy, x_p, m_p, _PAD_ROWS, fixed, torch.Generator().manual_seed(seed), pad_loss=False, **kw)
    t, masked = _draws(seed, 3, 6, fixed)
    noisy = torch.where(masked, torch.full_like(_PAD_ROWS, policy.mask_token_id), _PAD_ROWS)
    with torch.no_grad():
        logits = policy.backbone_logits(m_p, 6, policy.model)(torch.cat([x_p, noisy], 1))[:, -6:]  # [B, T, V]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), _PAD_ROWS.reshape(-1), reduction="none").view(3, 6)
    old = (ce * masked * pt.diffusion_time_weights(t, "none")).sum() / masked.sum().clamp(min=1)
    assert default.item() == true.item() == old.item()
    assert false.item() != true.item()  # the draw masks post-EOS padding (see the hand test), so the option matters


def test_pad_loss_is_a_loss_option_and_rejects_non_bools():
    assert "pad_loss" in pt.LOSS_OPTIONS
    assert pt.loss_options({"ar_init_steps": 600, "normalise": "masked", "pad_loss": False}) == {"normalise": "masked", "pad_loss": False}
    policy = _policy(shift_logits=True)
    x_p, m_p = policy.encode_prompts(["1,2=3"])
    fixed = torch.zeros_like(_PAD_ROWS[:1], dtype=torch.bool)
    with pytest.raises(ValueError, match="pad_loss must be True or False"):
        pt.masked_sft_loss(policy, x_p, m_p, _PAD_ROWS[:1], fixed, torch.Generator().manual_seed(0), pad_loss="False")
    with pytest.raises(ValueError, match="pad_loss must be True or False"):
        pt.masked_diffusion_sft(policy, ["1=1"], ["1"], gen_length=6, steps=1, pad_loss=0, progress=False)
    hist = pt.masked_diffusion_sft(policy, ["1,2=3", "12,34=46"] * 4, ["1+2", "12+34"] * 4, gen_length=6, steps=4,
                                   batch_size=4, lr=1e-2, pad_loss=False, progress=False)
    assert len(hist) == 4 and all(math.isfinite(h["loss"]) for h in hist)
