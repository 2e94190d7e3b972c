"""VLMAdapter on a tiny random Qwen2_5_VLForConditionalGeneration (the real class; also Qwen2-VL) with an offline
processor (char tokenizer + Qwen vision tokens, Qwen2VLImageProcessor with 4-pixel patches).

The reference scores each response alone: the processor on that prompt by itself, prompt + response unpadded, and
the model's own forward computing its 3-D RoPE positions (no attention mask, no position ids, full logits).
"""
import json
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from mmrl.models import adapter_class
from mmrl.models.vlm import VISION_TOKENS, VLMAdapter, multimodal_messages
from mmrl.core.protocol import DEFAULT_NEGATIVE_INSTRUCTION, Policy


def noise_image(w, h, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


IMG_A, IMG_B, IMG_C = noise_image(16, 16, 0), noise_image(24, 16, 1), noise_image(32, 24, 2)
PROMPTS = [
    {"prompt": "What colour?", "images": [IMG_A]},
    {"prompt": [{"role": "system", "content": "Look."}, {"role": "user", "content": "Compare the two."}], "images": [IMG_B, IMG_C]},
    {"prompt": [{"role": "user", "content": [{"type": "text", "text": "before"}, {"type": "image"}, {"type": "text", "text": "after"}]}], "image": IMG_B},
    "no image here, and a longer text to pad the others",
]
IMAGE_TOKENS = [4, 6 + 12, 6, 0]  # (w * h) / 64 per image: 4-pixel patches merged 2 x 2
EOS_SET = [2, 20, 21, 22, 23, 24, 25, 26, 27, 28]


@pytest.fixture(scope="module")
def adapter():
    return VLMAdapter.tiny(seed=0, max_new_tokens=10)


@pytest.fixture(scope="module")
def rollout(adapter):
    return adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(1), temperature=0.8, eos_token_id=EOS_SET)


def processed_alone(adapter, prompt, negative=False):
    """The processor run on one prompt by itself: (ids list, processor outputs)."""
    body, images = (prompt["prompt"], prompt.get("images", [prompt.get("image")] if "image" in prompt else [])) if isinstance(prompt, dict) else (prompt, [])
    messages = multimodal_messages(body, len(images))
    if negative:
        messages = [dict(m) for m in messages]
        last = messages[-1]
        content = last["content"]
        if isinstance(content, str):
            last["content"] = content + "\n" + DEFAULT_NEGATIVE_INSTRUCTION
        elif content[-1].get("type") == "text":
            last["content"] = content[:-1] + [{"type": "text", "text": content[-1]["text"] + "\n" + DEFAULT_NEGATIVE_INSTRUCTION}]
        else:
            last["content"] = list(content) + [{"type": "text", "text": DEFAULT_NEGATIVE_INSTRUCTION}]
    text = adapter.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = adapter.processor(text=[text], images=images or None, return_tensors="pt")
    return out["input_ids"][0].tolist(), out


@torch.no_grad()
def reference_log_dist(model, adapter, prompt, response, temperature, negative=False):
    """[T, V] log softmax(logits / temperature) predicting each response token, scored alone and unpadded."""
    ids, out = processed_alone(adapter, prompt, negative)
    full = torch.tensor([ids + response])
    kwargs = {}
    if "pixel_values" in out:
        mm = torch.cat([out["mm_token_type_ids"], torch.zeros(1, len(response), dtype=out["mm_token_type_ids"].dtype)], 1)
        kwargs = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"], mm_token_type_ids=mm)
    model.model.rope_deltas = None
    logits = model(input_ids=full, **kwargs).logits[0].float()  # [L, V]
    p = len(ids)
    return torch.log_softmax(logits[p - 1 : p - 1 + len(response)] / temperature, -1)


def valid_response(rollout, i):
    return rollout.response_ids[i][rollout.response_mask[i]].tolist()


