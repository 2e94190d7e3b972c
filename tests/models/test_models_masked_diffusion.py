"""Masked-diffusion adapter: samplers against independent reference implementations written here, estimators
against hand-built computations, masking properties, loading errors. Tiny random bidirectional Llama / Qwen2."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from mmrl.algorithms import elbo_from_masked_logp, token_distribution_stats
from mmrl.models import adapter_class
from mmrl.models.dllm_backbone import BackboneLogits
from mmrl.models.dllm_estimators import elbo_masks, fold_padding, row_seeds
from mmrl.models.dllm_samplers import (
    generate_dream,
    generate_low_confidence,
    generate_random_order,
    generate_threshold,
    num_transfer_tokens,
)
from mmrl.models.masked_diffusion import MaskedDiffusionAdapter as MDA
from mmrl.core.protocol import DEFAULT_NEGATIVE_INSTRUCTION


def _import_source(tmp_path, name: str, code: str):
    """Import `code` as module `name` from a file under tmp_path, as transformers imports a checkpoint's remote code."""
    import importlib.util
    import sys

    src = tmp_path / f"{name}.py"
    src.write_text(code)
    spec = importlib.util.spec_from_file_location(name, src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

MASK = 4  # <mask> of models/tokenizers.py::char_tokenizer
PROMPTS = ["ab", "hello world", "4x4 sudoku?"]


@pytest.fixture(scope="module")
def sharp():
    """A tiny model with a large init range: peaked, varied confidences (clear argmax margins)."""
    return MDA.tiny(seed=3, initializer_range=0.5, gen_length=8, temperature=0.0)


@pytest.fixture(scope="module")
def sharp_dream():
    return MDA.tiny(seed=4, initializer_range=0.5, gen_length=8, shift_logits=True, temperature=0.0)


def plain_logits_fn(model, shift=False):
    """The whole-sequence logits a reference implementation would use (mask token suppressed, see samplers)."""

    def fn(x):
        with torch.no_grad():
            logits = model(x).logits.float()
        if shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        logits[..., MASK] = -torch.inf
        return logits

    return fn


# ------------------------------------------------------------------------------------------ reference algorithms
def llada_reference(fn, prompt, *, steps, gen_length, block_length, mask_id=MASK):
    """LLaDA `generate` at temperature 0, low-confidence remasking, written out row by row."""
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    for nb in range(num_blocks):
        hi = p + (nb + 1) * block_length
        counts = (x[:, p + nb * block_length : hi] == mask_id).sum(1).tolist()
        plan = [[c // spb + (1 if i < c % spb else 0) for i in range(spb)] for c in counts]
        for i in range(spb):
            mask_index = x == mask_id
            logits = fn(x)
            x0 = logits.argmax(-1)
            x0_p = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
            x0_p[:, hi:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-torch.inf))
            for j in range(b):
                k = plan[j][i]
                if k:
                    sel = torch.topk(confidence[j], k).indices
                    x[j, sel] = x0[j, sel]
    return x


def dream_reference(fn, prompt, *, steps, gen_length, alg, mask_id=MASK, eps=1e-3):
    """Dream `_sample` (one block, temperature 0, alg_temp 0)."""
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        probs = torch.softmax(fn(x)[mask_index], dim=-1)
        confidence, x0 = probs.max(-1)
        if alg == "entropy":
            confidence = (probs * torch.log(probs + 1e-10)).sum(-1)
        t, s = timesteps[i], timesteps[i + 1]
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
        full_conf = torch.full(x.shape, -torch.inf)
        full_conf[mask_index] = confidence
        if n > 0:
            idx = torch.topk(full_conf, n).indices
            x_ = torch.full_like(x, mask_id)
            x_[mask_index] = x0
            rows = torch.arange(b)[:, None].expand_as(idx)
            x[rows, idx] = x_[rows, idx]
    return x


def fast_dllm_reference(model, prompt, *, gen_length, block_length, threshold, cache, mask_id=MASK):
    """Fast-dLLM threshold decoding (top-1 + confidence >= threshold in the block), optionally with a cache: a full
    forward with a cache at each block start, then `model(x[:, s:], cache=prefix)` steps ("prefix", a DynamicCache)
    or `model(x[:, s:e], cache=whole sequence)` steps ("dual", a StaticCache whose suffix entries stay)."""
    from transformers import DynamicCache, StaticCache

    b, p = prompt.shape
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    for nb in range(gen_length // block_length):
        s, e = p + nb * block_length, p + (nb + 1) * block_length
        step = 0
        kv = None
        while (x[:, s:e] == mask_id).any():
            with torch.no_grad():
                if cache is None:
                    logits = model(x).logits[:, s:e].float()
                elif step == 0:
                    kv = DynamicCache(config=model.config) if cache == "prefix" else StaticCache(config=model.config, max_cache_len=x.shape[1])
                    logits = model(x, cache=kv, use_cache=True).logits[:, s:e].float()
                elif cache == "prefix":
                    kv.crop(s - kv.get_seq_length())
                    pos = torch.arange(s, x.shape[1])[None]
                    logits = model(x[:, s:], cache=kv, use_cache=True, position_ids=pos).logits[:, : e - s].float()
                else:
                    kv.crop(s - int(kv.get_seq_length()))
                    logits = model(x[:, s:e], cache=kv, use_cache=True, position_ids=torch.arange(s, e)[None]).logits.float()
            step += 1
            logits[..., mask_id] = -torch.inf
            x0 = logits.argmax(-1)
            conf = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
            blk = x[:, s:e]
            for j in range(b):
                masked = (blk[j] == mask_id).nonzero().flatten().tolist()
                if not masked:
                    continue
                ranked = sorted(masked, key=lambda q: -conf[j, q].item())
                take = [ranked[0]] + [q for q in ranked[1:] if conf[j, q] >= threshold]
                for q in take:
                    blk[j, q] = x0[j, q]
    return x


def prompt_batch(adapter, prompts):
    return adapter.encode_prompts(prompts)


# ------------------------------------------------------------------------------------------ backbone
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_backbone_is_bidirectional(impl, arch):
    a = MDA.tiny(seed=0, arch=arch, attn_implementation=impl)
    x = torch.randint(5, 90, (2, 9))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 90 + 5
    with torch.no_grad():
        lx, ly = a.model(x).logits, a.model(y).logits
    assert not torch.allclose(lx[:, 0], ly[:, 0])  # the first position sees the last token


@pytest.mark.parametrize("shift", [False, True])
def test_prefix_cache_suffix_equals_full_forward_on_unchanged_input(shift):
    a = MDA.tiny(seed=1, initializer_range=0.3, shift_logits=shift)
    pid, pm = prompt_batch(a, PROMPTS)  # left padded
    fn = a.backbone_logits(pm, 6)
    x = torch.cat([pid, torch.full((3, 6), MASK)], dim=1)
    x[:, pid.shape[1] : pid.shape[1] + 2] = torch.tensor([[10, 11], [12, 13], [14, 15]])
    s = pid.shape[1] + 2
    with torch.no_grad():
        full = fn.window(x, s)
        first = fn.prefill(x, s)
        again = fn.suffix(x, s)
        again2 = fn.suffix(x, s)  # the cache is cropped back to the prefix each time
        fn.prefill(x, s)
        blk = fn.block(x, s, s + 2)  # dual cache: only the block is fed
    torch.testing.assert_close(blk, full[:, :2], rtol=0, atol=1e-5)
    torch.testing.assert_close(first, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(again, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(again2, full, rtol=0, atol=1e-5)
    assert fn.tokens_fed == 3 * x.shape[1] * 3 + 2 * 3 * (x.shape[1] - s + int(shift)) + 3 * 2


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("start_offset", [0, 2])
def test_block_only_logits_equal_the_window_slice(shift, start_offset):
    """`window` / `prefill` / `suffix` with an `end` run the LM head on the block only (`logits_to_keep` positions,
    Dream's shift included, also at position 0) and give exactly the block's slice of the full window."""
    a = MDA.tiny(seed=1, initializer_range=0.3, shift_logits=shift)
    pid, pm = prompt_batch(a, PROMPTS)
    fn = a.backbone_logits(pm, 6)
    x = torch.cat([pid, torch.full((3, 6), MASK)], dim=1)
    x[:, pid.shape[1] : pid.shape[1] + 2] = torch.tensor([[10, 11], [12, 13], [14, 15]])
    s = 0 if start_offset == 0 else pid.shape[1] + start_offset
    e = s + 3
    with torch.no_grad():
        full = fn.window(x, s)[:, : e - s]
        only = fn.window(x, s, e)
        first = fn.prefill(x, s, e)
        again = fn.suffix(x, s, e)
    assert only.shape == (3, 3, full.shape[-1])
    for out in (only, first, again):
        torch.testing.assert_close(out, full, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------------ samplers vs references
def test_num_transfer_tokens_spreads_evenly():
    out = num_transfer_tokens(torch.tensor([7, 8, 0, 3]), 4)
    assert out.tolist() == [[2, 2, 2, 1], [2, 2, 2, 2], [0, 0, 0, 0], [1, 1, 1, 0]]


@pytest.mark.parametrize("gen_length,block_length,steps", [(8, 8, 8), (8, 4, 4), (12, 4, 6), (16, 8, 4), (6, 2, 6)])
def test_low_confidence_matches_llada_reference(sharp, gen_length, block_length, steps):
    pid, _ = prompt_batch(sharp, ["abc", "xyz", "q1?"])  # equal lengths: no padding
    fn = plain_logits_fn(sharp.model)
    ref = llada_reference(fn, pid, steps=steps, gen_length=gen_length, block_length=block_length)
    got = generate_low_confidence(fn, pid, gen_length=gen_length, block_length=block_length, steps=steps, mask_id=MASK)
    assert torch.equal(got, ref)
    assert not (got == MASK).any()
    # through the adapter (LM head on the window only, logits_to_keep)
    out = sharp.generate(pid, torch.ones_like(pid, dtype=torch.bool), gen_length=gen_length, block_length=block_length, steps=steps)
    assert torch.equal(out["ids"], ref)
    assert out["nfe"] == steps


def test_low_confidence_with_dream_shift_matches_reference(sharp_dream):
    pid, _ = prompt_batch(sharp_dream, ["abc", "xyz"])
    fn = plain_logits_fn(sharp_dream.model, shift=True)
    ref = llada_reference(fn, pid, steps=8, gen_length=8, block_length=4)
    out = sharp_dream.generate(pid, torch.ones_like(pid, dtype=torch.bool), gen_length=8, block_length=4, steps=8)
    assert torch.equal(out["ids"], ref)


@pytest.mark.parametrize("alg", ["entropy", "maskgit_plus"])
@pytest.mark.parametrize("steps", [8, 4])
def test_dream_orders_match_dream_reference(sharp, alg, steps):
    pid, _ = prompt_batch(sharp, ["abc", "xyz", "q1?"])
    fn = plain_logits_fn(sharp.model)
    ref = dream_reference(fn, pid, steps=steps, gen_length=8, alg=alg)
    got = generate_dream(fn, pid, gen_length=8, steps=steps, mask_id=MASK, alg=alg)
    assert torch.equal(got, ref)


@pytest.mark.parametrize("cache", [None, "prefix", "dual"])
@pytest.mark.parametrize("block_length", [4, 8])
def test_threshold_matches_fast_dllm_reference(sharp, cache, block_length):
    pid, _ = prompt_batch(sharp, ["abc", "xyz", "q1?"])
    ref = fast_dllm_reference(sharp.model, pid, gen_length=8, block_length=block_length, threshold=0.3, cache=cache)
    out = sharp.generate(
        pid, torch.ones_like(pid, dtype=torch.bool), sampler="threshold", cache=cache, threshold=0.3, gen_length=8,
        block_length=block_length,
    )
    assert torch.equal(out["ids"], ref)
    assert out["nfe"] < 8  # parallel decoding happened on this model
    if cache is None:
        plain = generate_threshold(plain_logits_fn(sharp.model), pid, gen_length=8, block_length=block_length, mask_id=MASK, threshold=0.3)
        assert torch.equal(plain, ref)
    if cache == "prefix":  # the sampler name alone
        named = sharp.generate(pid, torch.ones_like(pid, dtype=torch.bool), sampler="threshold_cache", threshold=0.3,
                               gen_length=8, block_length=block_length)
        assert torch.equal(named["ids"], ref)


def test_prefix_cache_feeds_fewer_positions(sharp):
    pid, pm = prompt_batch(sharp, PROMPTS)
    a = sharp.generate(pid, pm, sampler="threshold", threshold=1.0, gen_length=8, block_length=4)
    b = sharp.generate(pid, pm, sampler="threshold_cache", threshold=1.0, gen_length=8, block_length=4)
    assert a["nfe"] == b["nfe"] == 8  # threshold 1: one token per step
    L = pid.shape[1] + 8
    # per block: one full forward, then 3 steps over the block and the masked suffix only
    assert b["tokens_fed"] == 3 * (2 * L + 3 * 8 + 3 * 4)
    assert a["tokens_fed"] == 3 * 8 * L
    c = sharp.generate(pid, pm, sampler="threshold", cache="dual", threshold=1.0, gen_length=8, block_length=4)
    assert c["tokens_fed"] == 3 * (2 * L + 6 * 4)  # dual cache: the 3 later steps of each block feed the block only
    assert torch.equal(c["ids"][:, : pid.shape[1]], pid)


def test_threshold_one_equals_low_confidence_one_token_per_step(sharp):
    pid, pm = prompt_batch(sharp, PROMPTS)
    a = sharp.generate(pid, pm, sampler="threshold", threshold=1.0, gen_length=8, block_length=4)
    b = sharp.generate(pid, pm, sampler="low_confidence", gen_length=8, block_length=4, steps=8)
    assert torch.equal(a["ids"], b["ids"])


# ------------------------------------------------------------------------------------------ sampling properties
@pytest.mark.parametrize(
    "sampler", ["low_confidence", "random", "entropy", "threshold", "threshold_cache", "random_order"]
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_left_padding_equals_unbatched(sharp, sampler, temperature):
    opts = dict(sampler=sampler, gen_length=8, block_length=4, threshold=0.3, temperature=temperature)
    seeds = [101, 202, 303]
    batched = sharp.sample(PROMPTS, 1, seeds=seeds, **opts)
    assert batched.prompt_mask[0].sum() < batched.prompt_mask.shape[1]  # the first prompt is padded
    for i, p in enumerate(PROMPTS):
        single = sharp.sample([p], 1, seeds=[seeds[i]], **opts)
        assert torch.equal(single.response_ids[0], batched.response_ids[i]), p
        if sampler == "random_order":
            assert torch.equal(single.extras["order"][0], batched.extras["order"][i])
            torch.testing.assert_close(single.old_logp[0], batched.old_logp[i], rtol=0, atol=1e-5)


def test_sampling_is_reproducible_with_a_seed(sharp):
    for sampler in ("low_confidence", "random", "entropy", "threshold", "random_order"):
        kw = dict(sampler=sampler, temperature=1.0, gen_length=8, block_length=4)
        a = sharp.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(7), **kw)
        b = sharp.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(7), **kw)
        c = sharp.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(8), **kw)
        assert torch.equal(a.response_ids, b.response_ids), sampler
        assert not torch.equal(a.response_ids, c.response_ids), sampler


def test_rollout_fields(sharp):
    r = sharp.sample(PROMPTS, 2, gen_length=8)
    assert r.response_ids.shape == (6, 8) and r.group_size == 2 and r.prompts[1] == PROMPTS[0]
    for row, m in zip(r.response_ids.tolist(), r.response_mask.tolist()):
        first = row.index(2) if 2 in row else len(row)  # <eos> = 2
        assert m == [i <= first for i in range(len(row))]
    tok = sharp.tokenizer
    neg = tok.decode(r.neg_prompt_ids[2][r.neg_prompt_mask[2]].tolist())
    assert neg == PROMPTS[1] + "\n" + DEFAULT_NEGATIVE_INSTRUCTION
    assert r.completions[0] == tok.decode(r.response_ids[0][r.response_mask[0]].tolist(), skip_special_tokens=True)
    strings = sharp.token_strings(r)
    assert [len(s) for s in strings] == r.response_mask.sum(1).tolist()
    assert r.old_logp is None


def test_random_order_structure(sharp):
    pid, _ = prompt_batch(sharp, ["abc", "xyz"])
    fn = plain_logits_fn(sharp.model)
    ids, logp, order = generate_random_order(
        fn, pid, gen_length=8, block_length=4, steps=4, mask_id=MASK, generator=torch.Generator().manual_seed(0)
    )
    # 2 blocks x 2 steps, 2 tokens per step, block 0 entirely before block 1
    for row in order.tolist():
        assert sorted(row[:4]) == [0, 0, 1, 1] and sorted(row[4:]) == [2, 2, 3, 3]
    # tokens revealed at the first step: log-probs under the first forward (everything masked)
    x = torch.cat([pid, torch.full((2, 8), MASK)], dim=1)
    first = torch.log_softmax(fn(x)[:, pid.shape[1] :], -1)  # [B, T, V]
    resp = ids[:, pid.shape[1] :]
    at0 = order == 0
    want = first.gather(-1, resp[..., None])[..., 0]
    torch.testing.assert_close(logp[at0], want[at0], rtol=0, atol=1e-5)
    assert torch.equal(resp[at0], first.argmax(-1)[at0])  # greedy


# ------------------------------------------------------------------------------------------ estimators
@pytest.fixture(scope="module")
def rollout(sharp):
    return sharp.sample(
        PROMPTS, 2, sampler="random_order", temperature=0.8, gen_length=8, block_length=4, steps=4,
        generator=torch.Generator().manual_seed(11),
    )


def test_exact_logprob_reproduces_rollout_logprobs(sharp, rollout):
    scores = sharp.logprob(rollout, estimator="exact")
    torch.testing.assert_close(scores.logp, rollout.old_logp, rtol=0, atol=1e-5)
    drop = sharp.logprob(rollout, estimator="exact", padding="drop")
    span = rollout.extras["span_logp"]
    torch.testing.assert_close(drop.logp, torch.where(rollout.response_mask, span, 0.0), rtol=0, atol=1e-5)
    torch.testing.assert_close(scores.logp.sum(-1), span.sum(-1), rtol=0, atol=1e-4)  # fold keeps the span total


@pytest.mark.parametrize("estimator", ["mean_field", "elbo", "exact"])
def test_logprob_twice_is_bitwise_identical_and_micro_batch_independent(sharp, rollout, estimator):
    a = sharp.logprob(rollout, estimator=estimator, mask_seed=5)
    b = sharp.logprob(rollout, estimator=estimator, mask_seed=5)
    assert torch.equal(a.logp, b.logp)  # ratio exactly 1
    sub = sharp.logprob(rollout.select([3, 1]), estimator=estimator, mask_seed=5)
    torch.testing.assert_close(sub.logp, a.logp[[3, 1]], rtol=0, atol=1e-5)


def test_mean_field_hand_computed(sharp, rollout):
    """p_mask_prompt = 0: one forward on prompt + all-mask response; = 1: the real prompt tokens masked too."""
    for p, mask_prompt in ((0.0, False), (1.0, True)):
        got = sharp.logprob(rollout, estimator="mean_field", p_mask_prompt=p)
        prompt = rollout.prompt_ids.clone()
        if mask_prompt:
            prompt[rollout.prompt_mask] = MASK
        ids = torch.cat([prompt, torch.full_like(rollout.response_ids, MASK)], dim=1)
        attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], dim=1).long()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = sharp.model(ids, attention_mask=attn, position_ids=pos).logits[:, prompt.shape[1] :].float()
        logits[..., MASK] = -torch.inf
        want = torch.log_softmax(logits, -1).gather(-1, rollout.response_ids[..., None])[..., 0]
        want = torch.where(rollout.response_mask, want, 0.0)
        torch.testing.assert_close(got.logp.detach(), want, rtol=0, atol=1e-5)


def test_mean_field_seed_controls_prompt_masks(sharp, rollout):
    a = sharp.logprob(rollout, estimator="mean_field", mask_seed=1, p_mask_prompt=0.5)
    b = sharp.logprob(rollout, estimator="mean_field", mask_seed=2, p_mask_prompt=0.5)
    assert not torch.allclose(a.logp, b.logp)
    a0 = sharp.logprob(rollout, estimator="mean_field", mask_seed=1, p_mask_prompt=0.0)
    b0 = sharp.logprob(rollout, estimator="mean_field", mask_seed=2, p_mask_prompt=0.0)
    assert torch.equal(a0.logp, b0.logp)


def test_elbo_sums_to_the_sequence_elbo(sharp, rollout):
    r, n, t = 4, rollout.num_responses, 8
    got = sharp.logprob(rollout, estimator="elbo", mask_seed=3, num_copies=r)
    seeds = row_seeds(3, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, "response")
    masked, _ = elbo_masks(seeds, r, t, "cpu")  # [R, N, T]
    assert torch.equal(masked[:2] ^ masked[2:], torch.ones(2, n, t, dtype=torch.bool))  # antithetic pairs
    attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], dim=1).long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    sums = torch.zeros(r, n)
    for k in range(r):
        resp = torch.where(masked[k], MASK, rollout.response_ids)
        with torch.no_grad():
            logits = sharp.model(torch.cat([rollout.prompt_ids, resp], 1), attention_mask=attn, position_ids=pos).logits
        logits = logits[:, -t:].float()
        logits[..., MASK] = -torch.inf
        lp = torch.log_softmax(logits, -1).gather(-1, rollout.response_ids[..., None])[..., 0]
        sums[k] = (lp * masked[k]).sum(-1)
    want = elbo_from_masked_logp(sums, masked.sum(-1).clamp(min=1).float(), torch.full((n,), float(t)))  # [N]
    torch.testing.assert_close(got.logp.sum(-1).detach(), want, rtol=0, atol=1e-4)
    assert (got.logp[~rollout.response_mask] == 0).all()
    other = sharp.logprob(rollout, estimator="elbo", mask_seed=4, num_copies=r)
    assert not torch.allclose(other.logp, got.logp)


