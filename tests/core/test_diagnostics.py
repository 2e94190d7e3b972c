"""The `diag/` diagnostics (mmrl/core/diagnostics.py): hand-computed values and properties of the pure functions, and
2-step tiny trainer runs of every method that write them to metrics.jsonl."""
import json
import math

import pytest
import torch

from mmrl.config.train_config import load_config
from mmrl.core.diagnostics import (
    effective_sample_size,
    finish_step_metrics,
    micro_batch_sums,
    sample_kl,
    snapshot,
    update_size,
    weight_mass,
)
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import CELLS, METHODS, dataset_for, reward_for

LN2 = math.log(2.0)
KEYS = ("diag/kl_k1", "diag/kl_k3", "diag/kl_k1_seq", "diag/kl_k3_seq", "diag/pos_weight_frac", "diag/neg_weight_frac",
        "diag/update_ratio", "diag/update_ratio_max", "diag/update_abs_mean")

# ----------------------------------------------------------------------------------------- pure functions


def _kl_example():
    # row 0: p = (1/2, 1/4) under the policy, (1/4, 1/2) under the reference, one padded token (ignored);
    # row 1: one token, log p = -1, log p_ref = -2
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0], [-1.0, 7.0, 7.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), 5.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    return logp, ref, mask


def test_sample_kl_hand_computed():
    kl = sample_kl(*_kl_example())
    # d = ref - logp: -ln2, +ln2 (row 0), -1 (row 1). k1 = -d: ln2, -ln2, 1. k3 = e^d - d - 1:
    # 1/2 + ln2 - 1 = 0.193147, 2 - ln2 - 1 = 0.306853 (row 0 sum 0.5), e^-1 + 1 - 1 = 0.367879
    assert float(kl["tokens"]) == 3
    assert float(kl["k1"]) == pytest.approx(1 / 3, abs=1e-6)
    assert float(kl["k3"]) == pytest.approx(0.867879 / 3, abs=1e-6)
    assert float(kl["k1_seq"]) == pytest.approx(0.5, abs=1e-6)  # (0 + 1) / 2
    assert float(kl["k3_seq"]) == pytest.approx(0.433940, abs=1e-6)  # (0.5 + 0.367879) / 2


def test_sample_kl_properties():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(6, 9, generator=g) * 3
    ref = -torch.rand(6, 9, generator=g) * 3
    mask = torch.rand(6, 9, generator=g) > 0.3
    same = sample_kl(logp, logp.clone(), mask)
    assert all(float(same[k]) == 0.0 for k in ("k1", "k3", "k1_seq", "k3_seq"))
    kl = sample_kl(logp, ref, mask)
    assert float(kl["k3"]) > 0
    d = (ref - logp)[mask]
    assert bool(((torch.exp(d) - d - 1) >= 0).all())  # k3 >= 0 per token, so its mean is too


def test_weight_mass_hand_computed():
    # per response: 1 on two tokens, -3 on one token, 0.5 on none (masked): pos 2, neg 3
    wm = weight_mass(torch.tensor([1.0, -3.0, 0.5]), torch.tensor([[True, True], [True, False], [False, False]]))
    assert (float(wm["pos"]), float(wm["neg"])) == (2.0, 3.0)
    assert float(wm["pos_frac"]) == pytest.approx(0.4) and float(wm["neg_frac"]) == pytest.approx(0.6)
    # per token: pos 2 + 4 = 6, neg 1 + 1 = 2
    wm = weight_mass(torch.tensor([[2.0, -1.0], [-1.0, 4.0]]), torch.ones(2, 2, dtype=torch.bool))
    assert float(wm["pos_frac"]) == pytest.approx(0.75) and float(wm["neg_frac"]) == pytest.approx(0.25)
    # no weight: no signal, both 0
    wm = weight_mass(torch.zeros(3), torch.ones(3, 2, dtype=torch.bool))
    assert (float(wm["pos_frac"]), float(wm["neg_frac"])) == (0.0, 0.0)


def test_weight_mass_fractions_sum_to_one():
    g = torch.Generator().manual_seed(1)
    for shape in ((5,), (5, 7)):
        wm = weight_mass(torch.randn(*shape, generator=g), torch.rand(5, 7, generator=g) > 0.2)
        assert float(wm["pos_frac"] + wm["neg_frac"]) == pytest.approx(1.0, abs=1e-6)
        assert 0 <= float(wm["pos_frac"]) <= 1