def reference_logp(model, adapter, rollout, temperature, negative=False):
    out = torch.zeros(rollout.response_ids.shape)
    for i in range(rollout.num_responses):
        resp = valid_response(rollout, i)
        lp = reference_log_dist(model, adapter, rollout.prompts[i], resp, temperature, negative)
        out[i, : len(resp)] = lp.gather(-1, torch.tensor(resp)[:, None]).squeeze(-1)
    return out


# ---------------------------------------------------------------------------------------------- layout


def test_is_a_policy_and_registered(adapter):
    assert isinstance(adapter, Policy)
    assert adapter_class("vlm") is VLMAdapter
    assert type(adapter.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert adapter.vocab_size == len(adapter.tokenizer)
    assert sum(p.numel() for p in adapter.model.parameters()) < 100_000


def test_prompts_images_and_pixel_extras(adapter, rollout):
    image_id = adapter.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    pixels, grids = rollout.extras["pixel_values"], rollout.extras["image_grid_thw"]
    assert len(pixels) == len(grids) == rollout.num_responses == 8
    for g, p in enumerate(PROMPTS):
        for j in (2 * g, 2 * g + 1):
            ids = rollout.prompt_ids[j][rollout.prompt_mask[j]].tolist()
            assert ids == processed_alone(adapter, p)[0]
            assert ids.count(image_id) == IMAGE_TOKENS[g]
            neg = rollout.neg_prompt_ids[j][rollout.neg_prompt_mask[j]].tolist()
            assert neg == processed_alone(adapter, p, negative=True)[0]
            assert neg.count(image_id) == IMAGE_TOKENS[g]  # the negative condition keeps the images
            assert DEFAULT_NEGATIVE_INSTRUCTION in adapter.tokenizer.decode(neg)
        if IMAGE_TOKENS[g]:
            assert pixels[2 * g] is pixels[2 * g + 1]  # the group shares one tensor
            out = processed_alone(adapter, p)[1]
            assert torch.equal(pixels[2 * g], out["pixel_values"]) and torch.equal(grids[2 * g], out["image_grid_thw"])
        else:
            assert pixels[2 * g] is None and grids[2 * g] is None
    sub = rollout.select([3, 6])
    assert sub.extras["pixel_values"][0] is pixels[3] and sub.extras["pixel_values"][1] is None


def test_string_prompt_images_go_first_in_the_user_turn(adapter):
    ids, _ = adapter.encode_prompts([{"prompt": "hi", "images": [IMG_A]}])
    assert adapter.tokenizer.decode(ids[0]) == "<|user|><|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>hi\n<|assistant|>"


def test_vision_tokens_are_never_sampled(adapter):
    r = adapter.sample(PROMPTS[:2], 64, max_new_tokens=8, temperature=3.0, generator=torch.Generator().manual_seed(0))
    vision = {adapter.tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    assert not vision & set(r.response_ids[r.response_mask].tolist())


# ---------------------------------------------------------------------------------------------- scoring


def test_logprob_equals_rollout_logp_and_the_reference(adapter, rollout):
    scores = adapter.logprob(rollout)
    torch.testing.assert_close(scores.logp, rollout.old_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores.logp, reference_logp(adapter.model, adapter, rollout, 0.8), atol=1e-5, rtol=0)
    assert torch.all(scores.logp[~rollout.response_mask] == 0)


def test_ratio_is_exactly_one_on_a_micro_batch(adapter, rollout):
    mb = rollout.select([5, 2, 7])
    with torch.no_grad():
        old = adapter.logprob(mb).logp
    new = adapter.logprob(mb).logp
    ratio = torch.exp(new - old)
    assert torch.equal(ratio.detach(), torch.ones_like(ratio))
    new.sum().backward()  # gradients reach the vision tower through the image features
    assert adapter.model.model.visual.patch_embed.proj.weight.grad is not None
    adapter.model.zero_grad(set_to_none=True)
    torch.testing.assert_close(old, adapter.logprob(rollout).logp[[5, 2, 7]].detach(), atol=1e-6, rtol=0)


def test_negative_condition_changes_logprobs(adapter, rollout):
    pos = adapter.logprob(rollout).logp
    neg = adapter.logprob(rollout, condition="negative").logp
    torch.testing.assert_close(neg, reference_logp(adapter.model, adapter, rollout, 0.8, negative=True), atol=1e-5, rtol=0)
    assert (neg - pos).abs().max() > 1e-3


def test_statistics_match_an_unchunked_computation(adapter, rollout):
    with_ref = VLMAdapter(adapter.model, adapter.processor, ref_model=VLMAdapter.tiny(seed=3).model)
    mb = rollout.select([0, 3, 5, 6])
    vs_ref = with_ref.logprob(mb, stats=("h2", "entropy", "ref_entropy"))
    vs_neg = with_ref.logprob(mb, stats=("kl",), stats_against="negative")
    for k in range(mb.num_responses):
        resp = valid_response(mb, k)
        t = len(resp)
        lp = reference_log_dist(adapter.model, adapter, mb.prompts[k], resp, 0.8)
        lq = reference_log_dist(with_ref.ref_model, adapter, mb.prompts[k], resp, 0.8)
        ln = reference_log_dist(adapter.model, adapter, mb.prompts[k], resp, 0.8, negative=True)
        p, q = lp.exp(), lq.exp()
        torch.testing.assert_close(vs_ref.stats["h2"][k, :t], 1 - (p * q).sqrt().sum(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(vs_ref.stats["entropy"][k, :t], -(p * lp).sum(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vs_ref.stats["ref_entropy"][k, :t], -(q * lq).sum(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vs_neg.stats["kl"][k, :t], (p * (lp - ln)).sum(-1), atol=1e-5, rtol=0)
        idx = torch.tensor(resp)[:, None]
        torch.testing.assert_close(vs_ref.other_logp[k, :t], lq.gather(-1, idx).squeeze(-1), atol=1e-5, rtol=0)
        torch.testing.assert_close(vs_neg.other_logp[k, :t], ln.gather(-1, idx).squeeze(-1), atol=1e-5, rtol=0)


def test_use_reference_with_lora_gives_the_base_model(rollout):
    from peft import LoraConfig, get_peft_model

    base = VLMAdapter.tiny(seed=0)
    base_logp = base.logprob(rollout).logp.detach()
    lora = VLMAdapter.tiny(seed=0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        lora.model = get_peft_model(lora.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    torch.testing.assert_close(lora.logprob(rollout, use_reference=True).logp, base_logp, atol=1e-6, rtol=0)
    assert (lora.logprob(rollout).logp.detach() - base_logp).abs().max() > 1e-4
    r = lora.sample(PROMPTS[:2], 2, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(lora.logprob(r).logp, r.old_logp, atol=1e-5, rtol=0)


def test_forward_noise_is_the_identity_and_denoise_equals_logprob(adapter, rollout):
    noised = adapter.forward_noise(rollout, 2)
    assert noised.num_copies == 1 and torch.equal(noised.noise_mask[0], rollout.response_mask)
    assert noised.extras["pixel_values"] is not rollout.extras and len(noised.extras["pixel_values"]) == rollout.num_responses
    dl = adapter.denoise_logprob(noised)
    assert torch.equal(dl[0].detach(), adapter.logprob(rollout).logp.detach())


def test_token_strings(adapter, rollout):
    for i, row in enumerate(adapter.token_strings(rollout)):
        assert row == [adapter.tokenizer.convert_ids_to_tokens(t) for t in valid_response(rollout, i)]


# ---------------------------------------------------------------------------------------------- sampling


def test_batched_sampling_with_left_padding_equals_unbatched(adapter):
    seeds = torch.arange(50, 50 + 2 * len(PROMPTS))
    batched = adapter.sample(PROMPTS, 2, seeds=seeds, top_p=0.95, eos_token_id=EOS_SET)
    for k, p in enumerate(PROMPTS):
        alone = adapter.sample([p], 2, seeds=seeds[2 * k : 2 * k + 2], top_p=0.95, eos_token_id=EOS_SET)
        for j in range(2):
            assert valid_response(alone, j) == valid_response(batched, 2 * k + j)
            t = len(valid_response(alone, j))
            torch.testing.assert_close(alone.old_logp[j, :t], batched.old_logp[2 * k + j, :t], atol=1e-5, rtol=0)


def test_sampling_is_reproducible_with_a_generator(adapter):
    a = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(9))
    b = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(9))
    c = adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(10))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.old_logp, b.old_logp)
    assert not torch.equal(a.response_ids, c.response_ids)


def test_qwen2_vl_model_class():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    processor = VLMAdapter.tiny_processor()
    tok = processor.tokenizer
    ids = {n: tok.convert_tokens_to_ids(t) for n, t in zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"), VISION_TOKENS)}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, mlp_ratio=2, num_heads=2, patch_size=4, spatial_merge_size=2, temporal_patch_size=2),
        **ids,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    a = VLMAdapter(model, processor, max_new_tokens=6)
    r = a.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(0), temperature=0.9)
    torch.testing.assert_close(a.logprob(r).logp, r.old_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.logprob(r).logp, reference_logp(model, a, r, 0.9), atol=1e-5, rtol=0)


def test_qwen3_vl_model_class(tmp_path):
    """Qwen3-VL (learned absolute vision positions, interleaved 3-D RoPE, a DeepStack layer): sampling and scoring
    agree with the model's own unpadded forward, and a checkpoint loads back as the same class and scores."""
    a = VLMAdapter.tiny(seed=0, max_new_tokens=6, model_type="qwen3_vl",
                        vision_config={"depth": 2, "deepstack_visual_indexes": [0]})
    assert type(a.model).__name__ == "Qwen3VLForConditionalGeneration"
    r = a.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(0), temperature=0.9, eos_token_id=EOS_SET)
    torch.testing.assert_close(a.logprob(r).logp, r.old_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.logprob(r).logp, reference_logp(a.model, a, r, 0.9), atol=1e-5, rtol=0)
    a.save_pretrained(tmp_path)
    loaded = VLMAdapter.from_pretrained(tmp_path)
    assert type(loaded.model).__name__ == "Qwen3VLForConditionalGeneration"
    assert torch.equal(loaded.logprob(r).logp, a.logprob(r).logp)


def test_qwen3_vl_image_features_depend_on_the_column():
    """What Qwen3-VL adds for the tiny shapes_vqa world: absolute positions in the image features. A uniform image
    through a vision tower without blocks (patch embedding, positions, 2 x 2 merge): every image token of
    Qwen2.5-VL is the same vector (its vision positions are relative, RoPE inside the blocks), Qwen3-VL's differ
    from token to token (learned absolute position embeddings)."""
    uniform = Image.fromarray(np.full((16, 16, 3), 200, dtype=np.uint8))
    for model_type, extra in (("qwen2_5_vl", {"fullatt_block_indexes": []}), ("qwen3_vl", {})):
        a = VLMAdapter.tiny(seed=0, model_type=model_type, vision_config={"depth": 0, **extra})
        out = a.processor.image_processor(images=[uniform], return_tensors="pt")
        feats = a.model.model.visual(out["pixel_values"], grid_thw=out["image_grid_thw"])
        tokens = feats.pooler_output if hasattr(feats, "pooler_output") else feats  # [4, D]: 16 px -> 2 x 2 tokens
        spread = (tokens - tokens[0]).abs().amax().item()
        assert (spread > 1e-3) == (model_type == "qwen3_vl"), (model_type, spread)


# ---------------------------------------------------------------------------------------------- checkpoints


def test_save_and_load_round_trip(adapter, rollout, tmp_path):
    adapter.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "processor_config.json", "tokenizer.json", "mmrl_adapter.json"} <= files
    assert json.loads((tmp_path / "mmrl_adapter.json").read_text())["family"] == "vlm"
    loaded = VLMAdapter.from_pretrained(tmp_path)
    assert type(loaded.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert loaded.generation_defaults == adapter.generation_defaults
    assert torch.equal(loaded.logprob(rollout).logp, adapter.logprob(rollout).logp)
    assert loaded.encode_prompts(PROMPTS)[0] == adapter.encode_prompts(PROMPTS)[0]
    again = loaded.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(4))
    assert torch.equal(again.response_ids, adapter.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(4)).response_ids)
    with pytest.raises(ValueError, match="holds a 'vlm' adapter"):
        adapter_class("causal_lm").from_pretrained(tmp_path)


def test_trust_remote_code_is_passed_only_when_asked(adapter, rollout, tmp_path):
    adapter.save_pretrained(tmp_path)
    (tmp_path / "remote_vl.py").write_text(textwrap.dedent('''
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

        class TinyRemoteVLConfig(Qwen2_5_VLConfig):
            model_type = "tiny_remote_qwen2_5_vl"

        class TinyRemoteVL(Qwen2_5_VLForConditionalGeneration):
            config_class = TinyRemoteVLConfig
    '''))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="tiny_remote_qwen2_5_vl", architectures=["TinyRemoteVL"],
               auto_map={"AutoConfig": "remote_vl.TinyRemoteVLConfig", "AutoModelForImageTextToText": "remote_vl.TinyRemoteVL"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    # transformers converts the saved (original Qwen) weight names back only for its own model types: a remote class
    # reads the in-memory names
    save_file({k: v.detach().clone().contiguous() for k, v in adapter.model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="trust_remote_code"):
        VLMAdapter.from_pretrained(tmp_path)
    remote = VLMAdapter.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(remote.model).__name__ == "TinyRemoteVL"
    torch.testing.assert_close(remote.logprob(rollout).logp, adapter.logprob(rollout).logp, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- bad input


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere_vl"):
        VLMAdapter.from_pretrained(tmp_path / "nowhere_vl")


def test_config_without_a_usable_image_token_id_is_a_clear_error():
    a = VLMAdapter.tiny()
    a.model.config.image_token_id = 151655  # what a config lacking the field gets: Qwen's default, outside this vocabulary
    with pytest.raises(ValueError, match=r"image_token_id is 151655, not an id of its vocabulary \[0, 106\)"):
        VLMAdapter(a.model, a.processor)


def test_processor_and_config_disagreeing_on_the_image_token_is_an_error():
    a = VLMAdapter.tiny()
    a.model.config.image_token_id = 8
    with pytest.raises(ValueError, match="image token id 7 differs from the model config's image_token_id 8"):
        VLMAdapter(a.model, a.processor)


def test_other_model_types_are_rejected():
    from mmrl.models.causal_lm import CausalLMAdapter

    lm = CausalLMAdapter.tiny()
    with pytest.raises(ValueError, match=r"supports model types \['qwen2_5_vl', 'qwen2_vl', 'qwen3_vl'\].*'qwen2'"):
        VLMAdapter(lm.model, VLMAdapter.tiny_processor())
    with pytest.raises(TypeError, match="needs a processor"):
        VLMAdapter(lm.model, lm.tokenizer)


def test_bad_prompts(adapter):
    with pytest.raises(ValueError, match="needs a 'prompt' key"):
        adapter.sample([{"images": [IMG_A]}], 1)
    with pytest.raises(ValueError, match="has both 'images' and 'image'"):
        adapter.sample([{"prompt": "x", "images": [IMG_A], "image": IMG_B}], 1)
    with pytest.raises(ValueError, match=r"1 image block\(s\) but 2 image\(s\)"):
        adapter.sample([{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}], "images": [IMG_A, IMG_B]}], 1)
    with pytest.raises(TypeError, match="a vlm prompt must be"):
        adapter.sample([{"prompt": 3, "images": []}], 1)


def test_bfloat16_model_samples_and_scores_deterministically():
    a = VLMAdapter.tiny(seed=0, max_new_tokens=8)
    a.model.to(torch.bfloat16)
    r = a.sample(PROMPTS, 2, generator=torch.Generator().manual_seed(0), top_p=0.9)
    first, second = a.logprob(r), a.logprob(r)
    assert torch.equal(first.logp, second.logp)
    assert (first.logp - r.old_logp).abs().max() < 0.05
