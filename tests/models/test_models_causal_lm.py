"""CausalLMAdapter on a tiny random Qwen2ForCausalLM (the real class) over the offline char tokenizer.

References are computed here independently: a plain forward of each unpadded sequence alone (batch of one, no
mask, the model's default positions, full logits), brute-force filters, hand-computed draws.
"""
import json
import math
import textwrap

import pytest
import torch

from mmrl.models import adapter_class
from mmrl.models.causal_lm import CausalLMAdapter
from mmrl.models.sampling import filter_top_k, filter_top_p, inverse_cdf_draw, row_uniforms
from mmrl.core.protocol import DEFAULT_NEGATIVE_INSTRUCTION, Policy

PROMPTS = [
    "Q: 1+1=?",
    [{"role": "user", "content": "Sort 3 1 2, please."}],
    "a much longer plain prompt, so that the others get left padding",
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "why?"}],
]
EOS_SET = [2, 20, 21, 22, 23, 24, 25, 26, 27, 28]  # ~10% per token: some rows stop early, others run to the end


@pytest.fixture(scope="module")
def adapter():
    return CausalLMAdapter.tiny(seed=0, max_new_tokens=12)


@pytest.fixture(scope="module")
def rollout(adapter):
    return adapter.sample(PROMPTS, 3, generator=torch.Generator().manual_seed(1), temperature=0.7, eos_token_id=EOS_SET)


def unpadded(rollout, i, condition="positive"):
    """(prompt ids, valid response ids) of row i as lists."""
    ids, mask = (rollout.prompt_ids, rollout.prompt_mask) if condition == "positive" else (rollout.neg_prompt_ids, rollout.neg_prompt_mask)
    return ids[i][mask[i]].tolist(), rollout.response_ids[i][rollout.response_mask[i]].tolist()


