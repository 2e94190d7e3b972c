"""Sequence-classification reward models as rewards (TRL's `reward_funcs="<reward model>"`): a local directory or a
model object, scored on the chat-formatted prompt + completion (plain: the concatenated strings) as TRL does;
evaluation with the training rewards or `eval_reward_funcs` instead of a task metric."""
from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.models import adapter_class
from mmrl.rewards import RewardSet
from mmrl.rewards.reward_model import SequenceClassifierReward, is_reward_model_dir
from mmrl.training.trainer import Trainer


def tiny_reward_model(path):
    """A tiny random Qwen2ForSequenceClassification (1 label) over the offline char tokenizer, saved to `path`."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from mmrl.models.tokenizers import char_tokenizer

    tok = char_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, num_labels=1, pad_token_id=tok.pad_token_id)
    model = Qwen2ForSequenceClassification(cfg).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok


def one_by_one(model, tok, texts):
    """The reference: each text alone, no padding, no special tokens."""
    out = []
    with torch.no_grad():
        for t in texts:
            enc = tok(text=[t], return_tensors="pt", add_special_tokens=False)
            out.append(float(model(**enc).logits[0, 0]))
    return out


def test_plain_and_conversational_samples_score_as_trl_scores_them(tmp_path):
    model, tok = tiny_reward_model(tmp_path / "tiny-rm")
    assert is_reward_model_dir(tmp_path / "tiny-rm") and not is_reward_model_dir(tmp_path)
    rm = SequenceClassifierReward(str(tmp_path / "tiny-rm"))
    assert rm.__name__ == "tiny-rm"
    prompts, completions = ["2+2=", "say a"], ["4", "a long answer"]
    # right padding of the batch changes nothing: the model reads the last non-pad token
    model, tok = rm.model, rm.tokenizer  # as loaded from the directory
    assert rm(prompts, completions) == pytest.approx(one_by_one(model, tok, ["2+2=4", "say aa long answer"]), abs=1e-5)
    chat_p = [[{"role": "user", "content": "2+2="}], [{"role": "user", "content": "say a"}]]
    chat_c = [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "aaa"}]]
    want_texts = ["<|user|>2+2=\n<|assistant|>4\n", "<|user|>say a\n<|assistant|>aaa\n"]  # the char template, by hand
    assert rm.texts(chat_p, chat_c) == want_texts
    assert rm(chat_p, chat_c) == pytest.approx(one_by_one(model, tok, want_texts), abs=1e-5)
    trl_utils = pytest.importorskip("trl.data_utils")  # TRL's own formatting, where installed
    assert [trl_utils.apply_chat_template({"messages": p + c}, tok)["text"] for p, c in zip(chat_p, chat_c)] == want_texts


def test_reward_models_in_a_reward_set_by_path_and_object(tmp_path):
    model, tok = tiny_reward_model(tmp_path / "rm")

    def length(completions, **kw):
        return [float(len(c)) for c in completions]

    rs = RewardSet([str(tmp_path / "rm"), length], [0.5, 1.0])
    assert rs.names == ["rm", "length"]
    out = rs(["ab", "c"], ["x", "yz"])
    loaded = rs.rewards[0].fn
    ref = one_by_one(loaded.model, loaded.tokenizer, ["abx", "cyz"])
    assert out.per_reward["rm"].tolist() == pytest.approx(ref, abs=1e-5)
    assert out.total.tolist() == pytest.approx([0.5 * ref[0] + 1.0, 0.5 * ref[1] + 2.0], abs=1e-5)
    from transformers import AutoModelForSequenceClassification

    obj = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert RewardSet([obj]).names == ["rm"]  # TRL's name: the last part of name_or_path


def test_training_with_a_reward_model_and_evaluating_with_the_training_rewards(tmp_path):
    tiny_reward_model(tmp_path / "rm")
    rows = [{"prompt": f"say a {i}"} for i in range(16)]  # no `answer` column: a boxed-accuracy eval would fail
    cfg = load_config(None, dict(family="causal_lm", method="grpo", max_steps=2, num_generations=4, per_device_train_batch_size=8,
                                 max_completion_length=6, learning_rate=1e-2, output_dir=str(tmp_path / "run"),
                                 progress_bar=False, save_steps=0, report_to=["jsonl"], reward_funcs=[str(tmp_path / "rm")],
                                 eval_steps=1, eval_limit=4))
    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=rows, eval_dataset=rows[:4])
    last = t.train()
    assert "rewards/rm/mean" in last and "eval/rewards/rm/mean" in last and "eval/accuracy" not in last
    assert last["eval/reward"] == pytest.approx(last["eval/rewards/rm/mean"])  # one reward, weight 1
    assert torch.isfinite(torch.tensor(last["eval/reward"]))


def test_eval_reward_funcs_and_bad_reward_directories(tmp_path):
    tiny_reward_model(tmp_path / "rm")
    rows = [{"prompt": f"say a {i}"} for i in range(16)]

    def vowels(completions, **kw):
        return [float(sum(ch in "aeiou" for ch in c)) for c in completions]

    cfg = load_config(None, dict(family="causal_lm", method="grpo", max_steps=1, num_generations=4, per_device_train_batch_size=8,
                                 max_completion_length=6, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0,
                                 report_to=["jsonl"], eval_steps=1, eval_reward_funcs=[str(tmp_path / "rm")]))
    last = Trainer(cfg, [vowels], policy=adapter_class("causal_lm").tiny(seed=0), dataset=rows, eval_dataset=rows[:4]).train()
    assert "eval/rewards/rm/mean" in last and "eval/rewards/vowels/mean" not in last
    (tmp_path / "not_a_model").mkdir()
    with pytest.raises(ConfigError, match="is a directory but holds no sequence-classification model"):
        load_config(None, {"reward_funcs": [str(tmp_path / "not_a_model")]})