def test_effective_sample_size_hand_computed():
    assert float(effective_sample_size(torch.ones(4))) == pytest.approx(1.0)
    assert float(effective_sample_size(torch.tensor([0.0, 0.0, 3.0, 0.0]))) == pytest.approx(0.25)  # 1 / N
    assert float(effective_sample_size(torch.tensor([1.0, 2.0, 3.0]))) == pytest.approx(36 / 42)  # 6^2 / (3 * 14)
    # per group of 2 (DMPO's weights sum to 1 per group): 1, and 1 / (2 * (0.81 + 0.01)) = 0.609756
    ess = effective_sample_size(torch.tensor([0.5, 0.5, 0.9, 0.1]), 2)
    torch.testing.assert_close(ess, torch.tensor([1.0, 0.609756]), atol=1e-6, rtol=0)


def test_effective_sample_size_is_dmpos_and_bounded():
    from mmrl import algorithms

    assert algorithms.effective_sample_size is effective_sample_size  # one definition
    w = torch.rand(3, 5, generator=torch.Generator().manual_seed(2))
    ess = effective_sample_size(w)
    assert bool(((ess >= 1 / 5 - 1e-6) & (ess <= 1 + 1e-6)).all())


def test_update_size_hand_computed():
    before = [torch.tensor([3.0, 4.0]), torch.tensor([0.0, 0.0])]
    after = [torch.tensor([3.0, 5.0]), torch.tensor([-1.0, 0.0])]
    r = update_size([b.clone() for b in before], after)
    assert r["global"] == pytest.approx(math.sqrt(2) / 5)  # ||(0, 1, -1, 0)|| / ||(3, 4, 0, 0)||
    assert r["max"] == pytest.approx(0.2)  # 1 / 5; the zero tensor has no ratio
    assert r["abs_mean"] == pytest.approx(0.5)  # (0 + 1 + 1 + 0) / 4 elements
    assert update_size([b.clone() for b in before], [b.clone() for b in before]) == {"global": 0.0, "max": 0.0, "abs_mean": 0.0}
    assert update_size([], []) == {"global": 0.0, "max": 0.0, "abs_mean": 0.0}


def test_update_size_of_bf16_weights_is_exact():
    # a bf16 step from 1 to the next bf16 value, 1 + 2^-7, on 1000 weights: the bf16 difference is exact and the sums
    # accumulate in float32 (a bf16 norm would round 31.87 to 31.88)
    before = snapshot([torch.ones(1000, dtype=torch.bfloat16)])
    r = update_size(before, [torch.full((1000,), 1 + 2 ** -7, dtype=torch.bfloat16)])
    assert r["abs_mean"] == 2 ** -7
    assert r["global"] == pytest.approx(2 ** -7, rel=1e-6)


def test_micro_batch_sums_give_the_step_ratios():
    # the trainer averages micro-batch metrics weighted by their rows: the step's numbers are those of the whole batch
    logp, ref, mask = _kl_example()
    weights = torch.tensor([1.0, -3.0])
    parts = [micro_batch_sums(mask[i:i + 1], weights[i:i + 1], logp[i:i + 1], ref[i:i + 1]) for i in range(2)]
    step = {k: (parts[0][k] + parts[1][k]) / 2 for k in parts[0]}
    finish_step_metrics(step, None, [])
    whole = sample_kl(logp, ref, mask)
    assert not [k for k in step if k.startswith("diag/_")]
    assert step["diag/kl_k1"] == pytest.approx(float(whole["k1"]), abs=1e-6)
    assert step["diag/kl_k3"] == pytest.approx(float(whole["k3"]), abs=1e-6)
    assert step["diag/kl_k3_seq"] == pytest.approx(float(whole["k3_seq"]), abs=1e-6)
    assert step["diag/pos_weight_frac"] == pytest.approx(0.4) and step["diag/neg_weight_frac"] == pytest.approx(0.6)


# ---------------------------------------------------------------------------------------------- trainer


