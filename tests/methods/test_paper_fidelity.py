"""Paper recipes that match the authors' code (issue 14): prompts, metrics, samplers, losses and optimizer settings.

Expected values are written by hand from reading the authors' code (dllm-reasoning/d1 at 837888f,
yuchen-zhu-zyc/DMPO at 96af1a4, jacklishufan/gcpo at e0f183d); the file each one comes from is named beside it.
"""
from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from mmrl.config.train_config import _public_fields, load_config
from mmrl.data.tasks import REASONING_PREFILL, d1_eval_prompt, d1_sudoku_test, load_task
from mmrl.models import adapter_class
from mmrl.rewards import REWARDS

ROOT = Path(__file__).resolve().parents[2]
MDA = adapter_class("masked_diffusion")


# ------------------------------------------------------------------------------ local copies of the task data


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def task_dirs(tmp_path):
    gsm = tmp_path / "gsm8k"
    gsm.mkdir()
    _write_jsonl(gsm / "train.jsonl", [{"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}])
    _write_jsonl(gsm / "test.jsonl", [{"question": "What is 4+4?", "answer": "4+4=8\n#### 8"}])
    math = tmp_path / "math500"
    math.mkdir()
    _write_jsonl(math / "train.jsonl", [{"problem": "Compute 1/2 + 1/2.", "solution": "It is $\\boxed{1}$."}])
    _write_jsonl(math / "test.jsonl", [{"problem": "Compute 1/4 + 1/4.", "solution": "It is $\\boxed{\\frac{1}{2}}$."}])
    cd = tmp_path / "countdown.jsonl"
    _write_jsonl(cd, [{"nums": [1, 2, 3], "target": 6}])
    sudoku = tmp_path / "sudoku.csv"
    sudoku.write_text("Puzzle,Solution\n1030040100000000,1234341221434321\n")
    return {"gsm8k": str(gsm), "math500": str(math), "countdown": str(cd), "sudoku": str(sudoku)}


# ------------------------------------------------------------------------------ 1. conversational prompts


def test_builtin_tasks_emit_one_user_message(task_dirs):
    # d1 diffu-grpo/data_utils.py: "prompt": [{"role": "user", "content": SYSTEM_PROMPT + ...}]
    for name, path in task_dirs.items():
        task = load_task(name, path)
        for row in task.train[:1] + task.test[:1]:
            prompt = row["prompt"]
            assert isinstance(prompt, list) and len(prompt) == 1, name
            assert prompt[0]["role"] == "user" and "<answer>" in prompt[0]["content"], name


def test_chat_prompts_get_the_template_in_every_text_family():
    prompt = [{"role": "user", "content": "2+2?"}]
    md = MDA.tiny(seed=0)  # char tokenizer with a template: "<|role|>content\n" lines, then "<|assistant|>"
    ids, _ = md.encode_prompts([prompt])
    assert md.tokenizer.decode(ids[0].tolist()) == "<|user|>2+2?\n<|assistant|>"
    ar = adapter_class("causal_lm").tiny(seed=0)
    ar_ids, _ = ar.encode_prompts([prompt])
    assert ar.tokenizer.decode(ar_ids[0]) == "<|user|>2+2?\n<|assistant|>"


def test_d1_eval_prompt_prefills_reasoning_after_the_template():
    # d1 eval/gsm8k.py create_prompt: apply_chat_template(..., add_generation_prompt=True) + "<reasoning>"
    prompt = d1_eval_prompt([{"role": "user", "content": "2+2?"}])
    assert prompt[-1] == {"role": "assistant", "content": REASONING_PREFILL} and REASONING_PREFILL == "<reasoning>"
    md = MDA.tiny(seed=0)
    ids, _ = md.encode_prompts([prompt])
    assert md.tokenizer.decode(ids[0].tolist()) == "<|user|>2+2?\n<|assistant|><reasoning>"
    ar = adapter_class("causal_lm").tiny(seed=0)
    assert ar.tokenizer.decode(ar.encode_prompts([prompt])[0][0]) == "<|user|>2+2?\n<|assistant|><reasoning>"
    assert d1_eval_prompt("plain text") == "plain text"  # tiny-world string prompts are left alone


def test_no_chat_template_warns_once_and_uses_the_plain_text():
    md = MDA.tiny(seed=0)
    md.tokenizer.chat_template = None
    with pytest.warns(UserWarning, match="no chat template"):
        ids, _ = md.encode_prompts([[{"role": "user", "content": "2+2?"}]])
    assert md.tokenizer.decode(ids[0].tolist()) == "2+2?"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second call is quiet, and string prompts never warn
        md.encode_prompts([[{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "<reasoning>"}]])
        md.encode_prompts(["plain"])
    assert md.tokenizer.decode(md.encode_prompts([[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]])[0][0].tolist()) == "a\nb"


# ------------------------------------------------------------------------------ 2. metrics are accuracies


def test_every_text_task_metric_is_one_for_correct_and_zero_otherwise(task_dirs):
    # d1 / DMPO eval/parse_and_get_acc.py count a correct answer once; training rewards keep their scales
    right = {"gsm8k": "<reasoning>\n4+4\n</reasoning>\n<answer>\n\\boxed{8}\n</answer>",
             "math500": "<answer>\\boxed{\\frac12}</answer>",
             "countdown": "<answer>(1+2)*3</answer>",
             "sudoku": "<answer>1234341221434321</answer>"}
    wrong = {"gsm8k": "<answer>9</answer>", "math500": "<answer>\\boxed{2}</answer>", "countdown": "<answer>1+2+3+1</answer>",
             "sudoku": "<answer>1131142112111112</answer>"}  # every blank wrong
    for name, path in task_dirs.items():
        task = load_task(name, path)
        row = dict(task.test[0]) if name not in ("countdown", "sudoku") else None
        if name == "countdown":
            row = {"numbers": [1, 2, 3], "target": 9}
        if name == "sudoku":
            row = {"puzzle": "1030040100000000", "solution": "1234341221434321"}
        cols = {k: [v, v] for k, v in row.items() if k != "prompt"}
        scores = REWARDS[task.metric]([None, None], [right[name], wrong[name]], **cols)
        assert [float(s) for s in scores] == [1.0, 0.0], (name, task.metric, scores)
    # the MATH training reward keeps d1's 2.0, the Countdown one its 0.1 for a wrong tagged answer
    assert REWARDS["math500_correctness"]([None], [right["math500"]], answer=["\\frac{1}{2}"]) == [2.0]
    assert REWARDS["countdown"]([None], [wrong["countdown"]], numbers=[[1, 2, 3]], target=[9]) == [0.1]


def test_countdown_accuracy_reads_the_boxed_expression_like_the_authors_parser():
    # DMPO eval/parse_and_get_acc.py parse_countdown_answers: last \boxed first, LaTeX operators, "= target" cut
    acc = REWARDS["countdown_accuracy"]
    comps = ["\\boxed{(1+2) \\times 3}", "<answer>(1+2)*3 = 9</answer>", "<answer>\\boxed{3 \\cdot (2+1)}</answer>",
             "(1+2)*3", "<answer>1*2*3</answer>"]
    assert acc([None] * 5, comps, numbers=[[1, 2, 3]] * 5, target=[9] * 5) == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert REWARDS["countdown3_accuracy"]([None] * 2, ["(1+2)*3", "1+2+3"], numbers=[[1, 2, 3]] * 2, target=[9] * 2) == [1.0, 0.0]
    assert load_task("countdown3").metric == "countdown3_accuracy"


# ------------------------------------------------------------------------------ 4. DMPO's training sampler


def test_dmpo_presets_sample_like_the_authors_config():
    # DMPO dmpo_train_config.yaml: pd_cache_prefix, sampler_steps 128, low_confidence, temperature 0.2, block 32,
    # sampler_threshold_pd null (fixed 2 tokens per step)
    cfg = load_config(ROOT / "configs" / "dmpo_llada_8b_gsm8k.yaml")
    assert (cfg.sampler, cfg.diffusion_cache, cfg.diffusion_steps, cfg.temperature, cfg.block_length) == (
        "low_confidence", "prefix", 128, 0.2, 32)
    assert cfg.max_completion_length / cfg.diffusion_steps == 2
    from mmrl.training.policy_factory import generation_options

    assert generation_options(cfg)["cache"] == "prefix" and generation_options(cfg)["sampler"] == "low_confidence"
    # Dream: DMPO eval/eval_dream.py diffusion_generate(..., temperature=0.2, top_p=0.95, alg="entropy")
    dream = load_config(ROOT / "configs" / "dmpo_dream_7b.yaml")
    assert (dream.sampler, dream.temperature, generation_options(dream)["top_p"]) == ("entropy", 0.2, 0.95)


# ------------------------------------------------------------------------------ 5. diffu-GRPO's loss and optimizer


def test_d1_preset_optimizer_and_loss_follow_train_yaml():
    # d1 diffu-grpo/slurm_scripts/train.yaml: max_grad_norm 0.2, adam_beta2 0.99, weight_decay 0.1,
    # constant_with_warmup, warmup_ratio 0.0001, lr 3e-6, seed 42; TRL's token mean per micro-batch
    cfg = load_config(ROOT / "configs" / "d1_diffu_grpo_llada_8b.yaml")
    assert (cfg.max_grad_norm, cfg.adam_beta1, cfg.adam_beta2, cfg.weight_decay) == (0.2, 0.9, 0.99, 0.1)
    assert (cfg.lr_scheduler_type, cfg.warmup_ratio, cfg.learning_rate, cfg.seed) == ("constant_with_warmup", 0.0001, 3e-6, 42)
    assert cfg.loss_type == "bnpo" and cfg.max_prompt_length == 200
    assert load_config(None, {"method": "diffu_grpo"}).loss_type == "bnpo"


def _loss_of_one_step(tmp_path, loss_type, monkeypatch):
    """The trainer's reported loss for one step with the per-token loss replaced by each row's length
    (so the expected value follows from the buffer's masks by hand)."""
    import mmrl.training.trainer as trainer_mod

    def fake_policy_loss(logp, old, adv, mask, **kw):
        per_token = logp * 0 + mask.sum(-1, keepdim=True).float()  # [n, T] every token of row i worth L_i
        return per_token, {}

    import mmrl.methods.policy_gradient as pg_mod

    monkeypatch.setattr(pg_mod, "surrogate_loss", lambda loss_type: fake_policy_loss)  # the loss_type's per-token loss
    cfg = load_config(None, dict(method="grpo", family="causal_lm", loss_type=loss_type, max_steps=1, num_generations=2,
                                 per_device_train_batch_size=2, gradient_accumulation_steps=2, max_completion_length=8,
                                 output_dir=str(tmp_path / loss_type), progress_bar=False, save_steps=0, report_to=["jsonl"]))
    from tiny_world_fixtures import dataset_for, vowel_reward

    t = trainer_mod.Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"),
                            reward_funcs=[vowel_reward])
    out = t.train()
    return out["loss"], t.buffer.loss_mask.sum(-1).float()


def test_bnpo_averages_the_token_means_of_the_micro_batches(tmp_path, monkeypatch):
    loss, lengths = _loss_of_one_step(tmp_path, "bnpo", monkeypatch)
    mb = [lengths[:2], lengths[2:]]
    expected = sum(float((L * L).sum() / L.sum()) for L in mb) / 2  # mean over micro-batches of sum L_i^2 / sum L_i
    assert loss == pytest.approx(expected, rel=1e-5)
    loss_dapo, lengths = _loss_of_one_step(tmp_path, "dapo", monkeypatch)
    assert loss_dapo == pytest.approx(float((lengths * lengths).sum() / lengths.sum()), rel=1e-5)


# ------------------------------------------------------------------------------ 6. DMPO's group baseline


def test_micro_batch_mean_baseline_is_the_authors_code_group_baseline():
    from mmrl.algorithms.dmpo import micro_batch_mean_baseline

    # one group of 4 split into micro-batches of 2 (as DMPO's 16 over 2 devices x 8): weights 0.7 0.1 | 0.1 0.1
    w = torch.tensor([0.7, 0.1, 0.1, 0.1])
    assert micro_batch_mean_baseline(w[:2]).tolist() == pytest.approx([0.4, 0.4])
    assert micro_batch_mean_baseline(w[2:]).tolist() == pytest.approx([0.1, 0.1])
    # the paper's eq. 13 (1/G) stays the "group" default of the per-task presets
    assert load_config(ROOT / "configs" / "dmpo_llada_8b_gsm8k.yaml").dmpo_baseline == "group"
    assert load_config(None, {"method": "dmpo", "dmpo_baseline": "micro_batch_mean"}).dmpo_baseline == "micro_batch_mean"


def test_micro_batch_mean_baseline_in_a_training_step(tmp_path):
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for, vowel_reward

    cfg = load_config(None, dict(method="dmpo", family="causal_lm", dmpo_baseline="micro_batch_mean", max_steps=1,
                                 num_generations=4, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                                 max_completion_length=6, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
                                 report_to=["jsonl"]))
    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    t.train()
    w, credit, mask = t.buffer.method_state["weights"], t.buffer.credit, t.buffer.loss_mask
    for idx in (slice(0, 2), slice(2, 4)):
        expected = w[idx] - w[idx].mean()
        got = credit[idx].sum(-1) / mask[idx].sum(-1)
        torch.testing.assert_close(got, expected.float(), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------ 7. every config field takes effect


def test_max_prompt_length_truncates_prompts_on_the_left():
    from mmrl.training.policy_factory import generation_options, set_generation_defaults

    cfg = load_config(None, {"family": "masked_diffusion", "max_prompt_length": 4})
    md = MDA.tiny(seed=0)
    set_generation_defaults(md, generation_options(cfg))
    ids, mask = md.encode_prompts(["abcdefgh"])
    assert md.tokenizer.decode(ids[0].tolist()) == "efgh"  # d1 / TRL keep the last max_prompt_length tokens
    rollout = md.sample(["abcdefgh", "xy"], 1, seeds=[0, 1], gen_length=4)
    assert rollout.prompt_ids.shape[1] == 4
    ar = adapter_class("causal_lm").tiny(seed=0)
    set_generation_defaults(ar, generation_options(load_config(None, {"max_prompt_length": 3})))
    assert ar.tokenizer.decode(ar.encode_prompts(["abcdefgh"])[0][0]) == "fgh"


def test_dmpo_min_mask_rate_reaches_the_wdce_masks(tmp_path, monkeypatch):
    md = MDA.tiny(seed=0)
    rollout = md.sample(["ab", "cd"], 2, seeds=[0, 1, 2, 3], gen_length=8)
    nb = md.forward_noise(rollout, 4, torch.Generator().manual_seed(0), min_rate=0.9)
    assert bool((nb.rates[:2] >= 0.9).all()) and bool((nb.rates[2:] <= 0.1 + 1e-6).all())  # antithetic halves
    seen = []
    original = type(md).forward_noise

    def spy(self, *a, **kw):
        seen.append(kw.get("min_rate"))
        return original(self, *a, **kw)

    monkeypatch.setattr(type(md), "forward_noise", spy)
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for, vowel_reward

    cfg = load_config(None, dict(method="dmpo", family="masked_diffusion", dmpo_min_mask_rate=0.35, max_steps=1, num_generations=2,
                                 per_device_train_batch_size=2, max_completion_length=4, block_length=4, output_dir=str(tmp_path),
                                 progress_bar=False, save_steps=0, report_to=["jsonl"], dmpo_target="behaviour"))
    Trainer(cfg, policy=md, dataset=dataset_for("masked_diffusion"), reward_funcs=[vowel_reward]).train()
    assert seen and set(seen) == {0.35}


def test_dmpo_min_mask_rate_reaches_the_elbo_masks():
    """The authors clamp the ELBO copies' mask rates too (DMPO `compute_log_prob_elbo`, `loss_mask_prob_clamp`)."""
    from mmrl.models.dllm_estimators import elbo_masks
    from mmrl.models import adapter_class

    _, rates = elbo_masks([1, 2, 3], 4, 16, "cpu", min_rate=0.9)
    assert bool((rates[:2] >= 0.9).all()) and bool((rates[2:] <= 0.1 + 1e-6).all())  # antithetic halves
    cfg = load_config(None, dict(method="dmpo", family="masked_diffusion", dmpo_min_mask_rate=0.35))
    for family in ("masked_diffusion", "masked_image"):
        assert adapter_class(family).estimator_options(cfg, 0, kind="elbo")["min_mask_rate"] == 0.35
    md = MDA.tiny(seed=0)
    rollout = md.sample(["ab", "cd"], 2, seeds=[0, 1, 2, 3], gen_length=8)
    low = md.logprob(rollout, estimator="elbo", mask_seed=5, min_mask_rate=0.0).logp
    high = md.logprob(rollout, estimator="elbo", mask_seed=5, min_mask_rate=0.9).logp
    assert not torch.allclose(low, high)


def _field_reads_outside_config() -> set[str]:
    """Field names read anywhere in mmrl/, models/ or rewards/ besides config.py (attribute or string key), plus the
    fields config.py's own properties read when the property is read elsewhere."""
    files = [p for d in ("mmrl", "models", "rewards") for p in (ROOT / d).rglob("*.py") if p != ROOT / "mmrl" / "config" / "train_config.py"]
    text = "\n".join(p.read_text() for p in files)
    read = {name for name in _public_fields() if re.search(rf"\.{name}\b|[\"']{name}[\"']", text)}
    tree = ast.parse((ROOT / "mmrl" / "config" / "train_config.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and any(getattr(d, "id", None) == "property" for d in fn.decorator_list):
            if re.search(rf"\.{fn.name}\b", text):
                read |= {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr in _public_fields()}
    return read


def test_every_config_field_is_read_somewhere():
    unread = sorted(set(_public_fields()) - _field_reads_outside_config())
    assert not unread, f"TrainConfig fields that nothing reads (documented but without effect): {unread}"


# ------------------------------------------------------------------------------ 8. evaluation protocols


def test_d1_and_dmpo_protocols_name_their_steps():
    from mmrl.training.evaluate import d1_generation, dmpo_generation, protocol_generation

    # d1 eval/eval.py: diffusion_steps = gen_length // 2; DMPO eval/eval.py --full_steps: diffusion_steps = gen_length
    assert d1_generation("masked_diffusion", 256)["steps"] == 128
    assert dmpo_generation("masked_diffusion", 256)["steps"] == 256
    for gen in (protocol_generation("d1", "masked_diffusion", 512), protocol_generation("dmpo", "masked_diffusion", 512)):
        assert (gen["temperature"], gen["block_length"], gen["sampler"]) == (0.0, 32, "low_confidence")
    with pytest.raises(ValueError, match="d1.*dmpo"):
        protocol_generation("paper", "masked_diffusion")


def test_sudoku_protocol_rows_are_the_authors_seeded_256():
    # d1 / DMPO eval: init_seed(42) -> np.random.seed(42); SudokuDataset: np.random.choice(500, 256, replace=False)
    np.random.seed(42)
    idx = np.random.choice(500, 256, replace=False)
    full = d1_sudoku_test()
    rows = d1_sudoku_test(256)
    assert [r["puzzle"] for r in rows] == [full[int(i)]["puzzle"] for i in idx]
    assert len({r["puzzle"] for r in rows}) == 256


def test_mmrl_eval_protocol_from_the_command_line(task_dirs, monkeypatch):
    import mmrl.training.evaluate as ev
    import mmrl.models as models
    from mmrl.cli import main

    seen = {}

    def fake_evaluate(policy, rows, metric, **kw):
        seen.update(rows=rows, metric=metric, gen=kw)
        return ev.EvalResult("sudoku", metric, 0.0, len(rows), 0.0)

    monkeypatch.setattr(ev, "evaluate", fake_evaluate)
    monkeypatch.setattr(models, "load_policy", lambda *a, **k: MDA.tiny(seed=0))
    args = ["eval", "--family", "masked_diffusion", "--model", "m", "--task", "sudoku", "--dataset-path", task_dirs["sudoku"],
            "--gen-length", "64"]
    assert main(args + ["--protocol", "d1"]) == 0
    assert len(seen["rows"]) == 256 and seen["gen"]["steps"] == 32 and seen["metric"] == "sudoku"
    assert seen["rows"][0]["prompt"][-1] == {"role": "assistant", "content": "<reasoning>"}
    assert main(args + ["--protocol", "dmpo"]) == 0
    assert len(seen["rows"]) == 256 and seen["gen"]["steps"] == 64
    assert main(args + ["--protocol", "none"]) == 0
    assert len(seen["rows"]) == 500 and seen["rows"][0]["prompt"][-1]["role"] == "user"


# ------------------------------------------------------------------------------ 10. preset comments


def test_presets_name_the_authors_file_and_their_differences():
    for name in ("d1_diffu_grpo_llada_8b", "dmpo_llada_8b", "gcpo_janus_pro_7b_geneval", "gcpo_qwen25_vl_7b", "dmpo_dream_7b"):
        header = (ROOT / "configs" / f"{name}.yaml").read_text().split("\n\n")[0]
        assert "authors' code" in header and "differ" in header, name


# ------------------------------------------------------------------------------ 9. GCPO T2I's entropy reward


def test_stage_entropy_bonus_on_hand_computed_groups():
    from mmrl.algorithms.entropy_reward import stage_entropy_bonus

    # gcpo t2i grpo_trainer.py: e = 1/(1+(H_ref-H)^2) for the max-reward images, r += 0.4 (e - mean of those e)
    rewards = torch.tensor([1.0, 0.5, 1.0, 0.0, 0.2, 0.7, 0.1, 0.7])
    h = torch.tensor([2.0, 9.0, 3.0, 9.0, 9.0, 5.0, 9.0, 5.0])
    h_ref = torch.tensor([2.0, 1.0, 4.0, 1.0, 1.0, 7.0, 1.0, 5.0])
    bonus = stage_entropy_bonus(rewards, h, h_ref, 4, coeff=0.4)
    # group 1: top rows 0 and 2, e = 1 and 1/2, mean 3/4 -> +0.1, -0.1; group 2: top rows 5 and 7, e = 1/5 and 1
    expected = [0.1, 0.0, -0.1, 0.0, 0.0, 0.4 * (0.2 - 0.6), 0.0, 0.4 * (1.0 - 0.6)]
    torch.testing.assert_close(bonus, torch.tensor(expected), atol=1e-6, rtol=0)
    # a single top image gets no bonus (e minus its own mean)
    assert stage_entropy_bonus(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 5.0]), torch.tensor([3.0, 1.0]), 2).tolist() == [0.0, 0.0]


def test_gcpo_janus_preset_turns_the_entropy_reward_on(tmp_path):
    cfg = load_config(ROOT / "configs" / "gcpo_janus_pro_7b_geneval.yaml")
    assert cfg.gcpo_entropy_reward == 0.4
    from mmrl.training.policy_factory import needs_reference
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for

    run = load_config(None, dict(method="gcpo", family="janus", gcpo_entropy_reward=0.4, max_steps=1, num_generations=4,
                                 per_device_train_batch_size=4, dynamic_sampling=False, output_dir=str(tmp_path),
                                 progress_bar=False, save_steps=0, report_to=["jsonl"]))
    assert needs_reference(run)

    def ties(prompts, completions, **kw):  # two images tie for the maximum in every group
        return [1.0, 1.0, 0.0, 0.5] * (len(completions) // 4)

    t = Trainer(run, policy=adapter_class("janus").tiny(seed=0), dataset=dataset_for("janus"), reward_funcs=[ties])
    t.policy.ref_model.requires_grad_(False)
    with torch.no_grad():  # a different reference, so the entropies differ
        for p in t.policy.ref_model.parameters():
            p.mul_(3.0)
    t.train()
    r = t.buffer.rewards.view(-1, 4)
    assert torch.equal(r[:, 2:], torch.tensor([[0.0, 0.5]]).expand_as(r[:, 2:]))  # only the top images move
    torch.testing.assert_close(r[:, :2].sum(-1), torch.full((r.shape[0],), 2.0), atol=1e-6, rtol=0)  # bonuses sum to 0
    assert bool((r[:, :2] != 1.0).any())


def test_vlm_continues_a_prefilled_assistant_turn():
    vlm = adapter_class("vlm").tiny(seed=0)
    plain, _ = vlm.encode_prompts([[{"role": "user", "content": "2+2?"}]])
    prefilled, _ = vlm.encode_prompts([d1_eval_prompt([{"role": "user", "content": "2+2?"}])])
    tok = vlm.processor.tokenizer
    assert tok.decode(prefilled[0]) == tok.decode(plain[0]) + "<reasoning>"


def test_protocol_rows_use_the_authors_evaluation_instructions(task_dirs):
    from mmrl.training.evaluate import protocol_rows

    # d1 eval/gsm8k.py, eval/math500.py: "Wrap the final answer in a \boxed{}", <answer> holds \boxed{...};
    # eval/countdown.py: the expression in \boxed{}, question "Numbers: [...]\nTarget: ..."
    gsm = protocol_rows(load_task("gsm8k", task_dirs["gsm8k"]))[0]["prompt"]
    assert gsm[0]["role"] == "user" and "\\boxed{}" in gsm[0]["content"] and gsm[0]["content"].endswith("\n\nWhat is 4+4?")
    assert gsm[1] == {"role": "assistant", "content": "<reasoning>"}
    math = protocol_rows(load_task("math500", task_dirs["math500"]))[0]["prompt"]
    assert math[0]["content"].endswith("\n\nCompute 1/4 + 1/4.") and "\\boxed{...}" in math[0]["content"]
    cd = protocol_rows(load_task("countdown", task_dirs["countdown"]))
    assert len(cd) == 256  # DMPO: subsample 256 of the 256 rows of countdown_cd3_test.jsonl
    assert "\\boxed{}" in cd[0]["prompt"][0]["content"]
    assert cd[0]["prompt"][0]["content"].endswith(f"\n\nNumbers: {cd[0]['numbers']}\nTarget: {cd[0]['target']}")
