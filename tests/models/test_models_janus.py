"""Janus-Pro adapter on tiny random `JanusForConditionalGeneration` configs (models/janus.py).

References written here: a cache-free CFG sampler that recomputes every step from scratch on one unpadded row,
a teacher-forced scorer on unpadded rows, the null prompt built as Janus does (`tokens[1:-1] = pad`), and
transformers' own `ClassifierFreeGuidanceLogitsProcessor` and `generate(generation_mode="image")`.
"""
import json

import pytest
import torch
from transformers import ClassifierFreeGuidanceLogitsProcessor, JanusForConditionalGeneration

from mmrl.models import adapter_class, load_policy
from mmrl.models.image_codecs import PaletteCodec, VQCodec
from mmrl.models.janus import JanusAdapter, cfg_logits, janus_ids, sample_from_probs
from mmrl.core.protocol import Policy

PROMPTS = ["a red square", "two blue circles above a green triangle"]


@pytest.fixture(scope="module")
def adapter():
    # a larger init than the default makes conditional and null distributions clearly different
    return JanusAdapter.tiny(seed=0, grid=(4, 5), codebook_size=6, init_std=0.1)


@pytest.fixture(scope="module")
def rollout(adapter):
    return adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- independent references
def unpadded_rows(ids, mask):
    return [row[m].tolist() for row, m in zip(ids, mask.bool())]


def janus_null(row, pad):
    """Janus `generation_inference.py`: tokens[1:-1] = pad (BOS first, <begin_of_image> last)."""
    return [row[0]] + [pad] * (len(row) - 2) + [row[-1]]


@torch.no_grad()
def ref_logits(model, prompt_row, image_row):
    """Generation-head logits [T, V] for one unpadded prompt, teacher-forced, no cache, default positions."""
    p = len(prompt_row)
    emb = model.get_input_embeddings()(torch.tensor([prompt_row]))  # [1, P, D]
    if len(image_row) > 1:
        img = model.prepare_embeddings_for_image_generation(torch.tensor([image_row[:-1]]))  # [1, T-1, D]
        emb = torch.cat([emb, img], 1)
    h = model.model.language_model(inputs_embeds=emb).last_hidden_state[0, p - 1 :]  # [T, D]
    return model.model.generation_head(h)  # [T, V]


