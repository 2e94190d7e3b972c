"""Masked-diffusion infilling: a response template's given tokens are kept by every sampler, never masked by the
estimators or the WDCE noise, and carry no loss; exact log-probs still reproduce the sampler's."""
import pytest
import torch

from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

PUZ = "1000040002100023"


@pytest.fixture(scope="module")
def policy():
    return MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32)


def prompts():
    return [{"prompt": PUZ, "response_template": PUZ.replace("0", "<mask>")}, {"prompt": "x", "response_template": "ab<mask>"}]


@pytest.mark.parametrize("sampler", ["low_confidence", "random", "entropy", "maskgit_plus", "threshold", "threshold_cache", "random_order"])
def test_samplers_keep_given_tokens(policy, sampler):
    ro = policy.sample(prompts(), 2, seeds=[1, 2, 3, 4], sampler=sampler, gen_length=16, block_length=8, steps=16, temperature=1.0)
    fixed = ro.extras["fixed"]
    tok = policy.tokenizer
    t0 = torch.tensor(tok(PUZ.replace("0", "<mask>"), add_special_tokens=False)["input_ids"])
    assert torch.equal(fixed[0], t0 != policy.mask_token_id) and int(fixed[2].sum()) == 2
    for i in range(4):
        given = fixed[i]
        template = policy.response_templates([prompts()[i // 2]], 16)[0]
        assert torch.equal(ro.response_ids[i][given], template[given])  # given tokens untouched
        assert not (ro.response_mask[i] & given).any()  # and not part of the policy's tokens
        assert not (ro.response_ids[i] == policy.mask_token_id).any()  # every free position was generated


def test_estimators_and_noise_skip_given_positions(policy):
    ro = policy.sample(prompts(), 2, seeds=[5, 6, 7, 8], sampler="random_order", gen_length=16, block_length=16, temperature=1.0)
    fixed = ro.extras["fixed"]
    ex = policy.logprob(ro, estimator="exact")
    torch.testing.assert_close(ex.logp, ro.old_logp, atol=1e-5, rtol=0)
    assert (ro.extras["order"][fixed] == -1).all() and (ro.extras["order"][~fixed] >= 0).all()
    for est in ("mean_field", "elbo"):
        lp = policy.logprob(ro, estimator=est, mask_seed=3).logp
        assert (lp[fixed] == 0).all() and (lp[ro.response_mask] != 0).any()
    nz = policy.forward_noise(ro, 4, torch.Generator().manual_seed(0))
    assert not (nz.noise_mask & fixed[None]).any()
    for k in range(2):
        assert torch.equal(nz.noise_mask[k] ^ nz.noise_mask[k + 2], ~fixed)  # antithetic on the free positions
    # the noised input shows the given tokens
    p = nz.prompt_len
    resp_in = nz.input_ids[:, p:].view(4, 4, -1)
    assert torch.equal(resp_in[:, fixed], ro.response_ids[fixed].expand(4, -1))


def test_mean_field_input_keeps_given_tokens_visible(policy):
    # the given cells change the mean-field prediction of the free cells: the model sees them
    ro = policy.sample(prompts()[:1], 1, seeds=[1], gen_length=16, block_length=16, steps=16)
    other = policy.sample([{"prompt": PUZ, "response_template": "4" + PUZ.replace("0", "<mask>")[1:]}], 1, seeds=[1], gen_length=16, block_length=16, steps=16)
    a = policy.logprob(ro, estimator="mean_field", mask_seed=0).logp
    b = policy.logprob(other, estimator="mean_field", mask_seed=0).logp
    assert not torch.allclose(a, b)


def test_template_longer_than_span_is_an_error(policy):
    with pytest.raises(ValueError, match="more than gen_length=4"):
        policy.sample([{"prompt": "x", "response_template": "abcdef"}], 1, gen_length=4, block_length=4, steps=4)
