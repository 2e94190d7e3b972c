"""The share of a method's credit on decisive tokens (issue 25, item 3): hand-computed shares, token alignment,
and the credit of the registered methods' own code against independently recomputed weights."""
import copy

import pytest
import torch

from mmrl.algorithms import dgpo_token_weights, gcpo_token_weights
from mmrl.models import adapter_class
from mmrl.tiny_world.credit_share import decisive_share, decisive_tokens, method_config, method_credit, token_marks


def test_share_by_hand():
    credit = torch.tensor([[1.0, 2.0, 3.0, 9.0], [0.5, 0.5, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool()
    decisive = torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0]]).bool()
    share, uniform = decisive_share(credit, mask, decisive)
    # row 0: 2 / (1 + 2 + 3) (the 9 is masked out, so is its decisive flag); uniform 1 of 3 tokens
    # row 1: 0.5 / 3; uniform 1 of 4
    torch.testing.assert_close(share, torch.tensor([1 / 3, 1 / 6]))
    torch.testing.assert_close(uniform, torch.tensor([1 / 3, 1 / 4]))
    torch.testing.assert_close(decisive_share(-credit, mask, decisive)[0], share)  # a negative advantage: same share
    with pytest.raises(ValueError, match="no credit"):
        decisive_share(torch.zeros(2, 4), mask, decisive)
    with pytest.raises(ValueError, match="one shape"):
        decisive_share(credit, mask[:, :3], decisive)


def test_token_marks_align_tokens_to_characters():
    assert token_marks(["8", "-", "2", ":", "x", "<eos>"], "8-2:x", [1, 1, 1, 0, 0]) == [True, True, True, False, False, False]
    assert token_marks(["8-", "2:", "x"], "8-2:x", [0, 0, 1, 0, 0]) == [False, True, False]  # any marked char marks it
    assert token_marks(["8", "<unk>", "-", "2"], "8-2", [0, 1, 0], specials={"<unk>"}) == [False, False, True, False]
    assert token_marks(["8", "<unk>", "-", "2"], "8-2", [0, 1, 0]) is None  # not a special token: no alignment
    assert token_marks(["8", "+"], "8-2", [1, 1, 1]) is None  # tokens that do not spell the text
    assert token_marks(["8", "-"], "8-2", [1, 1, 1]) is None  # nor only a part of it


@pytest.fixture(scope="module")
def rollout_and_policy():
    pol = adapter_class("causal_lm").tiny(seed=0)
    roll = pol.sample(["12+3", "4*5", "7-1"], 2, seeds=list(range(6)), max_new_tokens=8, temperature=1.0)
    return pol, roll


def test_grpo_credit_is_uniform_and_dgpo_at_its_reference_too(rollout_and_policy):
    pol, roll = rollout_and_policy
    mask = roll.response_mask.bool()
    grpo = method_credit(method_config("grpo", "causal_lm", max_completion_length=8), pol, roll, micro_batch=4)
    torch.testing.assert_close(grpo, mask.float())
    same = copy.copy(pol)
    same.ref_model = copy.deepcopy(pol.model).requires_grad_(False).eval()
    dgpo = method_credit(method_config("dgpo", "causal_lm", max_completion_length=8), same, roll)
    torch.testing.assert_close(dgpo, mask.float())  # H^2 = 0 everywhere: w = 1 (the uniform share)


def test_dgpo_and_gcpo_credit_are_their_weights(rollout_and_policy):
    pol, roll = rollout_and_policy
    mask = roll.response_mask.bool()
    moved = copy.copy(pol)
    ref = adapter_class("causal_lm").tiny(seed=1).model.requires_grad_(False).eval()
    with torch.no_grad():
        ref.get_output_embeddings().weight.mul_(30.0)  # a sharp reference: large, uneven deviations
    moved.ref_model = ref
    cfg = method_config("dgpo", "causal_lm", max_completion_length=8)
    with torch.no_grad():
        st = moved.logprob(roll, stats=("h2", "entropy"), stats_against="reference").stats
    want = dgpo_token_weights(st["h2"], st["entropy"], mask, vocab_size=pol.vocab_size, tau=cfg.dgpo_tau, kappa=cfg.dgpo_kappa) * mask
    got = method_credit(cfg, moved, roll, micro_batch=4)
    assert not torch.allclose(got, mask.float(), atol=1e-3), "the weights must be uneven for this test to mean anything"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    cfg = method_config("gcpo", "causal_lm", max_completion_length=8)
    with torch.no_grad():
        pos, neg = pol.logprob(roll).logp, pol.logprob(roll, condition="negative").logp
    want = gcpo_token_weights(pos, neg, mask, divergence=cfg.gcpo_divergence, normalization=cfg.gcpo_normalization,
                              top_fraction=cfg.gcpo_top_fraction, target_mass=cfg.gcpo_target_mass) * mask
    torch.testing.assert_close(method_credit(cfg, pol, roll), want, rtol=1e-5, atol=1e-6)


def test_decisive_tokens_mark_the_characters_the_function_marks(rollout_and_policy):
    pol, roll = rollout_and_policy
    first = lambda text: [i == 0 for i in range(len(text))] if text else []  # the first character decides
    decisive, usable = decisive_tokens(pol, roll, first)
    specials = set(pol.tokenizer.all_special_tokens)  # left out of the decoded text (a random model writes them)
    for i, (text, toks) in enumerate(zip(roll.completions, pol.token_strings(roll))):
        assert bool(usable[i]) == bool(text)
        if text:
            assert decisive[i].nonzero().flatten().tolist() == [next(j for j, t in enumerate(toks) if t not in specials)]
    reject = lambda text: (_ for _ in ()).throw(ValueError("no header"))
    assert not decisive_tokens(pol, roll, reject)[1].any()


def test_credit_page_underlines_the_marked_tokens():
    from mmrl.reporting.credit_viz import text_heatmap_html

    page = text_heatmap_html([["8", "-", "<b>"]], [[0.1, -0.2, 0.3]], ["t"], "h", marks=[[True, False, True]],
                             mark_legend="decisive")
    spans = [s for s in page.split("<span")[1:]]
    assert ["underline" in s for s in spans] == [True, False, True] and "underlined: decisive" in page
    assert "&lt;b&gt;" in page and "underline" not in text_heatmap_html([["8"]], [[0.1]], ["t"], "h")