def _run(tmp_path, method="grpo", family="causal_lm", zero_lr=False, **extra):
    values = dict(method=method, family=family, max_steps=2, num_generations=4, per_device_train_batch_size=4,
                  learning_rate=1e-2, max_completion_length=8, block_length=4, output_dir=str(tmp_path),
                  progress_bar=False, dynamic_sampling=False, save_steps=0, report_to=["jsonl"], seed=0,
                  gradient_accumulation_steps=2)
    values.update(extra)
    torch.manual_seed(0)
    policy = adapter_class(family).tiny(seed=0)
    trainer = Trainer(load_config(None, values), policy=policy, dataset=dataset_for(family, 8),
                      reward_funcs=[reward_for(family)])
    if zero_lr:  # the config asks for learning_rate > 0; the schedule multiplies its base rate
        trainer.scheduler.base_lrs = [0.0 for _ in trainer.scheduler.base_lrs]
        for group in trainer.optimizer.param_groups:
            group["lr"] = 0.0
    trainer.train()
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


KL_KEYS = KEYS[:4]


def _has_reference(method: str, family: str) -> bool:
    """Whether the run has a reference model without `diagnostics_reference`: a KL term (diffu-GRPO's beta 0.04),
    DGPO's deviation, DMPO's target."""
    return method in ("diffu_grpo", "dgpo", "dmpo")


@pytest.mark.parametrize("method", METHODS)
def test_every_method_logs_the_diagnostics(method, tmp_path):
    runs_on = [f for m, f in CELLS if m == method]  # diffu_grpo on masked diffusion, a method's own family if it has one
    family = "masked_diffusion" if method == "diffu_grpo" else "causal_lm" if "causal_lm" in runs_on else runs_on[0]
    records = _run(tmp_path, method, family, num_iterations=2)
    assert [r["step"] for r in records] == [1, 2]
    for i, r in enumerate(records):
        # DMPO measures the behaviour policy's KL at the first inner step of a buffer (no forward of its own)
        kl_expected = _has_reference(method, family) and not (method == "dmpo" and i > 0)
        for key in KEYS:
            if key in KL_KEYS and not kl_expected:
                assert key not in r, (key, r.get(key))
                continue
            assert key in r and math.isfinite(r[key]), (key, r.get(key))
        assert r["diag/pos_weight_frac"] + r["diag/neg_weight_frac"] in (pytest.approx(1.0), 0.0)
        assert r["diag/kl_k3"] >= 0 if kl_expected else True
        assert r["diag/update_ratio"] > 0
        assert not [k for k in r if k.startswith("diag/_")]
    if method == "dmpo":
        assert 0 < records[0]["dmpo/ess"] <= 1


def test_beta_zero_builds_no_reference_for_the_diagnostics(tmp_path, monkeypatch):
    """GRPO at beta 0 (TRL's default) keeps one copy of the weights and runs no reference forward by default; the
    KL to the base then appears only when asked (`diagnostics_reference`)."""
    from mmrl.config import load_config as load
    from mmrl.training.policy_factory import build_policy

    cfg = load(None, dict(method="grpo", beta=0.0))
    assert cfg.log_diagnostics and not cfg.diagnostics_reference
    assert build_policy(cfg).ref_model is None
    assert build_policy(load(None, dict(method="grpo", beta=0.0, diagnostics_reference=True))).ref_model is not None
    cls = adapter_class("causal_lm")
    calls = []
    original = cls.logprob

    def spy(self, rows, **kw):
        calls.append(bool(kw.get("use_reference")))
        return original(self, rows, **kw)

    monkeypatch.setattr(cls, "logprob", spy)
    records = _run(tmp_path / "default", beta=0.0, num_iterations=2)
    assert True not in calls  # no reference forward at all
    for r in records:
        assert not [k for k in KL_KEYS if k in r]
        assert "diag/update_ratio" in r and "diag/pos_weight_frac" in r
    calls.clear()
    asked = _run(tmp_path / "asked", beta=0.0, num_iterations=2, diagnostics_reference=True)
    assert True in calls
    assert all(k in r and math.isfinite(r[k]) for r in asked for k in KL_KEYS)
    assert asked[0]["diag/kl_k3"] == pytest.approx(0.0, abs=1e-6)  # the policy before the first update is the base


def test_kl_every_k_rollouts(tmp_path):
    """`diagnostics_kl_every = 2`: the reference forward of a beta-0 run with a reference runs on rollouts 0, 2, ...
    only, so steps 1-2 (rollout 0) and 5-6 (rollout 2) log the KL and steps 3-4 do not."""
    records = _run(tmp_path, beta=0.0, num_iterations=2, max_steps=6, diagnostics_reference=True, diagnostics_kl_every=2)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert ["diag/kl_k3" in r for r in records] == [True, True, False, False, True, True]
    assert all("diag/update_ratio" in r for r in records)


