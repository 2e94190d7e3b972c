"""mmrl.tiny_world.rft: rejection-sampling fine-tuning keeps exactly the rewarded samples and fits them."""
import pytest
import torch

from mmrl.models import adapter_class
from mmrl.core.registry import REWARDS
from mmrl.tiny_world.rft import rejection_sampling_ft, rft_loss


def _reward(name, fn):
    if name not in REWARDS:
        REWARDS.register(name)(fn)


_reward("_rft_starts_with_a", lambda prompts, completions, **kw: [1.0 if str(c).startswith("a") else 0.0 for c in completions])
_reward("_rft_never", lambda prompts, completions, **kw: [0.0 for _ in completions])


def test_rft_fits_the_accepted_samples_only():
    pol = adapter_class("causal_lm").tiny(seed=0, max_new_tokens=2)
    rows = [{"prompt": "xy"}, {"prompt": "zz"}]
    gen = {"max_new_tokens": 2, "temperature": 1.0}
    out = rejection_sampling_ft(pol, rows, "_rft_starts_with_a", rollouts=5, prompts_per_rollout=4, group_size=16, lr=1e-2,
                                seed=1, generation=gen)
    assert out["sampled"] == 5 * 4 * 16 and len(out["accepted"]) == 5 and len(out["loss"]) == 5
    assert sum(out["accepted"]) > 0
    # fitting the samples that start with "a" makes the model start with "a" more often (same seeds before / after)
    fresh = adapter_class("causal_lm").tiny(seed=0, max_new_tokens=2)
    hits = lambda p: sum(str(c).startswith("a") for c in p.sample(["xy", "zz"], 128, seeds=list(range(256)), **gen).completions)  # noqa: E731
    assert hits(pol) > hits(fresh)


def test_rft_without_rewarded_samples_changes_nothing():
    pol = adapter_class("causal_lm").tiny(seed=0, max_new_tokens=2)
    before = [p.detach().clone() for p in pol.model.parameters()]
    out = rejection_sampling_ft(pol, [{"prompt": "xy"}], "_rft_never", rollouts=2, prompts_per_rollout=2, group_size=2,
                                lr=1e-2, generation={"max_new_tokens": 2, "temperature": 1.0})
    assert out["accepted"] == [0, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, pol.model.parameters()))
    with pytest.raises(ValueError, match="rollouts"):
        rejection_sampling_ft(pol, [{"prompt": "xy"}], "_rft_never", rollouts=0, prompts_per_rollout=2, group_size=2, lr=1e-2)
