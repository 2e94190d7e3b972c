"""The masked_image family (aMUSEd through diffusers) on tiny random real classes: the sampler against diffusers'
own `AmusedPipeline`, the schedule against hand-computed counts, the estimators against direct computations, WDCE
noise, persistence in the snapshot layout and the errors on bad input."""
import math

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from mmrl.models.maskgit import mask_ratio, num_to_mask, remask_temperatures, state_at_step  # noqa: E402
from mmrl.models.masked_image import MaskedImageAdapter, tiny_amused_components  # noqa: E402

WORDS = ["a", "red", "blue", "square", "circle"]
PROMPTS = ["a red square", "a blue circle", "a circle"]


@pytest.fixture(scope="module")
def parts():
    return tiny_amused_components(seed=3, words=WORDS, grid=4, codebook_size=8, init_std=0.3)


@pytest.fixture(scope="module")
def policy(parts):
    return MaskedImageAdapter(parts["transformer"], parts["vqvae"], parts["text_encoder"], parts["tokenizer"],
                              mask_token_id=parts["scheduler"].config.mask_token_id, num_steps=6, cfg_scale=3.0)


@pytest.mark.parametrize("remask_temperature", [0, (2.0, 0.0)])
@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_sampler_matches_amused_pipeline_token_for_token(parts, policy, remask_temperature, cfg_scale):
    from diffusers import AmusedPipeline

    pipe = AmusedPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    seeds = [5, 6, 7]
    ref = torch.cat([pipe(p, num_inference_steps=6, guidance_scale=cfg_scale, temperature=remask_temperature,
                          generator=torch.Generator().manual_seed(s), output_type="latent").images.reshape(1, -1)
                     for p, s in zip(PROMPTS, seeds)])  # [3, 16]
    ro = policy.sample(PROMPTS, 1, seeds=seeds, cfg_scale=cfg_scale, remask_temperature=remask_temperature)
    assert torch.equal(ro.response_ids, ref)
    assert len(set(map(tuple, ref.tolist()))) == 3  # the images differ (a real check, not a degenerate model)
    if remask_temperature == 0 and cfg_scale == 3.0:  # decoded through the VQ model as the pipeline decodes
        img = pipe(PROMPTS[0], num_inference_steps=6, guidance_scale=cfg_scale, temperature=0,
                   generator=torch.Generator().manual_seed(5)).images[0]
        assert np.array_equal(np.asarray(img), np.asarray(ro.completions[0]))


def test_schedule_reveals_the_cosine_counts(policy):
    # T = 16, S = 4: masked after each step floor(16 cos(pi/2 (s+1)/4)) = 14, 11, 6, then 0 -> reveals 2, 3, 5, 6
    assert [int(num_to_mask(torch.tensor([16 - k]), 16, mask_ratio(s, 4))[0]) for s, k in [(0, 0), (1, 2), (2, 5)]] == [14, 11, 6]
    assert math.isclose(float(mask_ratio(1, 4)), math.cos(math.pi / 4), rel_tol=1e-6)
    assert remask_temperatures(3, (2.0, 0.0)).tolist() == [2.0, 1.0, 0.0]
    ro = policy.sample(PROMPTS, 2, seeds=list(range(6)), num_steps=4)
    counts = torch.stack([(ro.extras["order"] == s).sum(-1) for s in range(4)], -1)  # [N, S]
    assert counts.tolist() == [[2, 3, 5, 6]] * 6


def test_state_at_step_by_hand():
    tokens = torch.tensor([[4, 5, 6, 7]])
    order = torch.tensor([[1, 0, 2, 1]])
    assert state_at_step(tokens, order, 0, 9).tolist() == [[9, 9, 9, 9]]
    assert state_at_step(tokens, order, 1, 9).tolist() == [[9, 5, 9, 9]]
    assert state_at_step(tokens, order, 2, 9).tolist() == [[4, 5, 9, 7]]


@pytest.mark.parametrize("score", ["conditional", "guided"])
def test_per_step_logprob_reproduces_the_sampler(policy, score):
    ro = policy.sample(PROMPTS, 2, seeds=list(range(6)), score=score, temperature=0.7)
    lp = policy.logprob(ro, estimator="per_step").logp.detach()
    assert torch.allclose(lp, ro.old_logp, atol=1e-5)
    assert (lp < 0).all()
    # by hand for one token: the state of its reveal step, the scored logits, softmax at the rollout temperature
    i, d = 1, 5
    s = int(ro.extras["order"][i, d])
    state = state_at_step(ro.response_ids[i:i + 1], ro.extras["order"][i:i + 1], s, policy.mask_token_id)
    pos = policy.encode_text(ro.prompt_ids[i:i + 1])
    neg = policy.encode_text(ro.neg_prompt_ids[i:i + 1])
    with torch.no_grad():
        cond = policy.image_logits(policy.model, state, pos)[0, d]
        uncond = policy.image_logits(policy.model, state, neg)[0, d]
    logits = uncond + 3.0 * (cond - uncond) if score == "guided" else cond
    want = torch.log_softmax(logits / 0.7, -1)[ro.response_ids[i, d]]
    assert float(lp[i, d]) == pytest.approx(float(want), abs=1e-5)


