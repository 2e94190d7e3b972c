"""MGDM's easy-first top-k decoding with re-masking (`generate_easy_first`): a hand-built three-step trace in which
an early choice is re-masked, the given (infilled) positions, and the adapter's `sampler="easy_first"`."""
import math

import pytest
import torch

from mmrl.models.dllm_samplers import generate_easy_first, generate_low_confidence
from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

MASK = 4  # vocabulary 0..3 plus the mask token


def _row(token: int, conf: float) -> list[float]:
    """Log-probs over the 5 ids: `conf` on `token`, the rest shared by the other real tokens, ~0 on the mask."""
    probs = [(1 - conf) / 3] * 4 + [1e-9]
    probs[token] = conf
    return [math.log(q) for q in probs]


def _fn(x: torch.Tensor) -> torch.Tensor:
    """Logits of a 1-token prompt + 3-token span; what is proposed depends on which span positions are masked."""
    span = (x[0, 1:] == MASK).tolist()
    table = {
        (True, True, True): [(1, 0.6), (2, 0.5), (3, 0.4)],  # step 1: position 0 is the easiest (0.6)
        (False, True, True): [(1, 0.6), (2, 0.9), (3, 0.8)],  # step 2: 0.9 and 0.8 beat position 0's 0.6
        (True, False, False): [(0, 0.7), (2, 0.9), (3, 0.8)],  # step 3: position 0 re-proposed as token 0
    }
    rows = table.get(tuple(span), [(0, 0.5)] * 3)
    return torch.tensor([[_row(0, 0.5)] + [_row(t, c) for t, c in rows]])  # [1, 4, 5]


def test_easy_first_re_masks_a_less_confident_earlier_choice():
    prompt = torch.tensor([[0]])
    out = generate_easy_first(_fn, prompt, gen_length=3, steps=3, mask_id=MASK)
    # step 1 keeps position 0 = 1 (0.6); step 2 keeps positions 1, 2 (0.9, 0.8) and re-masks position 0; step 3
    # decodes position 0 as token 0
    assert out[0, 1:].tolist() == [0, 2, 3]
    # the low-confidence sampler never revisits position 0: it keeps token 1 there
    low = generate_low_confidence(_fn, prompt, gen_length=3, block_length=3, steps=3, mask_id=MASK)
    assert low[0, 1].item() == 1


def test_easy_first_keeps_given_positions_and_rejects_bad_steps():
    prompt = torch.tensor([[0]])
    init = torch.tensor([[MASK, 3, MASK]])  # position 1 given
    out = generate_easy_first(lambda x: torch.randn(1, 4, 5, generator=torch.Generator().manual_seed(0)), prompt,
                              gen_length=3, steps=2, mask_id=MASK, init=init)
    assert out[0, 2].item() == 3 and (out[0, 1:] != MASK).all()
    with pytest.raises(ValueError, match="1 <= steps <= gen_length=3"):
        generate_easy_first(_fn, prompt, gen_length=3, steps=4, mask_id=MASK)


def test_adapter_easy_first_sampler():
    policy = MaskedDiffusionAdapter.tiny(seed=0, gen_length=6, hidden_size=32)
    out = policy.sample(["1,2=3"], 2, sampler="easy_first", temperature=0.0, gen_length=6, steps=6, block_length=None)
    assert out.response_ids.shape == (2, 6) and (out.response_ids != policy.mask_token_id).all()
    assert out.completions[0] == out.completions[1]  # greedy
    with pytest.raises(ValueError, match="block_length=3 < gen_length=6"):
        policy.sample(["1,2=3"], 1, sampler="easy_first", gen_length=6, steps=6, block_length=3)