def ref_logp(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits.double() / temperature, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@torch.no_grad()
def ref_sample_row(model, prompt_row, null_row, uniforms, n_tokens, scale, temperature):
    """Cache-free CFG sampling of one row: each step reruns the whole prefix for both conditions."""
    image, cond_steps, guided_steps = [], [], []
    for t in range(n_tokens):
        cond = ref_logits(model, prompt_row, image + [0])[-1]  # [V] (the appended 0 is never read)
        unc = ref_logits(model, null_row, image + [0])[-1]
        guided = unc + scale * (cond - unc)
        probs = torch.softmax(guided.double() / temperature, -1)
        cdf = torch.cumsum(probs, 0)
        tok = int((cdf <= float(uniforms[t]) * cdf[-1]).sum())  # first index whose cdf exceeds u * total
        image.append(min(tok, probs.numel() - 1))
        cond_steps.append(cond)
        guided_steps.append(guided)
    return image, torch.stack(cond_steps), torch.stack(guided_steps)


# ---------------------------------------------------------------- protocol, config, prompts
def test_family_lookup_and_protocol(adapter):
    assert adapter_class("janus") is JanusAdapter
    assert isinstance(adapter, Policy)
    assert isinstance(adapter.unwrapped_core, JanusForConditionalGeneration)
    assert adapter.vocab_size == 6 and adapter.ids.num_image_tokens == 20


def test_ids_come_from_the_config(adapter):
    core = adapter.unwrapped_core
    tok = adapter.tokenizer
    ids = janus_ids(core)
    assert ids.pad == tok.pad_token_id and ids.bos == tok.bos_token_id
    assert ids.boi == tok.convert_tokens_to_ids("<begin_of_image>")
    assert ids.num_image_tokens == core.config.vision_config.num_image_tokens == 20
    assert ids.codebook_size == core.config.vq_config.num_embeddings == 6


def test_missing_ids_raise_naming_the_field():
    a = JanusAdapter.tiny(seed=1, grid=(2, 2), codebook_size=4)
    core = a.unwrapped_core
    core.generation_config.boi_token_id = None
    core.generation_config.generation_kwargs = {}
    with pytest.raises(ValueError, match="boi_token_id"):
        janus_ids(core)
    core.generation_config.boi_token_id = 8
    core.generation_config.pad_token_id = None
    core.config.text_config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id"):
        janus_ids(core)


def test_pad_id_is_read_not_hard_coded():
    a = JanusAdapter.tiny(seed=1, grid=(2, 2), codebook_size=4)
    other = a.tokenizer.convert_tokens_to_ids("<end_of_image>")
    a.unwrapped_core.generation_config.pad_token_id = other
    b = JanusAdapter(a.unwrapped_core, a.tokenizer, codec=a.codec)
    r = b.sample(["ab"], 1, generator=torch.Generator().manual_seed(0))
    row = unpadded_rows(r.prompt_ids, r.prompt_mask)[0]
    assert r.neg_prompt_ids[0].tolist() == janus_null(row, other)


def test_prompt_follows_the_janus_t2i_format(adapter, rollout):
    row = unpadded_rows(rollout.prompt_ids, rollout.prompt_mask)[0]
    tok = adapter.tokenizer
    assert tok.convert_ids_to_tokens(row[:2]) == ["<bos>", "<|User|>"]
    assert tok.convert_ids_to_tokens(row[-1:]) == ["<begin_of_image>"]
    assert tok.decode(row[1:-1]) == "<|User|>: a red square\n\n<|Assistant|>:"
    # left padding: the shorter prompt is padded on the left, every row ends with <begin_of_image>
    assert not rollout.prompt_mask[0, 0] and rollout.prompt_mask[2, 0]
    assert (rollout.prompt_ids[:, -1] == adapter.ids.boi).all()


# ---------------------------------------------------------------- the rollout
def test_rollout_layout(adapter, rollout):
    n, t = 4, 20
    assert rollout.response_ids.shape == (n, t) and rollout.response_mask.all()
    assert rollout.group_size == 2 and rollout.num_groups == 2
    assert rollout.prompts == [PROMPTS[0]] * 2 + [PROMPTS[1]] * 2
    assert rollout.extras["grid"] == (4, 5)
    assert rollout.old_logp.shape == (n, t) and rollout.old_logp.dtype == torch.float32
    assert int(rollout.response_ids.min()) >= 0 and int(rollout.response_ids.max()) < 6
    # completions are the codec's pictures of the sampled ids
    assert [im.size for im in rollout.completions] == [(5 * 4, 4 * 4)] * n
    assert torch.equal(adapter.codec.encode(rollout.completions), rollout.response_ids)
    # selecting rows keeps the grid (a tuple) intact
    sub = rollout.select([1, 3])
    assert sub.extras["grid"] == (4, 5) and sub.prompts == [PROMPTS[0], PROMPTS[1]]


def test_negative_condition_is_the_cfg_null_prompt(adapter, rollout):
    pad = adapter.ids.pad
    for i, row in enumerate(unpadded_rows(rollout.prompt_ids, rollout.prompt_mask)):
        neg = rollout.neg_prompt_ids[i][rollout.neg_prompt_mask[i]].tolist()
        assert neg == janus_null(row, pad)
    assert torch.equal(rollout.neg_prompt_mask, rollout.prompt_mask)


def test_sampler_equals_a_cache_free_reference(adapter):
    core = adapter.unwrapped_core
    u = torch.rand(4, 20, generator=torch.Generator().manual_seed(3))
    for score in ("conditional", "guided"):
        r = adapter.sample(PROMPTS, 2, uniforms=u, score=score, cfg_scale=3.0, temperature=0.8)
        for i, row in enumerate(unpadded_rows(r.prompt_ids, r.prompt_mask)):
            image, cond, guided = ref_sample_row(core, row, janus_null(row, adapter.ids.pad), u[i], 20, 3.0, 0.8)
            assert r.response_ids[i].tolist() == image
            expected = ref_logp(cond if score == "conditional" else guided, image, temperature=0.8)
            # float32 rounding of the logits (~1e-6 here: cache vs full recompute, padded vs not) is amplified
            # by up to 2s - 1 in the guided logits
            tol = 1e-5 if score == "conditional" else 1e-5 * (2 * 3.0 - 1)
            torch.testing.assert_close(r.old_logp[i].double(), expected, atol=tol, rtol=0)


def test_logprob_equals_rollout_logp_ratio_one(adapter):
    # "cond" is an alias of "conditional"
    for score in ("cond", "guided"):
        r = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(1), score=score, temperature=0.7)
        s = adapter.logprob(r)
        assert s.logp.requires_grad
        torch.testing.assert_close(s.logp.detach(), r.old_logp, atol=1e-5, rtol=0)
        ratio = torch.exp(s.logp.detach() - r.old_logp)
        assert float((ratio - 1).abs().max()) < 1e-5
        # and against the unpadded teacher-forced reference
        for i, row in enumerate(unpadded_rows(r.prompt_ids, r.prompt_mask)):
            img = r.response_ids[i].tolist()
            cond = ref_logits(adapter.unwrapped_core, row, img)
            if score == "guided":
                cond = cfg_logits(cond, ref_logits(adapter.unwrapped_core, janus_null(row, adapter.ids.pad), img), 5.0)
            torch.testing.assert_close(s.logp[i].detach().double(), ref_logp(cond, img, 0.7), atol=1e-5, rtol=0)