def test_update_ratio_is_zero_without_a_learning_rate(tmp_path):
    r = _run(tmp_path / "a", zero_lr=True, max_steps=1)[0]
    assert r["diag/update_ratio"] == 0.0 and r["diag/update_ratio_max"] == 0.0
    r = _run(tmp_path / "b", learning_rate=1e-3, max_steps=1)[0]
    assert 0 < r["diag/update_ratio"] <= r["diag/update_ratio_max"]


def test_kl_to_the_base_is_zero_first_and_grows(tmp_path):
    # one optimizer step per rollout: the KL is measured before the update, so the first step's policy is the base
    records = _run(tmp_path, learning_rate=0.05, max_steps=4, num_iterations=1, max_grad_norm=0.0,
                   diagnostics_reference=True)
    assert records[0]["diag/kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert records[0]["diag/kl_k1"] == pytest.approx(0.0, abs=1e-6)
    assert records[-1]["diag/kl_k3"] > 1e-4


def test_kl_k3_is_the_kl_term_with_beta(tmp_path):
    records = _run(tmp_path, beta=0.04, num_iterations=2)
    assert records[1]["diag/kl_k3"] == pytest.approx(records[1]["kl"], rel=1e-4) and records[1]["kl"] > 0


def test_the_flag_turns_the_diagnostics_off(tmp_path):
    records = _run(tmp_path, log_diagnostics=False, max_steps=1)
    assert records and not [k for r in records for k in r if k.startswith("diag/")]
    assert "entropy" in records[0]


@pytest.mark.parametrize("family", ["masked_diffusion", "masked_image"])
def test_dmpo_kl_scores_tokens_with_a_per_token_estimator(family, tmp_path, monkeypatch):
    """DMPO's diag/kl_* use the family's per-token estimator (mean-field here), not the ELBO: its terms log p * T / m
    sum to a sequence estimate but are no per-token log-probs, and k3 = exp(d) - d - 1 of their differences blew up
    (10^2-10^6 on the tiny aMUSEd). With the behaviour target DMPO calls logprob() only for the diagnostics."""
    cls = adapter_class(family)
    calls = []
    original = cls.logprob

    def spy(self, rows, **kw):
        calls.append((kw.get("estimator"), bool(kw.get("use_reference"))))
        return original(self, rows, **kw)

    monkeypatch.setattr(cls, "logprob", spy)
    records = _run(tmp_path, "dmpo", family, max_steps=3, learning_rate=0.05, dmpo_target="behaviour",
                   dmpo_baseline="group", num_iterations=1)
    assert calls and {e for e, _ in calls} == {"mean_field"}
    assert {ref for _, ref in calls} == {True, False}  # the reference at buffer time, the policy before each update
    assert records[0]["diag/kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert all(0 <= r["diag/kl_k3"] < 5 and math.isfinite(r["diag/kl_k3_seq"]) for r in records)


def test_dmpo_kl_costs_no_forward_in_the_updates(tmp_path, monkeypatch):
    """DMPO's diag/kl_* come from the per-token scores `prepare` keeps for the measured rollout (the behaviour policy
    and the reference, one no-grad forward each per micro-batch); the updates run no extra forward, and with two
    inner steps only the first (where the policy is still the behaviour policy) logs the KL."""
    cls = adapter_class("masked_diffusion")
    calls = []
    original = cls.logprob

    def spy(self, rows, **kw):
        calls.append((kw.get("estimator"), bool(kw.get("use_reference")), torch.is_grad_enabled()))
        return original(self, rows, **kw)

    monkeypatch.setattr(cls, "logprob", spy)
    records = _run(tmp_path, "dmpo", "masked_diffusion", max_steps=2, num_iterations=2, learning_rate=0.05)
    micro_batches = 2  # 8 responses, micro-batches of 4
    per_token = [c for c in calls if c[0] == "mean_field"]
    assert sorted(per_token) == sorted([("mean_field", True, False), ("mean_field", False, False)] * micro_batches)
    assert not [c for c in calls if c[2]]  # no scoring forward inside the gradient steps
    assert "diag/kl_k3" in records[0] and records[0]["diag/kl_k3"] == pytest.approx(0.0, abs=1e-6)
    assert "diag/kl_k3" not in records[1] and "diag/pos_weight_frac" in records[1]
