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
    assert set(res["arms"]) == {"GRPO (per-step)", "DMPO, right images only", "DMPO, group baseline", "RFT"}
    # the baselines an RL row must beat: the clean-caption masked base, best-of-n from the base, RFT at the same rollouts
    assert res["reference"]["model"] == "shapes-masked-clean" and len(res["reference"]["items"]) == len(res["test_prompts"])
    assert {"best-of-1 (base)", "clean-caption base (same compute)", "RFT"} <= set(res["rows"])
    assert res["arms"]["RFT"][0]["rft"]["sampled"] == res["configs"]["GRPO (per-step)"]["max_steps"] * 16
    assert {"DMPO, right images only - RFT", "GRPO (per-step) - RFT"} <= set(res["differences"])
    assert res["seeds_run"] == 1 and len(res["base_weights_sha256"]) == 64
    assert set(res["diagnostics"]["DMPO, right images only"]) >= {"reward_first", "reward_last", "kl_last", "neg_weight_frac"}
    assert "training diagnostics" in res["table"]
    a, b = res["configs"]["GRPO (per-step)"], res["configs"]["DMPO, right images only"]
    shared = {k for k in a if k in b and a[k] == b[k]}
    assert {"family", "model_name_or_path", "num_generations", "learning_rate", "max_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps", "temperature", "cfg_scale"} <= shared
    assert a["family"] == "masked_image" and a["logprob_estimator"] == "per_step"
    assert set(res["before"]) == set(TASKS) | {"overall"}
    for name in ("table.md", "accuracy.png", "reward.png", "grid.png"):
        assert (root / name).stat().st_size > 0, name


def test_run_order_arm_major_by_default_seed_major_for_a_cutoff():
    from mmrl.tiny_world.shapes_rl import run_order

    assert run_order(["A", "B"], 2) == [("A", 0), ("A", 1), ("B", 0), ("B", 1)]
    assert run_order(["A", "B"], 2, seed_major=True) == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]


def test_training_diagnostics_by_hand():
    from mmrl.tiny_world.shapes_rl import training_diagnostics

    key = "rewards/geneval_strict/mean"
    run1 = [{"step": s, key: r, "diag/kl_k3": 0.01 * s, "diag/neg_weight_frac": n}
            for s, r, n in [(1, 0.1, 0.0), (2, 0.2, 0.5), (3, 0.3, 0.1), (4, 0.5, 0.2)]]
    run2 = [{"step": 1, key: 0.4}, {"step": 2, key: 0.0}]  # no KL, no weights logged: left out of those means
    d = training_diagnostics([run1, run2], key, k=2)
    assert d["reward_first"] == pytest.approx(((0.1 + 0.2) / 2 + (0.4 + 0.0) / 2) / 2)
    assert d["reward_last"] == pytest.approx(((0.3 + 0.5) / 2 + (0.4 + 0.0) / 2) / 2)
    assert d["kl_last"] == pytest.approx(0.04)
    assert d["neg_weight_frac"] == pytest.approx(0.2)
    assert math.isnan(training_diagnostics([[]], key)["kl_last"])


def test_base_weights_digest_reads_the_build_record(tmp_path):
    from mmrl.tiny_world.shapes_rl import base_weights_digest

    assert base_weights_digest(tmp_path) == "unknown"
    (tmp_path / "tiny_spec.json").write_text(json.dumps({"weights_sha256": "ab" * 32}))
    assert base_weights_digest(tmp_path) == "ab" * 32


def test_masked_arms_share_dmpo_settings_and_differ_in_the_baseline_only():
    from mmrl.tiny_world.masked_image_rl import ARMS

    labels = list(ARMS)
    assert labels[0] == "GRPO (per-step)" and ARMS[labels[1]]["dmpo_baseline"] == "correct_only"
    a, b = ARMS["DMPO, right images only"], ARMS["DMPO, group baseline"]
    assert {k for k in a if a[k] != b.get(k)} == {"dmpo_baseline"} and a["num_iterations"] == 1


def test_dmpo_vs_grpo_masked_rejects_a_bad_cutoff(tmp_path):
    with pytest.raises(SystemExit, match="cutoff must be a UTC clock time"):
        main(["replicate", "dmpo-vs-grpo-masked", "--smoke", "--seeds", "1", "--cutoff", "soon", "--out", str(tmp_path)])


def test_dmpo_vs_grpo_masked_rejects_an_unknown_arm(tmp_path):
    with pytest.raises(SystemExit, match="unknown arms"):
        main(["replicate", "dmpo-vs-grpo-masked", "--smoke", "--seeds", "1", "--arm", "PPO", "--out", str(tmp_path)])