def test_logprob_is_bitwise_deterministic(adapter, rollout):
    mb = rollout.select([0, 3])
    a, b = adapter.logprob(mb), adapter.logprob(mb)
    assert torch.equal(a.logp, b.logp)
    with torch.no_grad():
        c = adapter.logprob(mb)
    assert torch.equal(a.logp.detach(), c.logp)


def test_negative_condition_changes_the_logprobs(adapter, rollout):
    pos = adapter.logprob(rollout).logp.detach()
    neg = adapter.logprob(rollout, condition="negative").logp.detach()
    assert float((pos - neg).abs().max()) > 1e-2
    for i in range(rollout.num_responses):
        row = unpadded_rows(rollout.prompt_ids, rollout.prompt_mask)[i]
        img = rollout.response_ids[i].tolist()
        expected = ref_logp(ref_logits(adapter.unwrapped_core, janus_null(row, adapter.ids.pad), img), img)
        torch.testing.assert_close(neg[i].double(), expected, atol=1e-5, rtol=0)


def test_batched_sampling_equals_unbatched(adapter):
    u = torch.rand(4, 20, generator=torch.Generator().manual_seed(5))
    both = adapter.sample(PROMPTS, 2, uniforms=u)
    for g, prompt in enumerate(PROMPTS):
        alone = adapter.sample([prompt], 2, uniforms=u[2 * g : 2 * g + 2])
        assert torch.equal(alone.response_ids, both.response_ids[2 * g : 2 * g + 2])
        torch.testing.assert_close(alone.old_logp, both.old_logp[2 * g : 2 * g + 2], atol=1e-5, rtol=0)


def test_per_row_seeds_make_a_response_independent_of_its_batch(adapter):
    seeds = [101, 202, 303, 404]
    both = adapter.sample(PROMPTS, 2, seeds=seeds)
    assert both.extras["seeds"].tolist() == seeds
    for g, prompt in enumerate(PROMPTS):
        alone = adapter.sample([prompt], 2, seeds=seeds[2 * g : 2 * g + 2])
        assert torch.equal(alone.response_ids, both.response_ids[2 * g : 2 * g + 2])
        torch.testing.assert_close(alone.old_logp, both.old_logp[2 * g : 2 * g + 2], atol=1e-5, rtol=0)
    # one row on its own, with the same seed, gives the same image
    single = adapter.sample([PROMPTS[1]], 1, seeds=[seeds[3]])
    assert torch.equal(single.response_ids[0], both.response_ids[3])
    # a seeded generator draws the row seeds: reproducible; and seeds in the rollout can be replayed
    a = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(9))
    b = adapter.sample(PROMPTS, 2, seeds=a.extras["seeds"])
    assert torch.equal(a.response_ids, b.response_ids)
    with pytest.raises(ValueError, match="one seed per response"):
        adapter.sample(PROMPTS, 2, seeds=[1, 2, 3])


