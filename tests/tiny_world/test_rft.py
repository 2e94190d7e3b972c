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


def test_truth_batches_pack_the_solutions_with_the_given_cells_fixed():
    """The clean-SFT row's data (`truth_batches`): the response is the true solution, the puzzle's given cells are
    fixed (never masked nor counted by the loss), `steps` batches of `batch_size` rows."""
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter
    from mmrl.tiny_world.rft import truth_batches
    from mmrl.tiny_world.tasks import sudoku4_row

    pol = MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32)
    puzzles = ("1000041002300004", "1040240302003120")  # blanks (0) of the solution "1342241342313124"
    rows = [sudoku4_row(p, "1342241342313124") for p in puzzles]
    batches = truth_batches(pol, rows, steps=3, batch_size=4, gen_length=16, seed=0)
    assert len(batches) == 3
    for x_p, m_p, x_r, fixed in batches:
        assert x_r.shape == fixed.shape == (4, 16) and x_p.shape[0] == m_p.shape[0] == 4
        for i in range(4):
            text = pol.tokenizer.decode(x_r[i])
            assert "1342241342313124" in text.replace(" ", "")  # the solution, whichever row was drawn
            given = int(fixed[i].sum())
            assert given in (6, 9)  # the given cells of the row's puzzle (6 and 9 nonzero digits)
    with pytest.raises(ValueError, match="steps"):
        truth_batches(pol, rows, steps=0, batch_size=4, gen_length=16)


def test_masked_diffusion_nll_fits_and_reads_rollouts_as_tuples():
    """`masked_diffusion_nll` scores a Rollout as the tuple of its tensors (same seed, same loss); `fit_batches` on
    the true solutions lowers that loss, and a None batch makes no update."""
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter
    from mmrl.tiny_world.rft import fit_batches, masked_diffusion_nll, truth_batches
    from mmrl.tiny_world.tasks import sudoku4_row

    pol = MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32)
    row = sudoku4_row("1000040002100023", "1342241342313124")
    ro = pol.sample([row["prompt"]], 2, seeds=[1, 2], gen_length=16, block_length=16, steps=16, temperature=1.0)
    as_tuple = (ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.extras["fixed"])
    with torch.no_grad():
        assert masked_diffusion_nll(3)(pol, ro) == masked_diffusion_nll(3)(pol, as_tuple)
    batch = truth_batches(pol, [row], steps=1, batch_size=8, gen_length=16)[0]
    with torch.no_grad():
        before = masked_diffusion_nll(5)(pol, batch)
    params = [p.detach().clone() for p in pol.model.parameters()]
    assert fit_batches(pol, [None], masked_diffusion_nll(0), lr=1e-2)[0] != fit_batches(pol, [None], masked_diffusion_nll(0), lr=1e-2)[0]  # nan
    assert all(torch.equal(a, b) for a, b in zip(params, pol.model.parameters()))
    losses = fit_batches(pol, [batch] * 20, masked_diffusion_nll(0), lr=1e-2)
    with torch.no_grad():
        after = masked_diffusion_nll(5)(pol, batch)
    assert len(losses) == 20 and after < 0.5 * before


_reward("_rft_even_first", lambda prompts, completions, **kw: [1.0 if str(c) and ord(str(c)[0]) % 2 == 0 else 0.0 for c in completions])


def _md_policy():
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

    return MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32)


def test_eos_padded_by_hand_and_as_pretraining_packs_an_answer():
    """After a row's first EOS every token becomes EOS (rows without one unchanged), which is how pre-training packs
    an answer string: a sampled span, padded, equals `pack_pairs` of its decoded completion."""
    from mmrl.tiny_world.pretrain import pack_pairs
    from mmrl.tiny_world.rft import eos_padded

    ids = torch.tensor([[5, 2, 7, 8], [1, 3, 4, 6], [2, 9, 2, 9]])
    assert eos_padded(ids, [2]).tolist() == [[5, 2, 2, 2], [1, 3, 4, 6], [2, 2, 2, 2]]
    pol = _md_policy()
    ro = pol.sample(["15,28,18=61"], 8, seeds=list(range(8)), gen_length=16, block_length=16, steps=16, temperature=1.0)
    packed = pack_pairs(pol.tokenizer, [pol._prompt_text("15,28,18=61")] * 8, ro.completions, 16, pol.pad_token_id,
                        pol.eos_token_ids[0])[2]
    ended = torch.isin(ro.response_ids, torch.tensor(pol.eos_token_ids)).any(1)
    assert ended.any() and torch.equal(eos_padded(ro.response_ids, pol.eos_token_ids)[ended], packed[ended])