def test_fold_padding_hand_computed():
    v = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0], [5.0, 6.0, 7.0, 8.0]])
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    assert fold_padding(v, valid).tolist() == [[1, 9, 0, 0], [1, 1, 1, 1], [26, 0, 0, 0]]


@pytest.mark.parametrize("estimator", ["mean_field", "elbo", "exact"])
def test_negative_condition_changes_logprobs_and_shares_masks(sharp, rollout, estimator):
    pos = sharp.logprob(rollout, estimator=estimator, mask_seed=2)
    neg = sharp.logprob(rollout, estimator=estimator, mask_seed=2, condition="negative")
    assert not torch.allclose(pos.logp, neg.logp)
    both = sharp.logprob(rollout, estimator=estimator, mask_seed=2, stats=("kl", "h2", "entropy"), stats_against="negative")
    torch.testing.assert_close(both.other_logp, neg.logp.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(both.logp, pos.logp, rtol=0, atol=1e-6)
    valid = rollout.response_mask
    assert (both.stats["kl"][valid] > 0).all() and (both.stats["kl"][~valid] == 0).all()
    assert both.other_logp.requires_grad is False and both.logp.requires_grad


def test_statistics_against_the_reference_model(sharp, rollout):
    same = copy.deepcopy(sharp.model)
    a = MDA(sharp.model, sharp.tokenizer, ref_model=same)
    s = a.logprob(rollout, estimator="mean_field", p_mask_prompt=0.0, stats=("h2", "kl", "entropy"))
    assert torch.equal(s.other_logp, s.logp.detach())
    assert s.stats["h2"].abs().max() < 1e-6 and s.stats["kl"].abs().max() < 1e-5
    other = MDA.tiny(seed=9, initializer_range=0.5).model
    b = MDA(sharp.model, sharp.tokenizer, ref_model=other)
    s = b.logprob(rollout, estimator="mean_field", p_mask_prompt=0.0, stats=("kl", "entropy"))
    ids = torch.cat([rollout.prompt_ids, torch.full_like(rollout.response_ids, MASK)], 1)
    attn = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_mask)], dim=1).long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        lp = sharp.model(ids, attention_mask=attn, position_ids=pos).logits[:, -8:].float()
        lq = other(ids, attention_mask=attn, position_ids=pos).logits[:, -8:].float()
    lp[..., MASK] = -1e4
    lq[..., MASK] = -1e4
    p, q = torch.log_softmax(lp, -1), torch.log_softmax(lq, -1)
    kl = (p.exp() * (p - q)).sum(-1)
    ent = ent_self = -(p.exp() * p).sum(-1)
    valid = rollout.response_mask
    torch.testing.assert_close(s.stats["kl"][valid], kl[valid], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s.stats["entropy"][valid], ent[valid], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="reference model is needed"):
        sharp.logprob(rollout, stats=("kl",))
    ent = sharp.logprob(rollout, estimator="mean_field", p_mask_prompt=0.0, stats=("entropy",))  # no reference needed
    assert ent.other_logp is None
    torch.testing.assert_close(ent.stats["entropy"][valid], ent_self[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("estimator", ["mean_field", "elbo", "exact"])
def test_logprob_carries_gradient(sharp, rollout, estimator):
    sharp.model.zero_grad()
    sharp.logprob(rollout, estimator=estimator).logp.sum().backward()
    g = sharp.model.model.embed_tokens.weight.grad
    assert g is not None and g.abs().sum() > 0
    sharp.model.zero_grad()


def test_exact_needs_the_order(sharp):
    r = sharp.sample(PROMPTS, 1, gen_length=8)
    with pytest.raises(ValueError, match="random_order"):
        sharp.logprob(r, estimator="exact")


# ------------------------------------------------------------------------------------------ WDCE noise
def test_forward_noise_and_denoise_logprob(sharp, rollout):
    nb = sharp.forward_noise(rollout, 4, torch.Generator().manual_seed(0))
    assert torch.equal(nb.extras["targets"], rollout.response_ids)
    n, p, t = rollout.num_responses, rollout.prompt_ids.shape[1], 8
    assert nb.input_ids.shape == (4 * n, p + t) and nb.noise_mask.shape == (4, n, t)
    for r in range(4):
        rows = nb.input_ids[r * n : (r + 1) * n]
        assert torch.equal(rows[:, :p], rollout.prompt_ids)  # the prompt is never masked
        assert torch.equal(rows[:, p:] == MASK, nb.noise_mask[r])
    assert torch.equal(nb.noise_mask[:2] ^ nb.noise_mask[2:], torch.ones(2, n, t, dtype=torch.bool))  # complements
    torch.testing.assert_close(nb.rates[:2] + nb.rates[2:], torch.ones(2, n))
    assert torch.equal(nb.n_masked, nb.noise_mask.sum(-1).clamp(min=1).float())
    assert nb.noise_mask[:, ~rollout.response_mask].any()  # post-EOS padding is maskable too
    lp = sharp.denoise_logprob(nb)
    assert lp.shape == (4, n, t) and (lp[~nb.noise_mask] == 0).all()
    attn = nb.attention_mask.long()
    with torch.no_grad():
        logits = sharp.model(nb.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    logits = logits[:, p:].float()
    logits[..., MASK] = -torch.inf
    want = torch.log_softmax(logits, -1).gather(-1, rollout.response_ids.repeat(4, 1)[..., None])[..., 0].reshape(4, n, t)
    torch.testing.assert_close(lp.detach(), torch.where(nb.noise_mask, want, 0.0), rtol=0, atol=1e-5)
    lp.sum().backward()
    sharp.model.zero_grad()


def test_dream_shift_predicts_token_i_at_position_i_minus_1(sharp_dream):
    r = sharp_dream.sample(["abc", "hello"], 1, gen_length=6)
    nb = sharp_dream.forward_noise(r, 2, torch.Generator().manual_seed(1))
    lp = sharp_dream.denoise_logprob(nb)
    p = r.prompt_ids.shape[1]
    attn = nb.attention_mask.long()
    with torch.no_grad():
        raw = sharp_dream.model(nb.input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    raw = raw[:, p - 1 : -1].float()  # the outputs at positions P-1 .. L-2 predict response tokens 0 .. T-1
    raw[..., MASK] = -torch.inf
    want = torch.log_softmax(raw, -1).gather(-1, r.response_ids.repeat(2, 1)[..., None])[..., 0].reshape(2, 2, 6)
    torch.testing.assert_close(lp.detach(), torch.where(nb.noise_mask, want, 0.0), rtol=0, atol=1e-5)
    # and a no-shift model with the same weights reads position i itself
    plain = MDA(sharp_dream.model, sharp_dream.tokenizer, shift_logits=False)
    assert not torch.allclose(plain.denoise_logprob(nb).detach(), lp.detach())


# ------------------------------------------------------------------------------------------ loading and errors
def test_save_and_load_round_trip(tmp_path):
    a = MDA.tiny(seed=2, shift_logits=True, gen_length=12, block_length=4, sampler="threshold_cache", threshold=0.7)
    a.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    b = adapter_class("masked_diffusion").from_pretrained(tmp_path / "m", ref_model=True)
    assert b.generation_defaults == a.generation_defaults
    assert (b.mask_token_id, b.pad_token_id, b.eos_token_ids, b.shift_logits) == (MASK, 0, [2], True)
    assert b.ref_model is not None and b.unwrapped.config.is_causal is False
    pid, pm = a.encode_prompts(PROMPTS)
    assert torch.equal(a.generate(pid, pm, seeds=[1, 2, 3])["ids"], b.generate(pid, pm, seeds=[1, 2, 3])["ids"])


def test_loading_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        MDA.from_pretrained(tmp_path / "nowhere")
    a = MDA.tiny(seed=0)
    a.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    for model_type, match in (("llada", "trust_remote_code"), ("Dream", "trust_remote_code"), ("foo", "unknown masked-diffusion family")):
        d = tmp_path / model_type
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**cfg, "model_type": model_type, "auto_map": {"AutoModel": "m.M"}} if model_type != "foo" else {**cfg, "model_type": "foo"}))
        with pytest.raises(ValueError, match=match):
            MDA.from_pretrained(d)
    meta = json.loads((tmp_path / "m" / "mmrl_adapter.json").read_text())
    (tmp_path / "m" / "mmrl_adapter.json").write_text(json.dumps({**meta, "family": "causal_lm"}))
    with pytest.raises(ValueError, match="causal_lm"):
        MDA.from_pretrained(tmp_path / "m")


def test_missing_ids_are_named():
    a = MDA.tiny(seed=0)
    model = copy.deepcopy(a.model)
    del model.config.mask_token_id
    tok = copy.deepcopy(a.tokenizer)
    tok.mask_token = None
    with pytest.raises(ValueError, match="mask_token_id"):
        MDA(model, tok)
    assert MDA(model, tok, mask_token_id=4).mask_token_id == 4
    model.config.pad_token_id = None
    tok.pad_token = None
    with pytest.raises(ValueError, match="pad_token_id"):
        MDA(model, tok, mask_token_id=4)
    model.config.eos_token_id = None
    tok.eos_token = None
    with pytest.raises(ValueError, match="EOS"):
        MDA(model, tok, mask_token_id=4, pad_token_id=0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        MDA(a.model, a.tokenizer, mask_token_id=10_000)


def test_bad_generation_options():
    a = MDA.tiny(seed=0)
    with pytest.raises(ValueError, match="unknown sampler 'beam'"):
        a.sample(["x"], 1, sampler="beam")
    with pytest.raises(ValueError, match="divisible by block_length"):
        a.sample(["x"], 1, gen_length=10, block_length=4)
    with pytest.raises(ValueError, match="steps .* divisible"):
        a.sample(["x"], 1, gen_length=8, block_length=4, steps=3)
    with pytest.raises(ValueError, match="unknown generation options"):
        a.sample(["x"], 1, max_new_tokens=3)
    with pytest.raises(ValueError, match="prefix cache"):
        a.sample(["x"], 1, sampler="random_order", cache="prefix")
    with pytest.raises(ValueError, match="unknown cache"):
        a.sample(["x"], 1, cache="both")
    with pytest.raises(ValueError, match="unknown estimator"):
        a.logprob(a.sample(["x"], 1, gen_length=4), estimator="bogus")


def test_negative_instruction_option_block_clamp_and_empty_prompts(sharp):
    r = sharp.sample(["q"], 1, gen_length=8, block_length=32, negative_instruction="Be wrong.")  # one block of 8
    assert sharp.tokenizer.decode(r.neg_prompt_ids[0][r.neg_prompt_mask[0]].tolist()) == "q\nBe wrong."
    pid, pm = prompt_batch(sharp, ["abc"])
    assert torch.equal(
        sharp.generate(pid, pm, gen_length=8, block_length=32, seeds=[0])["ids"],
        sharp.generate(pid, pm, gen_length=8, block_length=None, seeds=[0])["ids"],
    )
    with pytest.raises(ValueError, match="non-empty list"):
        sharp.sample([], 2)


def test_lora_policy_samples_and_scores_against_the_disabled_adapter():
    peft = pytest.importorskip("peft")
    a = MDA.tiny(seed=5, initializer_range=0.5, gen_length=8, block_length=4, temperature=0.0)
    base = copy.deepcopy(a.model)
    a.model = peft.get_peft_model(a.model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # make the adapter non-zero so policy and reference differ
        for n, p in a.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    r = a.sample(PROMPTS, 1, sampler="threshold_cache", threshold=0.3, seeds=[1, 2, 3])
    ref = a.logprob(r, estimator="elbo", use_reference=True, mask_seed=1)
    plain = MDA(base, a.tokenizer).logprob(r, estimator="elbo", mask_seed=1)
    torch.testing.assert_close(ref.logp, plain.logp.detach(), rtol=0, atol=1e-5)
    pol = a.logprob(r, estimator="elbo", mask_seed=1, stats=("kl",))
    assert not torch.allclose(pol.logp.detach(), ref.logp) and pol.stats["kl"][r.response_mask].gt(0).all()


FAKE_REMOTE_CODE = """'''Stand-ins for LLaDA / Dream remote code: their call signatures around a tiny bidirectional Llama.'''
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig, PreTrainedModel


class _Cfg(PretrainedConfig):
    vocab_size: int = 102
    hidden_size: int = 32
    mask_token_id: int = 4
    pad_token_id: int = 0
    eos_token_id: int = 2


class FakeLLaDAConfig(_Cfg):
    model_type = "llada"


class FakeDreamConfig(_Cfg):
    model_type = "Dream"


class _Model(PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        inner = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.5)
        inner.is_causal = False
        self.inner = LlamaForCausalLM(inner)
        self.post_init()

    def _init_weights(self, module):
        pass


class FakeLLaDAModel(_Model):
    config_class = FakeLLaDAConfig

    def forward(self, input_ids, attention_mask=None):  # LLaDA: no position ids, no cache
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class FakeDreamModel(_Model):
    config_class = FakeDreamConfig

    def forward(self, input_ids, attention_mask=None, position_ids=None):  # Dream: "full" or a 4-D bool mask
        if isinstance(attention_mask, str):
            assert attention_mask == "full"
            attention_mask = None
        else:
            assert attention_mask.dim() == 4 and attention_mask.dtype == torch.bool
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
"""


@pytest.mark.parametrize("name,kind,shift", [("LLaDA", "llada", False), ("Dream", "dream", True)])
def test_remote_code_checkpoints_load_only_with_trust_and_sample(tmp_path, name, kind, shift):
    """Local stand-ins with LLaDA's / Dream's call signatures (no position ids / a 4-D boolean mask, no cache) and
    their model_type, loaded through `auto_map` like the real checkpoints."""
    import warnings

    from mmrl.models.tokenizers import char_tokenizer

    mod = _import_source(tmp_path, "modeling_fake_dllm", FAKE_REMOTE_CODE)
    cfg = getattr(mod, f"Fake{name}Config")()
    torch.manual_seed(0)
    model = getattr(mod, f"Fake{name}Model")(cfg)
    cfg.register_for_auto_class()
    model.register_for_auto_class("AutoModel")
    d = tmp_path / name
    model.save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    with pytest.raises(ValueError, match="trust_remote_code"):
        MDA.from_pretrained(d)
    a = MDA.from_pretrained(d, trust_remote_code=True, temperature=0.0, gen_length=8, block_length=4)
    assert (a.backbone, a.shift_logits, a.mask_token_id, a.pad_token_id) == (kind, shift, MASK, 0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cached = a.sample(PROMPTS, 1, sampler="threshold_cache", threshold=0.3, seeds=[0, 1, 2])
    assert any("no KV cache" in str(x.message) for x in w)
    plain = a.sample(PROMPTS, 1, sampler="threshold", threshold=0.3, seeds=[0, 1, 2])
    assert torch.equal(cached.response_ids, plain.response_ids)
    assert torch.isfinite(a.logprob(plain, estimator="elbo").logp).all()
    if kind == "dream":  # Dream takes position ids, so a left-padded row equals the same prompt alone
        single = a.sample(PROMPTS[:1], 1, sampler="threshold", threshold=0.3, seeds=[0])
        assert torch.equal(single.response_ids[0], plain.response_ids[0])


@pytest.mark.slow
def test_sampler_benchmark_smoke(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "dllm_samplers.py"), "--smoke", "--threads", "1", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    res = json.loads(out.read_text())["results"]
    gl = 16  # --smoke: gen_length 16, block_length 8
    assert res["low_conf_steps=len"]["forward_passes"] == gl and res["low_conf_steps=len/2"]["forward_passes"] == gl // 2
    assert res["random_order"]["forward_passes"] == gl
    for name in ("threshold+cache", "threshold+dual_cache"):
        assert res[name]["forward_passes"] == res["threshold"]["forward_passes"]
        assert res[name]["positions_fed"] < res["threshold"]["positions_fed"]
    assert res["threshold+dual_cache"]["positions_fed"] < res["threshold+cache"]["positions_fed"]
    for name in ("low_conf+cache", "low_conf+dual_cache"):  # the baseline's schedule, fewer positions fed
        assert res[name]["forward_passes"] == gl and res[name]["positions_fed"] < res["low_conf_steps=len"]["positions_fed"]
    assert res["low_conf_steps=len"]["agreement"] == 1.0  # the baseline against itself
    assert all(0.0 <= r["agreement"] <= 1.0 for r in res.values())


def test_remote_code_written_for_transformers_4_loads(tmp_path):
    """LLaDA's modelling code (NVlabs/Fast-dLLM llada/model, found by scripts/check_real_architectures.py) never calls
    `post_init()`, defines `tie_weights(self)` without keywords and reads `config.use_cache`, which its config does not
    declare: transformers 5 loads none of that unaided; the adapter does, and the weights are the saved ones."""

    from mmrl.models.tokenizers import char_tokenizer

    code = FAKE_REMOTE_CODE.replace("        self.post_init()\n", "").replace(
        "    def forward(self, input_ids, attention_mask=None):  # LLaDA: no position ids, no cache\n",
        "    def tie_weights(self):\n        pass\n\n"
        "    def forward(self, input_ids, attention_mask=None):  # LLaDA: no position ids, no cache\n"
        "        assert self.config.use_cache is False\n")
    mod = _import_source(tmp_path, "modeling_old_llada", code)
    cfg = mod.FakeLLaDAConfig()
    torch.manual_seed(0)
    model = mod.FakeLLaDAModel(cfg)
    assert not hasattr(model, "all_tied_weights_keys")  # as LLaDA's: post_init never ran
    cfg.register_for_auto_class()
    model.register_for_auto_class("AutoModel")
    d = tmp_path / "OldLLaDA"
    model.save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    a = MDA.from_pretrained(d, trust_remote_code=True, temperature=0.0, gen_length=8, block_length=4)
    saved = model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in a.unwrapped.state_dict().items())
    out = a.sample(PROMPTS, 1, seeds=[0, 1, 2])
    assert torch.isfinite(a.logprob(out, estimator="elbo").logp).all()


def test_default_rope_for_remote_code_matches_transformers_own():
    """Dream's remote code looks up ROPE_INIT_FUNCTIONS["default"], which transformers 5 no longer has; the
    registered stand-in gives the original RoPE frequencies base^(-2i/d), as transformers' Qwen2 computes them."""
    from transformers import Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    from mmrl.models.masked_diffusion import ensure_default_rope

    ensure_default_rope()
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=4, rope_theta=1e6)
    inv, factor = ROPE_INIT_FUNCTIONS["default"](cfg, "cpu")
    ref, ref_factor = Qwen2RotaryEmbedding.compute_default_rope_parameters(cfg, device="cpu")
    assert factor == ref_factor == 1.0 and torch.allclose(inv, ref)
    assert inv.shape == (8,) and float(inv[1]) == pytest.approx(1e6 ** (-2 / 16))
    kw, _ = ROPE_INIT_FUNCTIONS["default"](None, "cpu", base=10000.0, dim=4)
    assert torch.allclose(kw, torch.tensor([1.0, 0.01]))


def test_transformers_4_tied_names_and_generation_config_validate(tmp_path):
    """Dream's modelling code lists tied weights as transformers 4 did (`["lm_head.weight"]`) and defines
    `validate(self, is_init=False)` on its generation config: transformers 5 cannot save the first and passes
    `user_set_attributes` to the second; the compatibility shim makes both work."""
    import sys
    import types

    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from mmrl.models.masked_diffusion import transformers5_compatible

    mod = types.ModuleType("fake_dream_module")

    class OldGenerationConfig(GenerationConfig):
        def validate(self, is_init=False):
            return super().validate()

    class OldTied(LlamaForCausalLM):
        _tied_weights_keys = ["lm_head.weight"]

    for c in (OldGenerationConfig, OldTied):
        c.__module__ = mod.__name__
        setattr(mod, c.__name__, c)
    sys.modules[mod.__name__] = mod
    transformers5_compatible(OldTied)
    model = OldTied(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, tie_word_embeddings=False))
    assert model._tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}
    model.save_pretrained(tmp_path / "m")  # transformers 5 fails here on the list
    assert (tmp_path / "m" / "model.safetensors").is_file()
    OldGenerationConfig().save_pretrained(tmp_path / "g")
    assert isinstance(OldGenerationConfig.from_pretrained(tmp_path / "g", do_sample=False), OldGenerationConfig)