def test_sampling_is_reproducible_with_a_seed(adapter):
    a = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(11))
    b = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(11))
    c = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(12))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.old_logp, b.old_logp)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_guidance_equals_transformers_cfg_processor(adapter, rollout):
    g = torch.Generator().manual_seed(0)
    cond, unc = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    for s in (1.5, 5.0):
        hf = ClassifierFreeGuidanceLogitsProcessor(s)(torch.zeros(3, 1, dtype=torch.long), torch.cat([cond, unc]))
        torch.testing.assert_close(cfg_logits(cond, unc, s), hf, atol=0, rtol=0)
    # the sampler's guided distribution: transformers' processor on independently computed cond / null logits
    r = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(2), score="guided")
    proc = ClassifierFreeGuidanceLogitsProcessor(5.0)
    for i, row in enumerate(unpadded_rows(r.prompt_ids, r.prompt_mask)):
        img = r.response_ids[i].tolist()
        c = ref_logits(adapter.unwrapped_core, row, img)
        u = ref_logits(adapter.unwrapped_core, janus_null(row, adapter.ids.pad), img)
        guided = proc(torch.zeros(20, 1, dtype=torch.long), torch.cat([c, u]))  # [T, V]
        torch.testing.assert_close(r.old_logp[i].double(), ref_logp(guided, img), atol=1e-5, rtol=0)


@pytest.mark.parametrize("prompts", [["a red square"], PROMPTS])
def test_greedy_matches_transformers_generate(adapter, prompts):
    r = adapter.sample(prompts, 1, do_sample=False, cfg_scale=4.0)
    core = adapter.unwrapped_core
    with torch.no_grad():
        hf = core.generate(input_ids=r.prompt_ids, attention_mask=r.prompt_mask.long(), generation_mode="image",
                           do_sample=False, guidance_scale=4.0)
    assert torch.equal(hf, r.response_ids)