def test_masked_diffusion_rft_loss_is_the_bases_pretraining_loss():
    """The loss a masked-diffusion RFT minimises on a rollout is `masked_sft_loss` with the base recipe's options
    (countdown3-md: no 1/t, mean over masked tokens) on the same batch and mask draws, i.e. the mean cross-entropy
    over the masked response tokens, recomputed here by hand; LLaDA's default weighting gives another number."""
    import torch.nn.functional as F

    from mmrl.tiny_world.models import TINY_MODELS
    from mmrl.tiny_world.pretrain import loss_options, masked_sft_loss
    from mmrl.tiny_world.rft import eos_padded, masked_diffusion_nll

    opts = loss_options(TINY_MODELS["countdown3-md"].recipe)
    assert opts == {"time_weight": "none", "normalise": "masked"}  # ar_init_steps is the schedule, not the loss
    pol = _md_policy()
    ro = pol.sample(["15,28,18=61", "3,4,5=12"], 4, seeds=list(range(8)), gen_length=16, block_length=16, steps=16,
                    temperature=1.0)
    x_r = eos_padded(ro.response_ids, pol.eos_token_ids)
    fixed = torch.zeros_like(x_r, dtype=torch.bool)
    with torch.no_grad():
        got = masked_diffusion_nll(7, **opts)(pol, ro)
        ref = masked_sft_loss(pol, ro.prompt_ids, ro.prompt_mask, x_r, fixed, torch.Generator().manual_seed(7), **opts)
        g = torch.Generator().manual_seed(7)  # the same draws by hand: t ~ U(eps, 1) per row, then the token masks
        t = 1e-3 + (1 - 1e-3) * torch.rand(8, 1, generator=g)
        masked = torch.rand(8, 16, generator=g) < t
        noisy = torch.where(masked, torch.full_like(x_r, pol.mask_token_id), x_r)
        logits = pol.backbone_logits(ro.prompt_mask, 16, pol.model)(torch.cat([ro.prompt_ids, noisy], 1))[:, -16:]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x_r.reshape(-1), reduction="none").view(8, 16)
        by_hand = ce[masked].mean()
        llada = masked_diffusion_nll(7)(pol, ro)
    assert got == ref and torch.allclose(got, by_hand, atol=1e-6)
    assert not torch.allclose(got, llada, atol=1e-3)
    with pytest.raises(ValueError, match="ar_init_steps"):
        masked_diffusion_nll(0, ar_init_steps=600)


def test_masked_diffusion_rft_fits_only_the_accepted_samples():
    """A masked-diffusion RFT run fits, per rollout batch, exactly the responses the reward accepts (every one of
    them, none other), with one update per batch that has any."""
    from mmrl.tiny_world import rft

    pol = _md_policy()
    seen = []
    inner = rft.masked_diffusion_nll(0)

    def recording(policy, batch):
        seen.append(list(batch.completions))
        return inner(policy, batch)

    gen = {"gen_length": 16, "block_length": 16, "steps": 16, "temperature": 1.0}
    out = rft.rejection_sampling_ft(pol, [{"prompt": "15,28,18=61"}, {"prompt": "3,4,5=12"}], "_rft_even_first", rollouts=3,
                                    prompts_per_rollout=2, group_size=4, lr=1e-3, seed=2, generation=gen, loss_fn=recording)
    assert out["sampled"] == 3 * 2 * 4 and 0 < sum(out["accepted"]) < out["sampled"]
    assert [len(c) for c in seen] == [a for a in out["accepted"] if a]  # one fit per batch with accepted answers
    assert all(c and ord(c[0]) % 2 == 0 for batch in seen for c in batch)  # the rejected never reach the loss
    assert len(out["loss"]) == 3