ROPE_REMOTE_CODE = """'''A stand-in for Dream's modelling code as written for transformers 4 (NVlabs/Fast-dLLM dream/model): RoPE
frequencies in a non-persistent buffer computed by `rope_init_fn` in `__init__`, an `_init_weights` that knows only
Linear and Embedding modules.'''
import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


class RopeDreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=102, hidden_size=32, num_attention_heads=4, rope_theta=10000.0, mask_token_id=4,
                 pad_token_id=0, eos_token_id=2, **kwargs):
        self.vocab_size, self.hidden_size, self.num_attention_heads = vocab_size, hidden_size, num_attention_heads
        self.rope_theta, self.mask_token_id = rope_theta, mask_token_id
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)


class RopeDreamRotaryEmbedding(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.rope_kwargs, self.rope_type = config, {}, "default"
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(self.config, None, **self.rope_kwargs)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq


class RopeDreamModel(PreTrainedModel):
    config_class = RopeDreamConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RopeDreamRotaryEmbedding(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):  # Dream's: Linear and Embedding only
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.5)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        angles = position_ids[..., None].float() * self.rotary_emb.inv_freq  # [B, L, d/2]
        heads = self.config.num_attention_heads
        rope = torch.cat([angles, angles], dim=-1).cos().repeat(1, 1, heads)  # [B, L, H]
        return CausalLMOutput(logits=self.lm_head(self.embed_tokens(input_ids) * rope))
"""