def test_sample_from_probs_draws_the_categorical():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]])
    # hand-computed inverse CDF: cdf = .1 .1 .7 1.0 (uniforms kept off the float32-rounded boundaries)
    u = torch.tensor([0.0, 0.0999, 0.1001, 0.6999, 0.7001, 0.9999])
    got = sample_from_probs(probs.expand(6, 4), u)
    assert got.tolist() == [0, 0, 2, 2, 3, 3]
    u = torch.rand(40000, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(sample_from_probs(probs.expand(40000, 4), u), minlength=4).double() / 40000
    assert counts[1] == 0
    sd = torch.sqrt(probs[0].double() * (1 - probs[0].double()) / 40000)
    assert bool(((counts - probs[0].double()).abs() <= 5 * sd + 1e-12).all())


# ---------------------------------------------------------------- statistics, gradients, WDCE hooks
def test_stats_against_negative_are_the_full_kl(adapter, rollout):
    s = adapter.logprob(rollout, stats=("kl", "h2", "entropy"), stats_against="negative")
    for i, row in enumerate(unpadded_rows(rollout.prompt_ids, rollout.prompt_mask)):
        img = rollout.response_ids[i].tolist()
        lp = torch.log_softmax(ref_logits(adapter.unwrapped_core, row, img).double(), -1)
        lq = torch.log_softmax(ref_logits(adapter.unwrapped_core, janus_null(row, adapter.ids.pad), img).double(), -1)
        kl = (lp.exp() * (lp - lq)).sum(-1)
        h2 = 1 - torch.exp(0.5 * (lp + lq)).sum(-1)
        ent = -(lp.exp() * lp).sum(-1)
        torch.testing.assert_close(s.stats["kl"][i].double(), kl, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s.stats["h2"][i].double(), h2, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s.stats["entropy"][i].double(), ent, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s.other_logp[i].double(), lq.gather(-1, torch.tensor(img)[:, None]).squeeze(-1),
                                   atol=1e-5, rtol=0)
    assert float(s.stats["kl"].min()) >= 0 and float(s.stats["kl"].max()) > 1e-3


def test_entropy_alone_needs_no_reference(adapter, rollout):
    assert adapter.ref_model is None
    s = adapter.logprob(rollout, stats=("entropy",))
    assert s.other_logp is None
    row = unpadded_rows(rollout.prompt_ids, rollout.prompt_mask)[1]
    lp = torch.log_softmax(ref_logits(adapter.unwrapped_core, row, rollout.response_ids[1].tolist()).double(), -1)
    torch.testing.assert_close(s.stats["entropy"][1].double(), -(lp.exp() * lp).sum(-1), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="reference model is needed"):
        adapter.logprob(rollout, stats=("h2",))


def test_stats_against_reference_model():
    a = JanusAdapter.tiny(seed=4, grid=(2, 3), codebook_size=5, init_std=0.1, ref_model=True)
    r = a.sample(["ab", "c"], 2, generator=torch.Generator().manual_seed(0))
    s = a.logprob(r, stats=("h2", "kl"))
    assert float(s.stats["h2"].abs().max()) < 1e-6 and float(s.stats["kl"].abs().max()) < 1e-6
    torch.testing.assert_close(s.other_logp, s.logp.detach(), atol=1e-6, rtol=0)
    with torch.no_grad():
        a.unwrapped_core.model.generation_head.vision_head.bias.add_(torch.linspace(-1, 1, 5))
    s = a.logprob(r, stats=("h2", "kl"))
    assert float(s.stats["h2"].min()) > 1e-3 and float(s.stats["kl"].min()) > 1e-3
    ref = a.logprob(r, use_reference=True)
    torch.testing.assert_close(ref.logp, s.other_logp, atol=1e-6, rtol=0)
    assert not ref.logp.requires_grad


def test_gradients_reach_the_generation_path_only(adapter, rollout):
    core = adapter.unwrapped_core
    core.zero_grad()
    adapter.logprob(rollout.select([0, 2])).logp.sum().backward()
    for mod in (core.model.generation_head, core.model.generation_aligner, core.model.generation_embeddings,
                core.model.language_model):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in mod.parameters())
    for mod in (core.model.vqmodel, core.model.vision_model, core.model.aligner):
        assert not any(p.requires_grad for p in mod.parameters())
    core.zero_grad()


def test_lora_model_scores_and_reference_is_the_base(tmp_path):
    import peft
    a = JanusAdapter.tiny(seed=2, grid=(2, 2), codebook_size=4, init_std=0.1)
    r = a.sample(["ab"], 2, generator=torch.Generator().manual_seed(0))
    cfg = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=True)
    a.model = peft.get_peft_model(a.model, cfg)
    torch.testing.assert_close(a.logprob(r).logp.detach(), r.old_logp, atol=1e-5, rtol=0)  # LoRA B = 0
    with torch.no_grad():
        for name, p in a.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    moved = a.logprob(r).logp.detach()
    assert float((moved - r.old_logp).abs().max()) > 1e-4
    torch.testing.assert_close(a.logprob(r, use_reference=True).logp, r.old_logp, atol=1e-5, rtol=0)
    # sampling runs the LoRA-adapted model, and its log-probs are the ones logprob recomputes
    r2 = a.sample(["ab"], 2, seeds=[5, 6])
    torch.testing.assert_close(a.logprob(r2).logp.detach(), r2.old_logp, atol=1e-5, rtol=0)
    with a.unwrapped.disable_adapter():
        base = a.sample(["ab"], 2, seeds=[5, 6])
    assert float((base.old_logp - r2.old_logp).abs().max()) > 1e-4
    # saved merged: a plain Janus checkpoint that scores like the LoRA model
    a.save_pretrained(tmp_path / "merged")
    b = JanusAdapter.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in b.model.named_parameters())
    torch.testing.assert_close(b.logprob(r2).logp.detach(), r2.old_logp, atol=1e-5, rtol=0)


