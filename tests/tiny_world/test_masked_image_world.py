"""The tiny aMUSEd of the shapes world: its tokenizer, MaskGIT's pre-training masks and loss by hand, and
`mmrl replicate dmpo-vs-grpo-masked` end to end at smoke size."""
import json
import math

import pytest
import torch

pytest.importorskip("diffusers")

from mmrl.cli import main  # noqa: E402
from mmrl.models.clip_tokenizer import tiny_clip_tokenizer, words_of  # noqa: E402
from mmrl.tiny_world.masked_image_pretrain import maskgit_loss, maskgit_masks  # noqa: E402


def test_tiny_clip_tokenizer_one_token_per_word_and_reloads(tmp_path):
    from transformers import CLIPTokenizer

    words = words_of(["a photo of a red square", "Two blue circles"])
    assert words == ["a", "blue", "circles", "of", "photo", "red", "square", "two"]
    tok = tiny_clip_tokenizer(words, model_max_length=10)
    ids = tok(["a photo of two blue circles", "a dog"], padding="max_length", truncation=True, max_length=10).input_ids
    assert tok.convert_ids_to_tokens(ids[0])[:8] == ["<|startoftext|>", "a</w>", "photo</w>", "of</w>", "two</w>", "blue</w>",
                                                     "circles</w>", "<|endoftext|>"]
    assert tok.convert_ids_to_tokens(ids[1])[:5] == ["<|startoftext|>", "a</w>", "d", "o", "g</w>"]  # unknown word: bytes
    assert ids[0][8:] == [tok.pad_token_id] * 2
    tok.save_pretrained(tmp_path)
    again = CLIPTokenizer.from_pretrained(tmp_path)
    assert again(["a photo of two blue circles"], padding="max_length", max_length=10).input_ids == [ids[0]]
    with pytest.raises(ValueError, match="model_max_length must be an int >= 3"):
        tiny_clip_tokenizer(words, model_max_length=2)


def test_maskgit_masks_follow_the_cosine_ratio_and_mask_at_least_one():
    g = torch.Generator().manual_seed(0)
    m = maskgit_masks(4000, 16, g)
    assert m.any(-1).all()
    # E[cos(pi/2 U)] = 2/pi of the tokens, plus the forced single masks of empty rows
    assert abs(m.float().mean().item() - 2 / math.pi) < 0.02


def test_maskgit_loss_by_hand():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # [1, 3, 2]
    targets = torch.tensor([[0, 0, 1]])
    masked = torch.tensor([[True, False, True]])
    want = (-math.log(math.exp(2) / (math.exp(2) + 1)) + math.log(2)) / 2
    assert maskgit_loss(logits, targets, masked).item() == pytest.approx(want, abs=1e-6)


def test_dmpo_vs_grpo_masked_smoke(tmp_path, monkeypatch, smoke_cache):
    from mmrl.geneval.rules import TASKS

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    assert main(["replicate", "dmpo-vs-grpo-masked", "--smoke", "--seeds", "1", "--out", str(tmp_path / "rep")]) == 0
    root = tmp_path / "rep" / "dmpo-vs-grpo-masked"
    res = json.loads((root / "results.json").read_text())
    assert set(res["arms"]) == {"GRPO (per-step)", "DMPO"}
    a, b = res["configs"]["GRPO (per-step)"], res["configs"]["DMPO"]
    shared = {k for k in a if k in b and a[k] == b[k]}
    assert {"family", "model_name_or_path", "num_generations", "learning_rate", "max_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps", "temperature", "cfg_scale"} <= shared
    assert a["family"] == "masked_image" and a["logprob_estimator"] == "per_step"
    assert set(res["before"]) == set(TASKS) | {"overall"}
    for name in ("table.md", "accuracy.png", "reward.png", "grid.png"):
        assert (root / name).stat().st_size > 0, name