@torch.no_grad()
def reference_log_dist(model, prompt, response, temperature):
    """[T, V] log softmax(logits / temperature) predicting each response token: one unpadded sequence, full logits."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0].float()  # [L, V]
    p = len(prompt)
    return torch.log_softmax(logits[p - 1 : p - 1 + len(response)] / temperature, dim=-1)  # [T, V]


def reference_logp(model, rollout, temperature, condition="positive"):
    """[N, T] per-token log-probs, one unpadded row at a time."""
    out = torch.zeros(rollout.response_ids.shape)
    for i in range(rollout.num_responses):
        prompt, resp = unpadded(rollout, i, condition)
        if resp:
            lp = reference_log_dist(model, prompt, resp, temperature)
            out[i, : len(resp)] = lp.gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
    return out


# ---------------------------------------------------------------------------------------------- rollout layout


def test_is_a_policy_and_registered(adapter):
    assert isinstance(adapter, Policy)
    assert adapter_class("causal_lm") is CausalLMAdapter
    assert adapter.vocab_size == len(adapter.tokenizer) == 102


def test_rollout_layout_eos_mask_and_completions(adapter, rollout):
    n, t = rollout.response_ids.shape
    assert n == len(PROMPTS) * 3 and rollout.group_size == 3 and t <= 12
    assert rollout.prompts == [p for p in PROMPTS for _ in range(3)]
    pad = adapter.generation_defaults["pad_token_id"]
    saw_early_stop = saw_truncated = False
    for i in range(n):
        row = rollout.response_ids[i].tolist()
        first = next((k for k, tok in enumerate(row) if tok in EOS_SET), None)
        valid = t if first is None else first + 1  # through the first EOS, inclusive
        assert rollout.response_mask[i].tolist() == [k < valid for k in range(t)]
        assert all(tok == pad for tok in row[valid:])
        assert torch.all(rollout.old_logp[i, valid:] == 0)
        assert bool(rollout.extras["terminated"][i]) == (first is not None)
        expected = adapter.tokenizer.decode(row[:valid], skip_special_tokens=True)
        assert rollout.completions[i] == expected
        saw_early_stop |= first is not None and first < t - 1
        saw_truncated |= first is None
    assert saw_early_stop and saw_truncated
    assert torch.all(rollout.old_logp[rollout.response_mask] < 0)
    # the G copies of a prompt share the prompt rows
    assert torch.equal(rollout.prompt_ids[0], rollout.prompt_ids[2]) and not torch.equal(rollout.prompt_ids[0], rollout.prompt_ids[3])


def test_prompts_are_left_padded_and_chat_templated(adapter, rollout):
    tok = adapter.tokenizer
    for g, p in enumerate(PROMPTS):
        ids = rollout.prompt_ids[3 * g][rollout.prompt_mask[3 * g]].tolist()
        if isinstance(p, str):
            assert tok.decode(ids) == p
        else:
            text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in p) + "<|assistant|>"
            assert tok.decode(ids) == text
        mask = rollout.prompt_mask[3 * g]
        assert mask[-1] and torch.all(mask[mask.float().argmax() :])  # padding only on the left


# ---------------------------------------------------------------------------------------------- scoring


def test_logprob_equals_rollout_logp_and_unpadded_reference(adapter, rollout):
    scores = adapter.logprob(rollout)
    torch.testing.assert_close(scores.logp, rollout.old_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores.logp, reference_logp(adapter.model, rollout, 0.7), atol=1e-5, rtol=0)
    assert torch.all(scores.logp[~rollout.response_mask] == 0)
    assert scores.other_logp is None and scores.stats == {}


def test_ratio_is_exactly_one_on_a_micro_batch(adapter, rollout):
    mb = rollout.select([4, 0, 7, 9])
    with torch.no_grad():
        old = adapter.logprob(mb).logp
    new = adapter.logprob(mb).logp
    assert new.requires_grad
    ratio = torch.exp(new - old)
    assert torch.equal(ratio.detach(), torch.ones_like(ratio))
    new.sum().backward()  # the graph reaches the weights
    assert adapter.model.model.layers[0].self_attn.q_proj.weight.grad is not None
    adapter.model.zero_grad(set_to_none=True)


def test_explicit_temperature_overrides_the_rollouts(adapter, rollout):
    mb = rollout.select([0, 5])
    got = adapter.logprob(mb, temperature=1.3).logp
    torch.testing.assert_close(got, reference_logp(adapter.model, mb, 1.3), atol=1e-5, rtol=0)


def test_negative_condition(adapter, rollout):
    tok = adapter.tokenizer
    neg_string = tok.decode(rollout.neg_prompt_ids[0][rollout.neg_prompt_mask[0]].tolist())
    assert neg_string == PROMPTS[0] + "\n" + DEFAULT_NEGATIVE_INSTRUCTION
    neg_chat = tok.decode(rollout.neg_prompt_ids[9][rollout.neg_prompt_mask[9]].tolist())
    # multi-turn chat: appended to the LAST user message only
    assert neg_chat == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>yo\n<|user|>why?\n" + DEFAULT_NEGATIVE_INSTRUCTION + "\n<|assistant|>"
    pos = adapter.logprob(rollout).logp
    neg = adapter.logprob(rollout, condition="negative").logp
    torch.testing.assert_close(neg, reference_logp(adapter.model, rollout, 0.7, "negative"), atol=1e-5, rtol=0)
    assert (neg - pos).abs().max() > 1e-3


def test_negative_instruction_is_configurable(adapter):
    r = adapter.sample(["x=1"], 1, negative_instruction="Be wrong.", max_new_tokens=2, generator=torch.Generator().manual_seed(0))
    assert adapter.tokenizer.decode(r.neg_prompt_ids[0][r.neg_prompt_mask[0]].tolist()) == "x=1\nBe wrong."


def test_statistics_match_an_unchunked_computation():
    adapter = CausalLMAdapter.tiny(seed=0, max_new_tokens=8)
    adapter = CausalLMAdapter(adapter.model, adapter.tokenizer, ref_model=CausalLMAdapter.tiny(seed=5).model, max_new_tokens=8)
    r = adapter.sample(PROMPTS[:3], 2, generator=torch.Generator().manual_seed(3), temperature=0.9)
    vs_ref = adapter.logprob(r, stats=("h2", "entropy"))
    vs_neg = adapter.logprob(r, stats=("kl",), stats_against="negative")
    for i in range(r.num_responses):
        prompt, resp = unpadded(r, i)
        neg_prompt, _ = unpadded(r, i, "negative")
        t = len(resp)
        lp = reference_log_dist(adapter.model, prompt, resp, 0.9)  # [T, V]
        lq = reference_log_dist(adapter.ref_model, prompt, resp, 0.9)
        ln = reference_log_dist(adapter.model, neg_prompt, resp, 0.9)
        p, q = lp.exp(), lq.exp()
        h2 = 1 - (p * q).sqrt().sum(-1)
        entropy = -(p * lp).sum(-1)
        kl = (p * (lp - ln)).sum(-1)
        idx = torch.tensor(resp)[:, None]
        torch.testing.assert_close(vs_ref.stats["h2"][i, :t], h2, atol=1e-5, rtol=0)
        torch.testing.assert_close(vs_ref.stats["entropy"][i, :t], entropy, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vs_ref.other_logp[i, :t], lq.gather(-1, idx).squeeze(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(vs_neg.stats["kl"][i, :t], kl, atol=1e-5, rtol=0)
        torch.testing.assert_close(vs_neg.other_logp[i, :t], ln.gather(-1, idx).squeeze(-1), atol=1e-5, rtol=0)
        assert torch.all(h2 > 0) and torch.all(kl > 0)
    assert set(vs_ref.stats) == {"h2", "entropy"} and set(vs_neg.stats) == {"kl"}
    assert not vs_ref.other_logp.requires_grad


def test_entropy_alone_needs_no_other_side(adapter, rollout):
    s = adapter.logprob(rollout.select([0, 1]), stats=("entropy",))
    assert s.other_logp is None and s.stats["entropy"].shape == (2, rollout.response_ids.shape[1])


def test_use_reference_with_lora_gives_the_base_model():
    from peft import LoraConfig, get_peft_model

    base = CausalLMAdapter.tiny(seed=0, max_new_tokens=6)
    r = base.sample(PROMPTS[:2], 2, generator=torch.Generator().manual_seed(0))
    base_logp = base.logprob(r).logp
    lora = CausalLMAdapter.tiny(seed=0, max_new_tokens=6)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        lora.model = get_peft_model(lora.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert lora.has_reference
    policy = lora.logprob(r).logp
    ref = lora.logprob(r, use_reference=True).logp
    torch.testing.assert_close(ref, base_logp, atol=1e-6, rtol=0)
    assert (policy - base_logp).abs().max() > 1e-4
    assert not ref.requires_grad and policy.requires_grad
    # sampling runs through the LoRA model and records its log-probs
    r2 = lora.sample(PROMPTS[:2], 2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lora.logprob(r2).logp, r2.old_logp, atol=1e-5, rtol=0)


def test_use_reference_without_a_reference_is_a_clear_error(adapter, rollout):
    with pytest.raises(ValueError, match="reference model is needed"):
        adapter.logprob(rollout, use_reference=True)


def test_forward_noise_is_the_identity_and_denoise_equals_logprob(adapter, rollout):
    noised = adapter.forward_noise(rollout, 3, generator=torch.Generator().manual_seed(0))
    n, p = rollout.prompt_ids.shape
    assert noised.num_copies == 1 and noised.prompt_len == p
    assert torch.equal(noised.input_ids, torch.cat([rollout.prompt_ids, rollout.response_ids], 1))
    assert torch.equal(noised.noise_mask[0], rollout.response_mask) and noised.noise_mask.shape[0] == 1
    assert torch.equal(noised.n_masked, torch.ones(1, n)) and torch.equal(noised.rates, torch.ones(1, n))
    dl = adapter.denoise_logprob(noised)
    assert dl.shape == (1, n, rollout.response_ids.shape[1]) and dl.requires_grad
    assert torch.equal(dl[0].detach(), adapter.logprob(rollout).logp.detach())


def test_token_strings(adapter, rollout):
    strings = adapter.token_strings(rollout)
    for i, row in enumerate(strings):
        resp = rollout.response_ids[i][rollout.response_mask[i]].tolist()
        assert row == [adapter.tokenizer.convert_ids_to_tokens(t) for t in resp]


# ---------------------------------------------------------------------------------------------- sampling


def test_batched_sampling_with_left_padding_equals_unbatched(adapter):
    g = 2
    seeds = torch.arange(100, 100 + g * len(PROMPTS))
    batched = adapter.sample(PROMPTS, g, seeds=seeds, temperature=0.8, top_p=0.9, eos_token_id=EOS_SET)
    for k, p in enumerate(PROMPTS):
        alone = adapter.sample([p], g, seeds=seeds[k * g : (k + 1) * g], temperature=0.8, top_p=0.9, eos_token_id=EOS_SET)
        for j in range(g):
            i = k * g + j
            assert unpadded(alone, j)[1] == unpadded(batched, i)[1]
            assert alone.completions[j] == batched.completions[i]
            t = int(alone.response_mask[j].sum())
            torch.testing.assert_close(alone.old_logp[j, :t], batched.old_logp[i, :t], atol=1e-5, rtol=0)
    assert len({tuple(unpadded(batched, i)[1]) for i in range(len(PROMPTS) * g)}) > 1


def test_sampling_is_reproducible_with_a_generator(adapter):
    kw = dict(temperature=1.0, top_k=20)
    a = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(7), **kw)
    b = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(7), **kw)
    c = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(8), **kw)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.old_logp, b.old_logp)
    assert torch.equal(a.extras["seeds"], b.extras["seeds"])
    assert not torch.equal(a.response_ids, c.response_ids)
    torch.manual_seed(11)
    d = adapter.sample(PROMPTS, 2, **kw)
    torch.manual_seed(11)
    e = adapter.sample(PROMPTS, 2, **kw)
    assert torch.equal(d.response_ids, e.response_ids)


def test_top_k_1_is_greedy_and_logp_is_unfiltered(adapter):
    prompt = "greedy?"
    r = adapter.sample([prompt], 1, top_k=1, temperature=0.5, max_new_tokens=6, eos_token_id=[2])
    ids = adapter.tokenizer(prompt)["input_ids"]
    resp = []
    for _ in range(r.response_ids.shape[1]):
        with torch.no_grad():
            logits = adapter.model(input_ids=torch.tensor([ids + resp])).logits[0, -1]
        resp.append(int(logits.argmax()))
    assert r.response_ids[0].tolist() == resp
    expected = reference_log_dist(adapter.model, ids, resp, 0.5).gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
    torch.testing.assert_close(r.old_logp[0], expected, atol=1e-5, rtol=0)
    assert torch.all(r.old_logp[0] < -0.01)  # the log-prob of the tempered distribution, not of the filtered one (0)


def test_first_token_frequencies_follow_the_filtered_distribution(adapter):
    """One prompt, 6000 one-token samples (the prompt is prefilled once): every token lies in the top-k / top-p set
    computed here by brute force, and frequencies match the renormalised probabilities within 5 sigma."""
    prompt, temperature, top_p, top_k = "freq", 0.1, 0.93, 12
    r = adapter.sample([prompt], 6000, max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = adapter.model(input_ids=torch.tensor([adapter.tokenizer(prompt)["input_ids"]])).logits[0, -1] / temperature
    probs = torch.softmax(logits.double(), -1)
    order = sorted(range(len(probs)), key=lambda v: -float(logits[v]))[:top_k]  # top-k set
    kept, mass = [], 0.0
    sub = probs[order] / probs[order].sum()  # top-p applies to the top-k-filtered distribution
    for v, pv in zip(order, sub.tolist()):
        if mass >= top_p:
            break
        kept.append(v)
        mass += pv
    target = torch.zeros_like(probs)
    target[kept] = probs[kept] / probs[kept].sum()
    counts = torch.bincount(r.response_ids[:, 0], minlength=len(probs)).double()
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(kept)
    assert len(kept) >= 3
    freq = counts / counts.sum()
    sigma = (target * (1 - target) / 6000).sqrt()
    assert torch.all((freq - target).abs() <= 5 * sigma + 1e-12)


def test_sampling_stops_when_every_row_ended(adapter):
    r = adapter.sample(PROMPTS, 2, eos_token_id=list(range(adapter.vocab_size)), max_new_tokens=10)
    assert r.response_ids.shape[1] == 1 and torch.all(r.extras["terminated"]) and torch.all(r.response_mask)


def test_sampling_restores_training_mode(adapter):
    adapter.model.train()
    try:
        adapter.sample(["x"], 1, max_new_tokens=2)
        assert adapter.model.training
    finally:
        adapter.model.eval()


def brute_force_nucleus(row, top_p):
    """Token ids kept by nucleus filtering: most probable first until the mass reaches top_p, plus exact ties of
    the last one kept."""
    probs = torch.softmax(row.float(), -1).tolist()
    keep, mass = [], 0.0
    for v in sorted(range(len(probs)), key=lambda v: -probs[v]):
        if mass >= top_p:
            break
        keep.append(v)
        mass += probs[v]
    return set(keep) | {v for v in range(len(probs)) if probs[v] == probs[keep[-1]]}


@pytest.mark.parametrize("candidates", [1024, 4])  # 4: the top-k fast path spills into the full sort
def test_filters_against_brute_force(candidates):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(60, 30, generator=gen) * torch.linspace(0.2, 6, 60)[:, None]  # flat to peaked rows
    logits[0, :5] = 2.0  # ties at the top
    logits[1] = -10.0  # top two hold 75% of the mass, then three exact ties: at top_p 0.8 all three are kept
    logits[1, [0, 1]] = 3.0
    logits[1, [3, 7, 9]] = 1.5
    saw_ties_kept = False
    for top_p in (0.05, 0.3, 0.7, 0.8, 0.95):
        got = filter_top_p(logits, top_p, candidates=candidates)
        for row, out in zip(logits, got):
            keep = brute_force_nucleus(row, top_p)
            assert set(torch.nonzero(torch.isfinite(out)).flatten().tolist()) == keep
            assert torch.equal(out[torch.isfinite(out)], row[torch.isfinite(out)])
        saw_ties_kept |= {3, 7, 9} <= brute_force_nucleus(logits[1], top_p) and len(brute_force_nucleus(logits[1], top_p)) == 5
    assert saw_ties_kept
    for k in (1, 3, 29):
        got = filter_top_k(logits, k)
        for row, out in zip(logits, got):
            kth = sorted(row.tolist(), reverse=True)[k - 1]
            assert torch.equal(torch.isfinite(out), row >= kth)
    assert torch.equal(filter_top_k(logits, 0), logits) and torch.equal(filter_top_p(logits, 1.0), logits)


def test_inverse_cdf_draw_hand_computed():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3])
    logits = probs.log().expand(7, 4)  # log 0 = -inf: a filtered token
    u = torch.tensor([0.0, 0.19, 0.2, 0.5, 0.69, 0.7, 0.9999])
    assert inverse_cdf_draw(logits, u).tolist() == [0, 0, 2, 2, 2, 3, 3]


def test_row_uniforms_depend_only_on_the_row_seed():
    a = row_uniforms([5, 6, 7], 4)
    b = row_uniforms([7], 4)
    assert torch.equal(a[2], b[0]) and not torch.equal(a[0], a[1])
    assert torch.equal(a[0], torch.rand(4, generator=torch.Generator().manual_seed(5)))


# ---------------------------------------------------------------------------------------------- checkpoints


def test_save_and_load_round_trip(adapter, rollout, tmp_path):
    adapter.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "mmrl_adapter.json"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pth")) for f in files)
    meta = json.loads((tmp_path / "mmrl_adapter.json").read_text())
    assert meta["family"] == "causal_lm" and meta["generation_defaults"]["max_new_tokens"] == 12
    loaded = CausalLMAdapter.from_pretrained(tmp_path)
    assert loaded.generation_defaults == adapter.generation_defaults
    assert torch.equal(loaded.logprob(rollout).logp, adapter.logprob(rollout).logp)
    for p in PROMPTS:  # the tokenizer survives the trip (a char tokenizer, not the model type's BPE class)
        assert loaded.encode_prompts([p])[0] == adapter.encode_prompts([p])[0]
    kw = dict(generator=torch.Generator().manual_seed(4))
    assert torch.equal(loaded.sample(PROMPTS, 2, **kw).response_ids, adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(4)).response_ids)
    with_ref = CausalLMAdapter.from_pretrained(tmp_path, ref_model=True, max_new_tokens=3)
    assert with_ref.generation_defaults["max_new_tokens"] == 3
    assert not any(p.requires_grad for p in with_ref.ref_model.parameters())
    torch.testing.assert_close(with_ref.logprob(rollout, use_reference=True).logp, adapter.logprob(rollout).logp, atol=0, rtol=0)
    bf16 = CausalLMAdapter.from_pretrained(tmp_path, dtype="bfloat16", ref_model=str(tmp_path))
    assert bf16.model.dtype == torch.bfloat16 and bf16.ref_model.dtype == torch.bfloat16


def test_lora_model_saves_merged(tmp_path):
    from peft import LoraConfig, get_peft_model

    a = CausalLMAdapter.tiny(seed=0, max_new_tokens=5)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        a.model = get_peft_model(a.model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    r = a.sample(PROMPTS[:2], 2, generator=torch.Generator().manual_seed(0))
    a.save_pretrained(tmp_path)
    b = CausalLMAdapter.from_pretrained(tmp_path)
    torch.testing.assert_close(b.logprob(r).logp, a.logprob(r).logp.detach(), atol=1e-5, rtol=0)
    assert hasattr(a.unwrapped, "peft_config")  # the live model is untouched


def test_missing_paths_are_clear_errors(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        CausalLMAdapter.from_pretrained(missing)
    CausalLMAdapter.tiny().save_pretrained(tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="reference model path .*no_ref"):
        CausalLMAdapter.from_pretrained(tmp_path / "m", ref_model=str(tmp_path / "no_ref"))


def test_missing_eos_id_is_a_clear_error():
    a = CausalLMAdapter.tiny()
    model, tok = a.model, a.tokenizer
    model.generation_config.eos_token_id = None
    tok.eos_token = None
    assert tok.eos_token_id is None
    with pytest.raises(ValueError, match="eos_token_id"):
        CausalLMAdapter(model, tok)
    fixed = CausalLMAdapter(model, tok, eos_token_id=2)
    assert fixed.generation_defaults["eos_token_id"] == [2] and fixed.generation_defaults["pad_token_id"] == 0


def test_trust_remote_code_is_passed_only_when_asked(tmp_path):
    a = CausalLMAdapter.tiny(seed=0, max_new_tokens=4)
    a.save_pretrained(tmp_path)
    (tmp_path / "remote_tiny.py").write_text(textwrap.dedent('''
        from transformers import Qwen2Config, Qwen2ForCausalLM

        class TinyRemoteConfig(Qwen2Config):
            model_type = "tiny_remote_qwen2"

        class TinyRemoteForCausalLM(Qwen2ForCausalLM):
            config_class = TinyRemoteConfig
    '''))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="tiny_remote_qwen2", architectures=["TinyRemoteForCausalLM"],
               auto_map={"AutoConfig": "remote_tiny.TinyRemoteConfig", "AutoModelForCausalLM": "remote_tiny.TinyRemoteForCausalLM"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="trust_remote_code"):
        CausalLMAdapter.from_pretrained(tmp_path)
    remote = CausalLMAdapter.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(remote.model).__name__ == "TinyRemoteForCausalLM" and type(remote.model).__module__.startswith("transformers_modules")
    r = a.sample(PROMPTS[:2], 1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(remote.logprob(r).logp, a.logprob(r).logp)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=0.0), "temperature must be a number > 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(eos_token_id=[100000]), r"eos_token_id must be .* \[0, 102\)"),
        (dict(beam_width=2), r"unknown generation option\(s\) \['beam_width'\].*valid: .*max_new_tokens"),
        (dict(negative_instruction=""), "negative_instruction must be a non-empty string"),
    ],
)
def test_bad_generation_options(adapter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        adapter.sample(["x"], 1, **kwargs)


def test_bad_sample_and_logprob_arguments(adapter, rollout):
    with pytest.raises(ValueError, match="group_size must be an integer >= 1"):
        adapter.sample(["x"], 0)
    with pytest.raises(ValueError, match="prompts must be a non-empty list"):
        adapter.sample([], 2)
    with pytest.raises(TypeError, match="must be a string or a list of chat messages"):
        adapter.sample([{"prompt": "x"}], 1)
    with pytest.raises(ValueError, match="seeds must give one seed per response"):
        adapter.sample(["x", "y"], 2, seeds=[1, 2, 3])
    with pytest.raises(ValueError, match="no tokens"):
        adapter.sample([""], 1)
    with pytest.raises(ValueError, match="condition must be 'positive' or 'negative'"):
        adapter.logprob(rollout, condition="neutral")
    with pytest.raises(ValueError, match=r"unknown statistics \['js'\]"):
        adapter.logprob(rollout, stats=("js",))
    with pytest.raises(ValueError, match="stats_against must be"):
        adapter.logprob(rollout, stats=("kl",), stats_against="self")
    with pytest.raises(ValueError, match=r"unknown logprob option\(s\) \['tau'\]"):
        adapter.logprob(rollout, tau=2.0)
    with pytest.raises(ValueError, match="no user message"):
        adapter.sample([[{"role": "system", "content": "s"}]], 1)
    # masked-diffusion estimator options are accepted and change nothing for an exact AR log-prob
    assert torch.equal(adapter.logprob(rollout, estimator="elbo", num_copies=4).logp, adapter.logprob(rollout).logp)


def test_bfloat16_model_samples_and_scores_deterministically():
    a = CausalLMAdapter.tiny(seed=0, max_new_tokens=8)
    a.model.to(torch.bfloat16)
    r = a.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(0), top_p=0.9)
    first, second = a.logprob(r, stats=("entropy",)), a.logprob(r)
    assert first.logp.dtype == torch.float32 and torch.equal(first.logp, second.logp)
    assert torch.isfinite(first.stats["entropy"]).all()
    # bf16 KV-cache decoding and a full bf16 forward agree to bf16 precision
    assert (first.logp - r.old_logp).abs().max() < 0.05


def test_logprob_with_negative_equals_the_two_separate_forwards():
    """GCPO's batched scoring (positive and negative prompts stacked, re-padded to one width) gives the log-probs,
    entropies and parameter gradients of the two separate forwards (`logprob` positive with the gradient,
    `logprob(condition="negative")` without)."""
    from mmrl.models.causal_lm import CausalLMAdapter

    adapter = CausalLMAdapter.tiny(seed=0)
    torch.manual_seed(0)
    rollout = adapter.sample(["say a", "a much longer prompt for the model"], 3, seeds=list(range(6)), max_new_tokens=6)
    assert rollout.neg_prompt_ids.shape[1] != rollout.prompt_ids.shape[1]  # the re-padding is exercised
    params = [p for p in adapter.model.parameters() if p.requires_grad]
    weights = torch.randn(rollout.response_ids.shape, generator=torch.Generator().manual_seed(1))

    pos = adapter.logprob(rollout, stats=("entropy",))
    with torch.no_grad():
        neg = adapter.logprob(rollout, condition="negative").logp
    grads = torch.autograd.grad((pos.logp * weights * rollout.response_mask).sum(), params)
    both, neg_b = adapter.logprob_with_negative(rollout, stats=("entropy",))
    grads_b = torch.autograd.grad((both.logp * weights * rollout.response_mask).sum(), params)

    assert not neg_b.requires_grad
    assert not torch.allclose(pos.logp, neg, atol=1e-3), "the conditions must differ for the test to mean anything"
    torch.testing.assert_close(both.logp, pos.logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(neg_b, neg, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both.stats["entropy"], pos.stats["entropy"], rtol=1e-5, atol=1e-5)
    for g, gb in zip(grads, grads_b):
        torch.testing.assert_close(gb, g, rtol=1e-4, atol=1e-6)