def test_forward_noise_is_identity_and_denoise_is_teacher_forced(adapter, rollout):
    nb = adapter.forward_noise(rollout, 3)
    assert nb.num_copies == 1 and nb.noise_mask.shape == (1, 4, 20) and nb.noise_mask.all()
    assert torch.equal(nb.n_masked, torch.ones(1, 4)) and torch.equal(nb.rates, torch.ones(1, 4))
    assert torch.equal(nb.input_ids[:, nb.prompt_len :], rollout.response_ids)
    out = adapter.denoise_logprob(nb)
    assert out.shape == (1, 4, 20)
    torch.testing.assert_close(out[0].detach(), rollout.old_logp, atol=1e-5, rtol=0)


def test_token_strings_name_codebook_ids(adapter, rollout):
    strings = adapter.token_strings(rollout)
    assert len(strings) == 4 and strings[0][0] == f"<img:{int(rollout.response_ids[0, 0])}>"


# ---------------------------------------------------------------- tiny configurations, codecs, persistence
@pytest.mark.parametrize("grid,k", [((12, 12), 8), ((6, 10), 16), ((8, 8), 12)])
def test_tiny_grid_and_codebook_are_configurable(grid, k):
    a = JanusAdapter.tiny(seed=0, grid=grid, codebook_size=k, hidden_size=16, num_layers=1)
    assert isinstance(a.unwrapped_core, JanusForConditionalGeneration)
    assert a.ids.num_image_tokens == grid[0] * grid[1] and a.vocab_size == k
    assert a.codec.grid == grid and a.codec.codebook_size == k
    assert a.unwrapped_core.model.generation_head.vision_head.out_features == k
    r = a.sample(["x"], 1, generator=torch.Generator().manual_seed(0))
    assert r.response_ids.shape == (1, grid[0] * grid[1])
    assert r.completions[0].size == (grid[1] * 4, grid[0] * 4)


def test_tiny_with_own_palette_and_vq_codec():
    pal = [(153, 153, 153), (255, 0, 0), (0, 0, 255)]
    a = JanusAdapter.tiny(seed=0, grid=(3, 3), palette=pal, cell_px=2)
    assert a.vocab_size == 3 and a.codec.palette == pal
    v = JanusAdapter.tiny(seed=0, grid=(3, 3), codebook_size=5, codec="vq")
    assert isinstance(v.codec, VQCodec)
    r = v.sample(["x"], 2, generator=torch.Generator().manual_seed(0))
    assert [im.size for im in r.completions] == [(6, 6)] * 2  # 3 patches x 2 ** (len([1, 1]) - 1)
    with pytest.raises(ValueError, match="square"):
        JanusAdapter.tiny(grid=(3, 4), codec="vq")


def test_codec_must_fit_the_model():
    a = JanusAdapter.tiny(seed=0, grid=(2, 2), codebook_size=4)
    with pytest.raises(ValueError, match="num_image_tokens"):
        JanusAdapter(a.unwrapped_core, a.tokenizer, codec=PaletteCodec.default(4, grid=(3, 3)))
    with pytest.raises(ValueError, match="num_embeddings"):
        JanusAdapter(a.unwrapped_core, a.tokenizer, codec=PaletteCodec.default(5, grid=(2, 2)))


def test_bad_generation_options_are_named(adapter):
    with pytest.raises(ValueError, match="group_size"):
        adapter.sample(PROMPTS, 0)
    with pytest.raises(ValueError, match="top_k"):
        adapter.sample(PROMPTS, 1, top_k=3)
    with pytest.raises(ValueError, match="'conditional', 'guided'"):
        adapter.sample(PROMPTS, 1, score="both")
    with pytest.raises(ValueError, match="temperature"):
        adapter.sample(PROMPTS, 1, temperature=0)
    with pytest.raises(TypeError, match="str"):
        adapter.sample([{"text": "x"}], 1)
    with pytest.raises(ValueError, match=r"\[2, 20\]"):
        adapter.sample(PROMPTS[:1], 2, uniforms=torch.rand(2, 7))
    with pytest.raises(ValueError, match="condition"):
        adapter.logprob(adapter.sample(PROMPTS[:1], 1), condition="neutral")


