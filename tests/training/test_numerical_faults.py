"""Numerical faults: a step with a non-finite gradient (finite loss) is skipped, logged and warned about, the weights are
untouched and training recovers; k in a row stop the run (tests/training/test_trainer_errors.py covers the stop); gradient
clipping is on by default and bounds the norm the optimizer sees."""
import math

import pytest
import torch

from mmrl.config.train_config import TrainConfig, load_config
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward


def make(tmp_path, reward, **kw):
    values = dict(method="grpo", family="causal_lm", max_steps=3, num_generations=4, per_device_train_batch_size=8,
                  max_completion_length=8, learning_rate=1e-2, output_dir=str(tmp_path), progress_bar=False, save_steps=0,
                  report_to=["jsonl"], dynamic_sampling=False)
    cfg = load_config(None, {**values, **kw})
    return Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[reward])


def torch_optimizer(t: Trainer) -> torch.optim.Optimizer:
    return getattr(t.optimizer, "optimizer", t.optimizer)  # accelerate's wrapper holds the torch optimizer


def grad_norm(opt: torch.optim.Optimizer) -> float:
    grads = [p.grad.double().flatten() for g in opt.param_groups for p in g["params"] if p.grad is not None]
    return float(torch.cat(grads).norm())


def test_nonfinite_gradient_with_finite_loss_skips_the_step_and_recovers(tmp_path):
    state = {"call": 0, "poison": False, "weights": []}

    def reward(prompts, completions, **kw):  # called once per step, before that step's update
        state["call"] += 1
        state["poison"] = state["call"] == 2
        state["weights"].append({k: v.detach().clone() for k, v in t.policy.model.state_dict().items()})
        return vowel_reward(prompts, completions)

    t = make(tmp_path, reward)
    param = next(p for p in t.policy.model.parameters() if p.requires_grad)
    param.register_hook(lambda g: g * math.inf if state["poison"] else g)
    taken = []
    torch_optimizer(t).register_step_post_hook(lambda opt, args, kwargs: taken.append(state["call"]))
    with pytest.warns(RuntimeWarning, match=r"step 2: non-finite loss \(.*\) or gradient norm \((inf|nan)\); step skipped "
                                            r"\(1 in a row, the run stops at 3\)"):
        t.train()
    assert taken == [1, 3]  # the optimizer never stepped on the poisoned gradient
    records = {r["step"]: r for r in read_metrics(tmp_path)}
    assert math.isfinite(records[2]["loss"]) and not math.isfinite(records[2]["grad_norm"])
    assert records[2]["train/skipped_nonfinite"] == 1.0 and "train/skipped_nonfinite" not in records[3]
    before, after = state["weights"][1], state["weights"][2]  # at the start of step 2 and of step 3
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not all(torch.equal(state["weights"][0][k], before[k]) for k in before)  # step 1 did update
    assert t.nonfinite_in_a_row == 0 and all(torch.isfinite(p).all() for p in t.policy.model.parameters())


@pytest.mark.parametrize("max_grad_norm", [None, 0.05])
def test_gradient_clipping_bounds_what_the_optimizer_sees(max_grad_norm, tmp_path):
    assert TrainConfig().max_grad_norm == 1.0  # on by default
    kw = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
    t = make(tmp_path, vowel_reward, max_steps=2, **kw)
    limit = t.cfg.max_grad_norm
    seen = []
    torch_optimizer(t).register_step_pre_hook(lambda opt, args, kwargs: seen.append(grad_norm(opt)))
    t.train()
    logged = [r["grad_norm"] for r in read_metrics(tmp_path)]  # before clipping
    assert len(seen) == len(logged) == 2
    for pre, applied in zip(logged, seen):
        assert applied == pytest.approx(min(pre, limit), rel=1e-4)
    if max_grad_norm is not None:
        assert all(pre > limit for pre in logged)  # the case where clipping acts
