"""One optimizer step per rollout (`num_iterations = 1`): the trainer takes the behaviour log-probs, the entropy and
DGPO's statistics from the gradient forward instead of a separate no-grad forward (`behaviour_is_current`).

The shortcut must change nothing but the work: the same run with the separate forward switched back on ends with the
same weights and the same metrics, and the shortcut runs fewer forwards."""
import json

import pytest
import torch

import mmrl.training.trainer as trainer_module
from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer, behaviour_is_current
from tiny_world_fixtures import dataset_for, reward_for

CASES = [
    ("causal_lm", "grpo", {"beta": 0.0}),
    ("causal_lm", "grpo", {"beta": 0.04}),
    ("causal_lm", "gcpo", {}),
    ("causal_lm", "dgpo", {}),
    ("causal_lm", "dgpo", {"beta": 0.04}),
    ("masked_diffusion", "diffu_grpo", {}),
    ("masked_diffusion", "dgpo", {}),
]

METRICS = ("loss", "grad_norm", "entropy", "kl", "dgpo/weight_mean", "dgpo/weight_std", "dgpo/weight_max", "dgpo/h2_mean",
           "gcpo/weight_std", "clip_ratio/region_mean")


def run(method, family, extra, out, monkeypatch, *, shortcut: bool):
    monkeypatch.setattr(trainer_module, "behaviour_is_current", behaviour_is_current if shortcut else (lambda cfg: False))
    values = dict(method=method, family=family, max_steps=2, num_generations=4, per_device_train_batch_size=4,
                  gradient_accumulation_steps=2, learning_rate=1e-2, max_completion_length=8, block_length=4,
                  output_dir=str(out), progress_bar=False, dynamic_sampling=False, num_iterations=1, save_steps=0,
                  report_to=["jsonl"], seed=0)
    values.update(extra)
    cfg = load_config(None, values)
    policy = adapter_class(family).tiny(seed=0)
    calls = {"n": 0}
    real = policy.logprob

    def counting(*a, **kw):  # the real method, counted: one call = one policy forward (+ its other side)
        calls["n"] += 1
        return real(*a, **kw)

    policy.logprob = counting
    Trainer(cfg, policy=policy, dataset=dataset_for(family), reward_funcs=[reward_for(family)]).train()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}, records, calls["n"]


@pytest.mark.parametrize("family,method,extra", CASES, ids=[f"{f}-{m}-{e}" for f, m, e in CASES])
def test_shortcut_gives_the_same_training(family, method, extra, tmp_path, monkeypatch):
    fast_w, fast_m, fast_calls = run(method, family, extra, tmp_path / "fast", monkeypatch, shortcut=True)
    slow_w, slow_m, slow_calls = run(method, family, extra, tmp_path / "slow", monkeypatch, shortcut=False)
    for name in slow_w:
        torch.testing.assert_close(fast_w[name], slow_w[name], rtol=0, atol=1e-6, msg=name)
    assert len(fast_m) == len(slow_m) == 2
    for f, s in zip(fast_m, slow_m):
        for key in METRICS:
            assert (key in f) == (key in s), key
            if key in s:
                assert f[key] == pytest.approx(s[key], rel=1e-5, abs=1e-6), (key, f[key], s[key])
    assert "entropy" in fast_m[0] and fast_m[0]["entropy"] > 0
    if method == "dgpo":
        assert fast_m[0]["dgpo/weight_mean"] == pytest.approx(1.0, abs=1e-4)
    # 2 steps x 2 micro-batches: the shortcut drops exactly the behaviour forward of each micro-batch
    assert slow_calls - fast_calls == 4, (slow_calls, fast_calls)


def test_shortcut_only_for_one_step_per_rollout():
    assert behaviour_is_current(load_config(None, dict(method="grpo", num_iterations=1)))
    assert not behaviour_is_current(load_config(None, dict(method="grpo", num_iterations=2)))
    assert not behaviour_is_current(load_config(None, dict(method="dmpo", num_iterations=1)))
