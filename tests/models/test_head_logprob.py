"""`models.head_logprob`: log-probs at selected positions straight from the hidden states (issue 29) equal the
full-logits computation, values and gradients, and DMPO's `denoise_logprob` gives the same numbers on both paths."""
import pytest
import torch

from mmrl.models.dllm_backbone import BackboneLogits
from mmrl.models.dllm_samplers import SUPPRESSED_LOGIT
from mmrl.models.head_logprob import head_logprob, plain_linear_head
from mmrl.models.masked_diffusion import MaskedDiffusionAdapter


def _reference(hidden, head, targets, suppress):
    logits = head(hidden).float()  # [M, V]
    if suppress:
        logits = logits.index_fill(1, torch.tensor(suppress), SUPPRESSED_LOGIT)
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [3, None])
def test_head_logprob_equals_log_softmax_of_the_logits(bias, rows):
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=g))
    hidden = torch.randn(11, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 49, (11,), generator=g)
    targets[0] = 7  # a suppressed id as a target: log-prob of a near-impossible token, still finite
    upstream = torch.randn(11, generator=g)
    ref = _reference(hidden, head, targets, [7, 49])
    ref_grads = torch.autograd.grad((ref * upstream).sum(), [hidden, *head.parameters()])
    out = head_logprob(hidden, head, targets, (7, 49), rows_per_chunk=rows)
    grads = torch.autograd.grad((out * upstream).sum(), [hidden, *head.parameters()])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert float(grads[1][7].abs().max()) == 0.0  # no gradient reaches a suppressed token's weight row


def test_only_a_plain_linear_head_takes_the_fast_path():
    head = torch.nn.Linear(4, 5)
    assert plain_linear_head(head) is head
    head.register_forward_hook(lambda *a: None)
    assert plain_linear_head(head) is None
    assert plain_linear_head(torch.nn.Embedding(5, 4)) is None


@pytest.mark.parametrize("shift", [False, True])
def test_denoise_logprob_is_the_same_with_and_without_full_logits(shift, monkeypatch):
    """WDCE's per-copy log-probs (DMPO): the masked positions through the head only, against the full-logits window,
    on a tiny bidirectional Llama with left-padded prompts, with and without Dream's logit shift."""
    adapter = MaskedDiffusionAdapter.tiny(seed=0, shift_logits=shift)
    rollout = adapter.sample(["say a", "a longer prompt than that"], 2, seeds=[1, 2, 3, 4], gen_length=8, block_length=4,
                             steps=4)
    assert not bool(rollout.prompt_mask.all())  # left padding is exercised
    noised = adapter.forward_noise(rollout, 4, torch.Generator().manual_seed(0))
    params = [p for p in adapter.model.parameters() if p.requires_grad]
    weights = torch.randn(noised.noise_mask.shape, generator=torch.Generator().manual_seed(1))

    fast = adapter.denoise_logprob(noised)
    fast_grads = torch.autograd.grad((fast * weights).sum(), params)
    monkeypatch.setattr(BackboneLogits, "output_head", lambda self: None)  # the full-logits path
    full = adapter.denoise_logprob(noised)
    full_grads = torch.autograd.grad((full * weights).sum(), params)

    assert bool((fast[~noised.noise_mask] == 0).all()) and bool((fast[noised.noise_mask] < 0).all())
    torch.testing.assert_close(fast, full, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_elbo_estimator_is_the_same_with_and_without_full_logits(monkeypatch):
    """DMPO's buffer-time ELBO log-probs (policy and reference) on both paths."""
    adapter = MaskedDiffusionAdapter.tiny(seed=0, ref_model=True)
    rollout = adapter.sample(["say a", "a longer prompt than that"], 2, seeds=[1, 2, 3, 4], gen_length=8, block_length=4,
                             steps=4)
    fast = [adapter.logprob(rollout, estimator="elbo", mask_seed=3, use_reference=ref).logp for ref in (False, True)]
    monkeypatch.setattr(BackboneLogits, "output_head", lambda self: None)
    full = [adapter.logprob(rollout, estimator="elbo", mask_seed=3, use_reference=ref).logp for ref in (False, True)]
    assert bool((fast[0] != 0).any())
    for a, b in zip(fast, full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
