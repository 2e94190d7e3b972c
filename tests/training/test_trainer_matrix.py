"""Every method x family cell runs 2 optimizer steps on tiny models: finite loss, parameters change, ratio exactly 1
at the first inner step, metrics written (the trainer issue's first acceptance point)."""
import json

import pytest
import torch

from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import CELLS, dataset_for, reward_for


def tiny_config(method: str, family: str, out, **extra):
    values = dict(method=method, family=family, max_steps=2, num_generations=4, per_device_train_batch_size=4,
                  gradient_accumulation_steps=2, learning_rate=1e-2, max_completion_length=8, block_length=4,
                  output_dir=str(out), progress_bar=False, dynamic_sampling=False, num_iterations=2, save_steps=0,
                  report_to=["jsonl", "tensorboard"], seed=0)
    values.update(extra)
    return load_config(None, values)


@pytest.mark.parametrize("method,family", CELLS)
def test_method_family_cell(method, family, tmp_path):
    torch.manual_seed(0)
    cfg = tiny_config(method, family, tmp_path)
    policy = adapter_class(family).tiny(seed=0)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    trainer = Trainer(cfg, policy=policy, dataset=dataset_for(family), reward_funcs=[reward_for(family)])
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert torch.isfinite(torch.tensor(r["loss"])), r
        for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "grad_norm", "perf/step_time"):
            assert key in r, key
    changed = [n for n, p in policy.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed"
    if method == "dmpo":
        assert "dmpo/ess" in records[0] and 0 < records[0]["dmpo/ess"] <= 1
    else:
        # the first inner step of a buffer uses log-probs computed by the same code on the same micro-batches
        assert records[0]["policy/first_inner_logp_max_diff"] == 0.0
        assert records[0]["clip_ratio/region_mean"] == 0.0
    if method == "gcpo":  # the positive/negative contrast gives tokens different credit
        assert records[0]["gcpo/weight_std"] > 0.01
    if method == "dgpo":  # the first buffer's policy is its reference: no deviation, uniform weights
        assert records[0]["dgpo/h2_mean"] == pytest.approx(0.0, abs=1e-6)
        assert records[0]["dgpo/weight_std"] == pytest.approx(0.0, abs=1e-5)
    assert (tmp_path / "tensorboard").is_dir()
    assert (tmp_path / "checkpoints").is_dir()  # final checkpoint
