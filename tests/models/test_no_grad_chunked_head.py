"""Issue 29: no-grad teacher-forced scorings (reference log-probs, GCPO's negative condition, DGPO's / full-KL GCPO's
other side) run the LM head themselves in chunks of rows on the final hidden states, never making [N, T, V] logits;
the values must equal the full-logits computation (`selective_log_softmax` / `token_distribution_stats` on
`_response_logits`) up to float rounding."""
from __future__ import annotations

import pytest
import torch

from mmrl.algorithms.distributions import token_distribution_stats
from mmrl.models import causal_lm
from mmrl.models.base import selective_log_softmax
from mmrl.models.causal_lm import CausalLMAdapter

PROMPTS = ["2+2=", "a longer prompt, so that the others are left padded", "x"]


@pytest.fixture(scope="module")
def setup():
    ref = CausalLMAdapter.tiny(seed=5).model
    a = CausalLMAdapter.tiny(seed=0, max_new_tokens=10)
    a = CausalLMAdapter(a.model, a.tokenizer, ref_model=ref, max_new_tokens=10)
    r = a.sample(PROMPTS, 3, generator=torch.Generator().manual_seed(2), temperature=0.8, eos_token_id=[2, 20, 21, 22, 23])
    assert not r.response_mask.all() and r.response_mask.any(-1).all()  # some rows end early: padding is exercised
    return a, r


def full_logits(a, r, model, condition="positive"):
    ids, mask = (r.prompt_ids, r.prompt_mask) if condition == "positive" else (r.neg_prompt_ids, r.neg_prompt_mask)
    with torch.no_grad():
        return a._response_logits(model, ids, mask, r.response_ids, r.response_mask, r.extras)  # [N, T, V]


def counting_chunks(model, monkeypatch, rows, fn):
    """Chunks of `rows` rows; returns the list of the [c, V] logits shapes that `fn` (the reduction of
    `causal_lm`) was called with."""
    monkeypatch.setattr(causal_lm, "NO_GRAD_HEAD_BYTES", 4 * rows * model.lm_head.weight.shape[0])
    calls, original = [], getattr(causal_lm, fn)

    def recording(logits, *args, **kwargs):
        calls.append(tuple(logits.shape))
        return original(logits, *args, **kwargs)

    monkeypatch.setattr(causal_lm, fn, recording)
    return calls


@pytest.mark.parametrize("condition,use_reference", [("positive", False), ("negative", False), ("positive", True)])
def test_no_grad_logprob_equals_the_full_logits_path(setup, monkeypatch, condition, use_reference):
    a, r = setup
    model = a.ref_model if use_reference else a.model
    expected = selective_log_softmax(full_logits(a, r, model, condition), r.response_ids, temperature=0.8)
    expected = torch.where(r.response_mask, expected, torch.zeros_like(expected))
    calls = counting_chunks(model, monkeypatch, 7, "selective_log_softmax")
    with torch.no_grad():
        got = a.logprob(r, condition=condition, use_reference=use_reference)
    torch.testing.assert_close(got.logp, expected, atol=1e-6, rtol=0)
    # only the valid positions went through the head, 7 rows at a time: no [N, T, V] logits
    assert sum(c[0] for c in calls) == int(r.response_mask.sum()) and all(len(c) == 2 and c[0] <= 7 for c in calls)
    assert len(calls) > 1


def test_gradient_scoring_keeps_the_full_logits_path(setup):
    a, r = setup
    s = a.logprob(r)
    assert s.logp.requires_grad


@pytest.mark.parametrize("stats,against", [(("h2", "entropy"), "reference"), (("kl", "entropy"), "negative")])
def test_other_side_statistics_equal_the_full_logits_path(setup, monkeypatch, stats, against):
    a, r = setup
    other_model, cond = (a.ref_model, "positive") if against == "reference" else (a.model, "negative")
    p_logits = full_logits(a, r, a.model)
    exp = token_distribution_stats(p_logits, full_logits(a, r, other_model, cond), stats=stats, temperature=0.8,
                                   other_targets=r.response_ids)
    calls = counting_chunks(other_model, monkeypatch, 5, "token_distribution_stats")
    got = a.logprob(r, stats=stats, stats_against=against)
    assert got.logp.requires_grad and not got.other_logp.requires_grad
    expected_logp = selective_log_softmax(p_logits, r.response_ids, temperature=0.8)
    torch.testing.assert_close(got.logp.detach(), torch.where(r.response_mask, expected_logp, 0.0), atol=1e-6, rtol=0)
    for k in stats:
        torch.testing.assert_close(got.stats[k], exp[k], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got.other_logp, torch.where(r.response_mask, exp["other_logp"], 0.0), atol=1e-6, rtol=0)
    assert set(got.stats) == set(stats)
    # the other side's head ran on chunks of at most 5 rows: its [N, T, V] logits never existed
    assert all(len(c) == 2 and c[0] <= 5 for c in calls) and sum(c[0] for c in calls) == r.response_ids.numel()


def test_models_outside_the_list_take_the_full_logits_path(setup, monkeypatch):
    a, r = setup
    monkeypatch.setattr(causal_lm, "LOGITS_ARE_HEAD_OF_HIDDEN", ())
    with torch.no_grad():
        assert a._response_logprob_no_grad(a.model, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, {}, 1.0) is None
        got = a.logprob(r).logp
    expected = selective_log_softmax(full_logits(a, r, a.model), r.response_ids, temperature=0.8)
    torch.testing.assert_close(got, torch.where(r.response_mask, expected, 0.0), atol=0, rtol=0)


@pytest.mark.parametrize("stats,against", [(("h2", "entropy"), "reference"), (("kl", "entropy"), "negative")])
def test_other_side_statistics_outside_the_list_use_the_other_sides_full_logits(setup, monkeypatch, stats, against):
    a, r = setup
    other_model, cond = (a.ref_model, "positive") if against == "reference" else (a.model, "negative")
    exp = token_distribution_stats(full_logits(a, r, a.model), full_logits(a, r, other_model, cond), stats=stats,
                                   temperature=0.8, other_targets=r.response_ids)
    monkeypatch.setattr(causal_lm, "LOGITS_ARE_HEAD_OF_HIDDEN", ())
    got = a.logprob(r, stats=stats, stats_against=against)
    assert got.logp.requires_grad
    for k in stats:
        torch.testing.assert_close(got.stats[k], exp[k], atol=1e-6, rtol=1e-6)
