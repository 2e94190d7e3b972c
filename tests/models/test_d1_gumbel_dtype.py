"""d1's bf16 Gumbel sampling as an option (issue 26): the draw against hand-computed cases, and the option reaching
the low-confidence sampler."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def close(t: torch.Tensor, expected, rtol: float = 1e-6) -> bool:
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=1e-7)


# ------------------------------------------------------------------------------ d1's bf16 Gumbel sampling


def test_bf16_gumbel_sampling_is_d1s_lower_entropy_draw():
    from mmrl.models.dllm_samplers import gumbel_argmax

    # exp(89) and exp(100) both overflow bfloat16 to inf and argmax takes the first: d1's draw picks token 0, whose
    # probability is e^-11 = 1.7e-5
    logits = torch.tensor([[89.0, 100.0]]).expand(64, 2)
    g = torch.Generator().manual_seed(0)
    assert gumbel_argmax(logits, 1.0, g, noise_dtype="bfloat16").tolist() == [0] * 64
    assert gumbel_argmax(logits, 1.0, g).tolist() == [1] * 64
    # a toy categorical of 256 tokens, logits 0 .. -12: the float64 draw has the entropy of softmax(logits)
    # (4.056 nats), d1's bf16 draw about 3.81
    logits = torch.linspace(0.0, -12.0, 256)
    p = torch.softmax(logits, -1)
    exact = float(-(p * p.log()).sum())
    assert exact == pytest.approx(4.056, abs=1e-3)
    big = logits.expand(100_000, 256).contiguous()

    def entropy(dtype):
        x = gumbel_argmax(big, 1.0, torch.Generator().manual_seed(1), noise_dtype=dtype)
        q = torch.bincount(x, minlength=256).double() / len(x)
        q = q[q > 0]
        return float(-(q * q.log()).sum())

    assert entropy("float64") == pytest.approx(exact, abs=0.02)
    assert entropy("bfloat16") < exact - 0.15
    with pytest.raises(ValueError, match="unknown gumbel noise dtype"):
        gumbel_argmax(big[:1], 1.0, noise_dtype="float16")


def test_gumbel_dtype_reaches_the_d1_sampler(monkeypatch):
    from mmrl.config import load_config
    from mmrl.models import adapter_class
    from mmrl.models import dllm_samplers

    d1 = load_config(ROOT / "configs/d1_diffu_grpo_llada_8b.yaml")
    assert d1.gumbel_dtype == "bfloat16"
    assert load_config(ROOT / "configs/dmpo_llada_8b.yaml").gumbel_dtype == "float64"  # DMPO: Fast-dLLM's float64
    dtypes = []
    plain = dllm_samplers.gumbel_argmax

    def recording(*a, noise_dtype="float64", **k):
        dtypes.append(noise_dtype)
        return plain(*a, noise_dtype=noise_dtype, **k)

    monkeypatch.setattr(dllm_samplers, "gumbel_argmax", recording)
    policy = adapter_class("masked_diffusion").tiny(seed=0)
    policy.sample(["ab"], 2, generator=torch.Generator().manual_seed(0), gen_length=8, steps=4, temperature=1.0,
                  gumbel_dtype="bfloat16")
    assert dtypes and set(dtypes) == {"bfloat16"}
    with pytest.raises(ValueError, match="gumbel_dtype='bfloat16' reproduces d1's low-confidence"):
        policy.sample(["ab"], 2, gen_length=8, steps=4, sampler="threshold", gumbel_dtype="bfloat16")