def test_mean_field_negative_condition_and_stats(policy):
    ro = policy.sample(PROMPTS, 2, seeds=list(range(6)))
    mf = policy.logprob(ro, estimator="mean_field").logp
    masked = torch.full_like(ro.response_ids, policy.mask_token_id)
    with torch.no_grad():
        want = torch.log_softmax(policy.image_logits(policy.model, masked, policy.encode_text(ro.prompt_ids)), -1)
        want_neg = torch.log_softmax(policy.image_logits(policy.model, masked, policy.encode_text(ro.neg_prompt_ids)), -1)
    idx = ro.response_ids[..., None]
    assert torch.allclose(mf, want.gather(-1, idx)[..., 0], atol=1e-5)
    neg = policy.logprob(ro, estimator="mean_field", condition="negative").logp
    assert torch.allclose(neg, want_neg.gather(-1, idx)[..., 0], atol=1e-5)
    assert not torch.allclose(neg, mf, atol=1e-3)  # the null prompt is another condition
    kl = policy.logprob(ro, estimator="mean_field", stats=("kl",), stats_against="negative").stats["kl"]
    want_kl = (want.exp() * (want - want_neg)).sum(-1)
    assert torch.allclose(kl, want_kl, atol=1e-5)


def test_elbo_sums_to_the_copy_average(policy):
    ro = policy.sample(PROMPTS, 1, seeds=[1, 2, 3])
    a = policy.logprob(ro, estimator="elbo", num_copies=2, mask_seed=4).logp
    b = policy.logprob(ro, estimator="elbo", num_copies=2, mask_seed=4).logp
    assert torch.equal(a, b)  # masks seeded by the row: the same seed gives the same estimate
    assert (a <= 0).all() and (a.sum(-1) < 0).all()
    c = policy.logprob(ro.select([2, 0, 1]), estimator="elbo", num_copies=2, mask_seed=4).logp
    assert torch.allclose(c, a[[2, 0, 1]], atol=1e-5)  # and in any micro-batch


def test_forward_noise_masks_image_tokens_only(policy):
    ro = policy.sample(PROMPTS, 2, seeds=list(range(6)))
    nb = policy.forward_noise(ro, 2, torch.Generator().manual_seed(0), min_rate=0.2)
    p = nb.prompt_len
    assert torch.equal(nb.input_ids[:6, :p], ro.prompt_ids) and torch.equal(nb.input_ids[6:, :p], ro.prompt_ids)
    img = nb.input_ids[:, p:].reshape(2, 6, -1)
    assert torch.equal(img == policy.mask_token_id, nb.noise_mask)
    assert torch.equal(nb.noise_mask[0], ~nb.noise_mask[1])  # antithetic copies are complements
    assert torch.equal(torch.where(nb.noise_mask, ro.response_ids[None], img), ro.response_ids[None].expand(2, -1, -1))
    lp = policy.denoise_logprob(nb)
    assert torch.equal(lp != 0, nb.noise_mask) and (lp <= 0).all()


def test_snapshot_round_trip_and_errors(policy, tmp_path):
    policy.save_pretrained(tmp_path / "m")
    for sub in ("transformer", "vqvae", "text_encoder", "tokenizer", "scheduler"):
        assert (tmp_path / "m" / sub).is_dir()
    assert (tmp_path / "m" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
    loaded = MaskedImageAdapter.from_pretrained(tmp_path / "m")
    a = policy.sample(PROMPTS, 1, seeds=[1, 2, 3])
    b = loaded.sample(PROMPTS, 1, seeds=[1, 2, 3])
    assert torch.equal(a.response_ids, b.response_ids)
    with pytest.raises(ValueError, match=r"unknown masked_image generation options \['guidance'\]; valid"):
        policy.sample(PROMPTS, 1, guidance=2.0)
    with pytest.raises(ValueError, match=r"estimator must be one of \['per_step', 'mean_field', 'elbo'\], got 'exact'"):
        policy.logprob(a, estimator="exact")
    with pytest.raises(ValueError, match="num_steps must be a positive int, got 0"):
        policy.sample(PROMPTS, 1, num_steps=0)
    import shutil

    shutil.rmtree(tmp_path / "m" / "scheduler")
    with pytest.raises(FileNotFoundError, match=r"missing \['scheduler'\]"):
        MaskedImageAdapter.from_pretrained(tmp_path / "m")