def test_save_and_load_round_trip(tmp_path, adapter):
    adapter.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "mmrl_adapter.json").read_text())
    assert saved["family"] == "janus" and saved["codec"]["type"] == "palette"
    assert list((tmp_path / "ckpt").glob("*.safetensors"))
    b = load_policy("janus", str(tmp_path / "ckpt"), ref_model=True, temperature=0.9)
    assert isinstance(b, JanusAdapter) and b.generation_defaults["temperature"] == 0.9
    assert b.codec.config() == adapter.codec.config() and b.ids == adapter.ids
    u = torch.rand(2, 20, generator=torch.Generator().manual_seed(0))
    x, y = adapter.sample(PROMPTS[:1], 2, uniforms=u), b.sample(PROMPTS[:1], 2, uniforms=u, temperature=1.0)
    assert torch.equal(x.prompt_ids, y.prompt_ids) and torch.equal(x.response_ids, y.response_ids)
    torch.testing.assert_close(x.old_logp, y.old_logp, atol=1e-6, rtol=0)
    assert b.ref_model is not None and not any(p.requires_grad for p in b.ref_model.parameters())


def test_loading_errors_name_what_is_missing(tmp_path, adapter):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        JanusAdapter.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        JanusAdapter.from_pretrained(tmp_path / "empty")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="'llama'"):
        JanusAdapter.from_pretrained(tmp_path / "llama")
    with pytest.raises(Exception, match="unknown model family"):
        load_policy("jannus", str(tmp_path / "llama"))
    adapter.save_pretrained(tmp_path / "ck")
    meta = json.loads((tmp_path / "ck" / "mmrl_adapter.json").read_text())
    (tmp_path / "ck" / "mmrl_adapter.json").write_text(json.dumps({**meta, "family": "vlm"}))
    with pytest.raises(ValueError, match="'vlm'"):
        JanusAdapter.from_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "mmrl_adapter.json").write_text(json.dumps(meta))
    gen = json.loads((tmp_path / "ck" / "generation_config.json").read_text())
    gen.pop("boi_token_id", None)
    gen.pop("generation_kwargs", None)
    (tmp_path / "ck" / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(ValueError, match="boi_token_id"):
        JanusAdapter.from_pretrained(tmp_path / "ck")


def test_old_logp_is_temperature_scaled(adapter):
    r2 = adapter.sample(PROMPTS[:1], 1, uniforms=torch.full((1, 20), 0.5), temperature=2.0)
    row = unpadded_rows(r2.prompt_ids, r2.prompt_mask)[0]
    img = r2.response_ids[0].tolist()
    expected = ref_logp(ref_logits(adapter.unwrapped_core, row, img), img, 2.0)
    torch.testing.assert_close(r2.old_logp[0].double(), expected, atol=1e-5, rtol=0)
    at_one = ref_logp(ref_logits(adapter.unwrapped_core, row, img), img, 1.0)
    assert float((r2.old_logp[0].double() - at_one).abs().max()) > 1e-2
    torch.testing.assert_close(adapter.logprob(r2).logp[0].detach(), r2.old_logp[0], atol=1e-5, rtol=0)


def test_a_given_negative_prompt_of_another_width_is_used(adapter, rollout):
    ids = adapter.ids
    short = [ids.bos, ids.pad, ids.boi]
    r = rollout.select([0, 2])
    r.neg_prompt_ids = torch.tensor([short, short])
    r.neg_prompt_mask = torch.ones(2, 3, dtype=torch.bool)
    neg = adapter.logprob(r, condition="negative").logp.detach()
    guided = adapter.logprob(r, score="guided").logp.detach()
    for i, row in enumerate(unpadded_rows(r.prompt_ids, r.prompt_mask)):
        img = r.response_ids[i].tolist()
        lq = ref_logits(adapter.unwrapped_core, short, img)
        torch.testing.assert_close(neg[i].double(), ref_logp(lq, img), atol=1e-5, rtol=0)
        lg = cfg_logits(ref_logits(adapter.unwrapped_core, row, img), lq, 5.0)
        torch.testing.assert_close(guided[i].double(), ref_logp(lg, img), atol=1e-5, rtol=0)