def _tiny_masked_image_policy():
    pytest.importorskip("diffusers")
    from mmrl.models.masked_image import MaskedImageAdapter, tiny_amused_components

    parts = tiny_amused_components(seed=3, words=["a", "red", "blue", "square", "circle"], grid=4, codebook_size=8,
                                   init_std=0.3)
    parts["text_encoder"].requires_grad_(False)  # as after pre-training: RL and RFT fit the transformer only
    return MaskedImageAdapter(parts["transformer"], parts["vqvae"], parts["text_encoder"], parts["tokenizer"],
                              mask_token_id=parts["scheduler"].config.mask_token_id, num_steps=4, cfg_scale=1.0)


def test_masked_image_nll_is_maskgit_loss_on_the_rollout():
    """`masked_image_nll` is MaskGIT's pre-training loss of the rollout's images: with no prompt dropout, the masks
    of `maskgit_masks` from a generator seeded alike, the rollout's own prompt; with dropout near 1, the negative
    prompt's text in its place (the unconditional branch)."""
    from mmrl.tiny_world.masked_image_pretrain import maskgit_loss, maskgit_masks
    from mmrl.tiny_world.rft import masked_image_nll

    pol = _tiny_masked_image_policy()
    ro = pol.sample(["a red square", "a blue circle"], 2, seeds=[1, 2, 3, 4])
    target = ro.response_ids  # [4, 16]

    def by_hand(ids, seed):
        masked = maskgit_masks(4, 16, torch.Generator().manual_seed(seed))
        states = torch.where(masked, torch.full_like(target, pol.mask_token_id), target)
        return maskgit_loss(pol.image_logits(pol.model, states, pol.encode_text(ids)), target, masked)

    with torch.no_grad():
        got = masked_image_nll(7, cfg_dropout=0.0)(pol, ro)
        assert got == pytest.approx(by_hand(ro.prompt_ids, 7).item(), abs=1e-6)
        assert got != pytest.approx(by_hand(ro.prompt_ids, 8).item(), abs=1e-6)  # the seed picks the masks
        null = pol.tokenize([pol.generation_defaults["negative_prompt"]] * 4)
        uncond = masked_image_nll(7, cfg_dropout=0.999999)(pol, ro)
        assert uncond == pytest.approx(by_hand(null, 7).item(), abs=1e-6)
        assert uncond != pytest.approx(got.item(), abs=1e-6)  # the prompt is read
    with pytest.raises(ValueError, match="cfg_dropout"):
        masked_image_nll(0, cfg_dropout=1.0)


def test_rft_on_masked_images_fits_the_transformer_only():
    """Fitting rollouts with `masked_image_nll` (RFT's loss for masked image tokens) lowers that loss on them and
    leaves the frozen text encoder untouched."""
    from mmrl.tiny_world.rft import fit_batches, masked_image_nll

    pol = _tiny_masked_image_policy()
    ro = pol.sample(["a red square"], 8, seeds=[5] * 8)  # one image, eight times: a fit can drive its loss near 0
    text_before = [p.detach().clone() for p in pol.text_encoder.parameters()]
    with torch.no_grad():
        before = sum(masked_image_nll(s, cfg_dropout=0.0)(pol, ro).item() for s in range(5))
    losses = fit_batches(pol, [ro] * 30, masked_image_nll(0), lr=1e-2)
    assert len(losses) == 30
    with torch.no_grad():
        after = sum(masked_image_nll(s, cfg_dropout=0.0)(pol, ro).item() for s in range(5))
    assert after < 0.3 * before
    assert all(torch.equal(a, b) for a, b in zip(text_before, pol.text_encoder.parameters()))
