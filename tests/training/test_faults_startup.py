"""Issue 30, groups 9 and 10: validation gaps closed before the model loads, and every start-up or training error a
user can fix printed by `mmrl train` as one line (the traceback under `--debug`)."""
import json

import pytest

from mmrl.checkpointing.checkpoint import list_checkpoints
from mmrl.checkpointing.run_lock import RunLock, RunLocked
from mmrl.config.train_config import ConfigError, load_config
from mmrl.models import adapter_class
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import dataset_for, vowel_reward

BASE = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
            learning_rate=1e-4, progress_bar=False, report_to=["jsonl"])


# ------------------------------------------------------------------------------------ 9. before the model loads


@pytest.mark.parametrize("values,needle", [
    (dict(family="masked_image", method="grpo", diffusion_steps=100000), r"diffusion_steps=100000 must be in \[1, 4096\]"),
    (dict(family="janus", method="grpo", cfg_scale=-1.0), r"cfg_scale=-1.0 must be >= 0"),
    (dict(family="masked_image", method="grpo", cfg_scale=-0.5), r"cfg_scale=-0.5 must be >= 0"),
])
def test_unbounded_or_negative_generation_settings_are_config_errors(values, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, values)


def test_resuming_with_max_steps_below_the_checkpoint_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import mmrl.training.trainer as trainer_mod

    run = tmp_path / "run"
    Trainer(load_config(None, {**BASE, "output_dir": str(run), "max_steps": 2, "save_steps": 1}),
            policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward]).train()
    monkeypatch.setattr(trainer_mod, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    cfg = load_config(None, {**BASE, "output_dir": str(run), "max_steps": 1, "resume_from": "auto", "model_name_or_path": "tiny"})
    with pytest.raises(ConfigError, match=r"checkpoint-000002 is at step 2, beyond max_steps=1, so there is nothing to train"):
        Trainer(cfg, dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])


def test_the_run_lock_is_held_before_the_model_loads(tmp_path, monkeypatch):
    import mmrl.training.trainer as trainer_mod

    run = tmp_path / "run"
    real, seen = trainer_mod.build_policy, []

    def build_and_check(*a, **k):
        with pytest.raises(RunLocked):  # a second trainer starting now stops here, before loading its model
            RunLock(run).acquire()
        seen.append(True)
        return real(*a, **k)

    monkeypatch.setattr(trainer_mod, "build_policy", build_and_check)
    t = Trainer(load_config(None, {**BASE, "output_dir": str(run), "max_steps": 1, "model_name_or_path": "tiny"}),
                dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    assert seen == [True]
    del t


def test_a_failed_start_gives_the_lock_back(tmp_path):
    cfg = load_config(None, {**BASE, "output_dir": str(tmp_path / "run"), "max_steps": 1, "eval_steps": 1})
    with pytest.raises(ValueError, match=r"needs evaluation rows"):
        Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"), reward_funcs=[vowel_reward])
    RunLock(tmp_path / "run").acquire().release()  # free again


# ------------------------------------------------------------------------------------ 10. one-line errors


@pytest.fixture
def cli(tmp_path, capsys):
    from mmrl.cli import main

    rows = [{"nums": [3, 4, 5], "target": 17}, {"nums": [2, 9, 7], "target": 25}]
    (tmp_path / "cd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["method=grpo", "task=countdown", "family=causal_lm", "model_name_or_path=tiny", "num_generations=2",
              "per_device_train_batch_size=4", "max_completion_length=8", "progress_bar=false", "save_steps=1",
              f"dataset_path={tmp_path / 'cd.jsonl'}"]

    def run(*extra, run_dir=tmp_path / "run"):
        code = main(["train", *common, f"output_dir={run_dir}", *extra])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("mmrl train:")]
        return code, lines, err

    return run


def assert_one_line(result, code, needle):
    got, lines, err = result
    assert got == code and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err[-3000:]


def bad_reward_file(tmp_path):
    (tmp_path / "my_rewards.py").write_text("def broken(prompts, completions, **kw):\n    return ['x'] * len(completions)\n")
    return f"reward_funcs={tmp_path / 'my_rewards.py'}:broken"


def test_user_fixable_errors_are_one_line(cli, tmp_path):
    assert_one_line(cli("reward_funcs=[a,"), 2, "reward_funcs='[a,': expected list[str]")
    assert_one_line(cli("reward_weights=[1,2]"), 2, "got 2 weights for 1 rewards")  # task's default rewards: one
    assert_one_line(cli("max_steps=1", bad_reward_file(tmp_path), run_dir=tmp_path / "r1"), 1,
                    "reward 'broken', sample 0: returned str 'x'")
    with RunLock(tmp_path / "locked"):
        assert_one_line(cli("max_steps=1", run_dir=tmp_path / "locked"), 2, "is in use by another trainer")
    assert cli("max_steps=1", run_dir=tmp_path / "done")[0] == 0
    assert_one_line(cli("max_steps=2", "resume_from=auto", "num_generations=4", run_dir=tmp_path / "done"), 2,
                    "cannot resume from")
    ck = list_checkpoints(tmp_path / "done")[-1]
    (ck / "optimizer.pt").write_bytes(b"damaged")
    assert_one_line(cli("max_steps=2", "resume_from=auto", run_dir=tmp_path / "done"), 1, "no intact checkpoint to resume from")


def test_debug_shows_the_traceback(cli):
    with pytest.raises(ConfigError, match="reward_funcs"):
        cli("reward_funcs=[a,", "--debug")