def test_remote_rope_frequencies_are_filled_after_loading(tmp_path):
    """transformers 5 loads a model's non-persistent buffers as uninitialised memory and leaves them to
    `_init_weights`, which Dream's modelling code overrides without its RoPE module: the frequencies were garbage,
    different on every load (policy and reference disagreed) and at times inf / NaN, the cause of the random NaN DMPO
    losses on the real Dream architecture. Loaded through the adapter they are theta^(-2i/d) again: with theta 1e4 and
    head dim 8, [1, 0.1, 0.01, 0.001]; logits equal the saved model's, and the reference (a second load) equals the
    policy, so DMPO's log p_ref - log p_v is exactly 0 at the start."""

    from mmrl.models.masked_diffusion import ensure_default_rope
    from mmrl.models.tokenizers import char_tokenizer

    ensure_default_rope()  # the code looks up ROPE_INIT_FUNCTIONS["default"], as Dream's does
    mod = _import_source(tmp_path, "modeling_rope_dream", ROPE_REMOTE_CODE)
    cfg = mod.RopeDreamConfig()
    torch.manual_seed(0)
    model = mod.RopeDreamModel(cfg).eval()
    expected = torch.tensor([1.0, 0.1, 0.01, 0.001])
    assert torch.allclose(model.rotary_emb.inv_freq, expected)
    cfg.register_for_auto_class()
    model.register_for_auto_class("AutoModel")
    d = tmp_path / "RopeDream"
    model.save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    opts = dict(temperature=0.0, gen_length=8, block_length=4)
    a = MDA.from_pretrained(d, trust_remote_code=True, ref_model=True, **opts)
    assert a.backbone == "dream"
    for m in (a.unwrapped, a.ref_model):
        assert torch.allclose(m.rotary_emb.inv_freq, expected)
        assert m.rotary_emb.original_inv_freq is m.rotary_emb.inv_freq
    original = MDA(model, char_tokenizer(), **opts)
    out = original.sample(PROMPTS, 2, seeds=list(range(6)))
    want = original.logprob(out, estimator="elbo", num_copies=2).logp  # [N, T]
    got = a.logprob(out, estimator="elbo", num_copies=2).logp
    ref = a.logprob(out, estimator="elbo", num_copies=2, use_reference=True).logp
    assert torch.isfinite(got).all() and torch.allclose(got, want, atol=1e-5)
    assert torch.equal(got, ref)
