"""The README's main command (`mmrl quickstart`) at smoke size, and its preset in sync with the recipe."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from mmrl.cli import main
from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE

ROOT = Path(__file__).resolve().parents[2]


def test_preset_matches_quickstart_recipe():
    preset = yaml.safe_load((ROOT / "configs" / "tiny_dmpo_sudoku4.yaml").read_text())
    preset.pop("output_dir")
    assert preset == QUICKSTART_RECIPE


def test_quickstart_smoke_writes_report(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "qs"
    assert main(["quickstart", "--world", "sudoku", "--smoke", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["smoke"] and res["seeds"] == 1 and len(res["after"]) == 1
    assert 0.0 <= res["before"] <= 1.0 and 0.0 <= res["after"][0] <= 1.0
    assert abs(res["gain_mean"] - (res["after"][0] - res["before"])) < 1e-9
    for name in ("README.md", "accuracy.png", "reward.png", "token_credit.html"):
        assert (out / name).stat().st_size > 0, name
    text = (out / "README.md").read_text()
    assert "| evaluation |" in text and "after DMPO" in text and "Sample answers" in text
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    # the base model was built into the (temporary) cache, atomically: no temporary directory left behind
    built = list((tmp_path / "cache" / "tiny_world").iterdir())
    assert [p.name.split("-")[0] for p in built] == ["sudoku4"]


def test_replicate_same_rollout_budget(tmp_path):
    from mmrl.tiny_world.replicate import COMPARISONS, arm_config

    # every arm samples the same number of rollout batches: optimizer steps = rollouts x reuse F
    for name, arms in COMPARISONS.items():
        for arm, over in arms.items():
            cfg = arm_config(name, arm, seed=0, rollouts=5, out=tmp_path)
            assert cfg["max_steps"] == 5 * over.get("num_iterations", 1)
            assert cfg["max_steps"] // cfg["num_iterations"] == 5
    # the end-to-end run of this runner: `test_sudoku_dmpo_vs_d1_smoke_has_the_baseline_rows` (one run for CI's time)


def test_sudoku_dmpo_vs_d1_arms_differ_only_in_the_method(tmp_path):
    """`dmpo-vs-d1` under the protocol: the resolved configs of its arms (method defaults applied) differ only in the
    method and the method's own options, on one optimizer setting and the same rollouts."""
    import dataclasses

    from mmrl.config.train_config import METHOD_DEFAULTS, load_config
    from mmrl.tiny_world.replicate import COMPARISONS, arm_config

    cfgs = {a: load_config(None, arm_config("dmpo-vs-d1", a, seed=0, rollouts=10, out=tmp_path)) for a in COMPARISONS["dmpo-vs-d1"]}
    assert {c.method for c in cfgs.values()} == {"diffu_grpo", "dmpo"}
    (a, ca), (b, cb) = cfgs.items()
    fields = [f.name for f in dataclasses.fields(ca) if not f.name.startswith("_")]
    own = {"method"} | set(METHOD_DEFAULTS["diffu_grpo"]) | set(METHOD_DEFAULTS["dmpo"]) | {f for f in fields if f.startswith("dmpo_")}
    differ = {f for f in fields if getattr(ca, f) != getattr(cb, f)}
    assert differ <= own, differ - own
    for f in ("learning_rate", "lr_scheduler_type", "warmup_ratio", "beta", "adam_beta1", "adam_beta2", "max_grad_norm",
              "weight_decay", "num_iterations", "max_steps", "per_device_train_batch_size", "num_generations", "temperature"):
        assert getattr(ca, f) == getattr(cb, f), f  # DMPO's method defaults (clip 0.2, beta2 0.99, wd 0.1) do not apply
    assert ca.max_steps == 10 and ca.per_device_train_batch_size == 128 and ca.num_generations == 16 and ca.beta == 0.1


def test_sudoku_authors_arms_carry_the_authors_values_on_the_sudoku_recipe(tmp_path):
    """`sudoku-authors` (issue 24 item 2): the two authors' arms, as loaded, carry the presets' algorithm and optimizer
    settings (d1: mu = 12, clip 0.5, KL 0.04, ...; DMPO: F = 8, reference target, individual baseline, no KL, T =
    0.2, ...) on `dmpo-vs-d1`'s Sudoku base, batch and 10 rollout batches, at lr 5e-4 / mu and 5e-4 / F; its two
    shared-setting arms are `dmpo-vs-d1`'s arms field for field (so the clean-SFT and RFT rows are that table's too)."""
    import dataclasses

    from mmrl.config.train_config import load_config
    from mmrl.tiny_world.replicate import COMPARISONS, CONTRASTS, D1_AUTHORS_SUDOKU, DMPO_AUTHORS_SUDOKU, arm_config

    def cfg(name, arm):
        return load_config(None, arm_config(name, arm, seed=0, rollouts=10, out=tmp_path))

    arms = COMPARISONS["sudoku-authors"]
    shared = {a: cfg("dmpo-vs-d1", a) for a in COMPARISONS["dmpo-vs-d1"]}
    fields = [f.name for f in dataclasses.fields(next(iter(shared.values()))) if not f.name.startswith("_")]
    for a, ref in shared.items():
        new = cfg("sudoku-authors", a)
        assert {f for f in fields if getattr(new, f) != getattr(ref, f)} == set(), a
    assert list(arms)[0] == "diffu-grpo (d1), F=1"  # the clean-SFT row's compute: its 10 steps of 128
    presets = {D1_AUTHORS_SUDOKU: ("d1_diffu_grpo_llada_8b.yaml", 12), DMPO_AUTHORS_SUDOKU: ("dmpo_llada_8b_countdown.yaml", 8)}
    keys = ("method", "num_iterations", "beta", "temperature", "lr_scheduler_type", "warmup_ratio", "adam_beta1",
            "adam_beta2", "weight_decay", "max_grad_norm")
    for arm, (preset, f) in presets.items():
        ref, got = load_config(ROOT / "configs" / preset, validate=False), cfg("sudoku-authors", arm)
        extra = (("epsilon", "epsilon_high", "scale_rewards", "loss_type", "logprob_estimator", "p_mask_prompt", "random_masking")
                 if got.method == "diffu_grpo" else ("dmpo_loss", "dmpo_target", "dmpo_baseline", "dmpo_alpha"))
        for key in keys + extra:
            assert getattr(got, key) == getattr(ref, key), (arm, key)
        base = shared["diffu-grpo (d1), F=1"]
        for key in ("family", "task", "model_name_or_path", "per_device_train_batch_size", "num_generations",
                    "max_completion_length", "diffusion_steps", "block_length", "sampler", "reward_funcs", "eval_limit"):
            assert getattr(got, key) == getattr(base, key), (arm, key)
        assert (got.num_iterations, got.max_steps) == (f, 10 * f)  # the same 10 rollout batches
        assert got.learning_rate * f == pytest.approx(5e-4)
    assert cfg("sudoku-authors", D1_AUTHORS_SUDOKU).beta == 0.04 and cfg("sudoku-authors", D1_AUTHORS_SUDOKU).epsilon == 0.5
    assert cfg("sudoku-authors", DMPO_AUTHORS_SUDOKU).temperature == 0.2
    assert (D1_AUTHORS_SUDOKU, "diffu-grpo (d1), F=1") in CONTRASTS["sudoku-authors"]


def test_sudoku_rewards_arms_differ_only_in_the_reward(tmp_path):
    """`sudoku-rewards` (issue 24 item 5): within a method its arms' resolved configs differ only in `reward_funcs`,
    on the `dmpo-vs-d1` recipe, batch and optimizer (the solved-grids-only DMPO arm also in its weight baseline);
    the rewards are registered and score a right, a valid but different and a wrong grid as hand-computed."""
    import dataclasses

    from mmrl.config.train_config import load_config
    from mmrl.core.registry import REWARDS
    from mmrl.tiny_world import register
    from mmrl.tiny_world.replicate import COMPARISONS, DMPO_SOLVED_ONLY, arm_config

    register()
    arms = COMPARISONS["sudoku-rewards"]
    assert arms[DMPO_SOLVED_ONLY]["dmpo_baseline"] == "correct_only" and arms[DMPO_SOLVED_ONLY]["reward_funcs"] == ["sudoku4_solved"]
    cfgs = {a: load_config(None, arm_config("sudoku-rewards", a, seed=0, rollouts=10, out=tmp_path)) for a in arms}
    ref = [load_config(None, arm_config("dmpo-vs-d1", a, seed=0, rollouts=10, out=tmp_path)) for a in COMPARISONS["dmpo-vs-d1"]]
    ref = {c.method: c for c in ref}  # diffu_grpo, dmpo
    fields = [f.name for f in dataclasses.fields(next(iter(cfgs.values()))) if not f.name.startswith("_")]
    for arm, cfg in cfgs.items():
        differ = {f for f in fields if getattr(cfg, f) != getattr(ref[cfg.method], f)}
        assert differ <= ({"reward_funcs", "dmpo_baseline"} if arm == DMPO_SOLVED_ONLY else {"reward_funcs"}), (arm, differ)
        assert len(cfg.reward_funcs) == 1 and cfg.reward_funcs[0] in REWARDS
    assert {c.reward_funcs[0] for c in cfgs.values()} == {"sudoku4", "sudoku4_solved", "sudoku4_valid"}
    puzzle, solution, other = "1234000000000000", "1234341221434321", "1234341243212143"  # two valid completions
    wrong = "1234341221434312"  # the last two cells swapped: 2 of 12 blanks wrong, columns 2 and 3 repeat
    grids = [solution, other, wrong]
    rows = dict(prompts=[None] * 3, puzzle=[puzzle] * 3, solution=[solution] * 3)
    assert REWARDS["sudoku4_solved"](completions=grids, **rows) == [1.0, 0.0, 0.0]
    assert REWARDS["sudoku4_valid"](completions=grids, **rows) == [1.0, 1.0, pytest.approx(1 - 2 / 36)]
    assert REWARDS["sudoku4"](completions=grids, **rows)[2] == pytest.approx(10 / 12)


def test_replicate_contrasts_name_arms_and_cutoff_parses():
    """Every reported contrast names two arms of its comparison; `--cutoff` is HH:MM UTC with a one-line error."""
    import datetime as dt

    from mmrl.tiny_world.replicate import COMPARISONS, CONTRASTS
    from mmrl.tiny_world.report import cutoff_time as _cutoff_time

    for name, pairs in CONTRASTS.items():
        assert all(a in COMPARISONS[name] and b in COMPARISONS[name] and a != b for a, b in pairs)
    assert _cutoff_time(None) is None
    when = dt.datetime.fromtimestamp(_cutoff_time("08:03"), dt.timezone.utc)
    assert (when.hour, when.minute, when.second) == (8, 3, 0)
    with pytest.raises(ValueError, match="cutoff must be a UTC clock time HH:MM, got '8h03'"):
        _cutoff_time("8h03")
    with pytest.raises(ValueError, match="got '24:00'"):
        _cutoff_time("24:00")


def test_cutoff_is_the_clock_times_occurrence_nearest_to_now():
    """A cutoff past midnight is the coming night's (a job started at 23:20 with `--cutoff 00:55` runs), one a few
    minutes back has passed, and an evening cutoff read just after midnight is the evening before (hand-picked
    instants, UTC)."""
    import datetime as dt

    from mmrl.tiny_world.report import cutoff_time

    def at(day, hh, mm):
        return dt.datetime(2026, 12, day, hh, mm, tzinfo=dt.timezone.utc).timestamp()

    assert cutoff_time("00:55", now=at(6, 23, 20)) == at(7, 0, 55)
    assert cutoff_time("23:10", now=at(6, 23, 20)) == at(6, 23, 10)
    assert cutoff_time("23:50", now=at(7, 0, 10)) == at(6, 23, 50)
    assert cutoff_time("08:03", now=at(6, 7, 0)) == at(6, 8, 3)
    assert cutoff_time("19:00", now=at(6, 7, 0)) == at(6, 19, 0)  # 12 h ahead: still today's
    assert cutoff_time("19:01", now=at(6, 7, 0)) == at(5, 19, 1)  # more than 12 h ahead: yesterday's, passed


def test_sudoku_dmpo_vs_d1_smoke_has_the_baseline_rows(tmp_path, monkeypatch, smoke_cache):
    """The Sudoku comparison end to end at smoke size (20-step base, one rollout batch of 8 x 4, 16 test puzzles):
    the RL rows and the clean-SFT, RFT and best-of-n rows, per-puzzle scores per seed, the paired intervals."""
    from mmrl.tiny_world.replicate import CLEAN_SFT_ROW, COMPARISONS, RFT_ROW

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    assert main(["replicate", "dmpo-vs-d1", "--smoke", "--seeds", "1", "--rollouts", "1", "--out", str(tmp_path / "rep")]) == 0
    root = tmp_path / "rep" / "dmpo-vs-d1"
    res = json.loads((root / "results.json").read_text())
    rl = list(COMPARISONS["dmpo-vs-d1"])
    assert set(res["arms"]) == set(rl) | {CLEAN_SFT_ROW, RFT_ROW}
    n = len(res["test_puzzles"])
    assert n == 16 and len(res["base_items"]) == n
    for runs in res["arms"].values():
        assert len(runs) == 1 and len(runs[0]["items"]) == n  # per-puzzle scores, per seed
        assert sum(runs[0]["items"]) / n == pytest.approx(runs[0]["accuracy"])  # the figure is their mean
    # same compute: the clean-SFT row fits one step of the arms' 32 sequences, RFT draws the arms' 32 rollouts
    assert res["compute"] == {"optimizer_steps": 1, "sequences_per_step": 32, "rollouts_per_run": 32}
    assert len(res["arms"][CLEAN_SFT_ROW][0]["loss"]) == 1 and res["arms"][RFT_ROW][0]["rft_sampled"] == 32
    best = res["best_of_n"]["items"]  # best-of-4 from the base: each puzzle's best sample, at least its mean sample
    assert res["n_best"] == 4 and all(b >= s for b, s in zip(best["best"], best["sampled"]))
    assert best["greedy"] == res["base_items"]  # the same greedy decoding as the base row
    assert all(v <= b for v, b in zip(best["verified"], best["best"]))  # the verifier's pick is one of the samples
    assert "dmpo, F=1 - best-of-4 (base), constraint verifier" in res["differences"]
    gain = res["gains"]["dmpo, F=1"]
    assert gain["low"] <= gain["estimate"] <= gain["high"] and gain["n_items"] == n
    assert {"dmpo, F=1 - diffu-grpo (d1), F=1", f"dmpo, F=1 - {CLEAN_SFT_ROW}", f"diffu-grpo (d1), F=1 - {RFT_ROW}",
            "dmpo, F=1 - best-of-4 (base)"} <= set(res["differences"])
    table = (root / "table.md").read_text()
    assert all(x in table for x in ("base model", "best-of-4", "constraint verifier", CLEAN_SFT_ROW, RFT_ROW, "[95% CI]", "claimed"))
    base_row = next(line for line in table.splitlines() if line.startswith("| base model |"))
    assert base_row.split("|")[4].strip() == f"{100 * res['base_validation']:.1f}"  # the curves' start, on validation
    assert (root / "accuracy.png").read_bytes()[:4] == b"\x89PNG"  # the validation curves


def test_sudoku_arm_config_lr_is_the_shared_setting_and_authors_arms_keep_theirs(tmp_path):
    """`lr` replaces the shared recipe's learning rate; an arm with its own (the authors' settings) keeps it."""
    from mmrl.tiny_world.replicate import COMPARISONS, STABLE, arm_config

    for arm in COMPARISONS["dmpo-vs-d1"]:
        assert arm_config("dmpo-vs-d1", arm, seed=0, rollouts=10, out=tmp_path)["learning_rate"] == STABLE["learning_rate"]
        assert arm_config("dmpo-vs-d1", arm, seed=0, rollouts=10, out=tmp_path, lr=3e-5)["learning_rate"] == 3e-5
    own = [a for a, over in COMPARISONS["sudoku-authors"].items() if "learning_rate" in over]
    assert own  # the authors' arms set theirs
    for arm in own:
        lr = COMPARISONS["sudoku-authors"][arm]["learning_rate"]
        assert arm_config("sudoku-authors", arm, seed=0, rollouts=10, out=tmp_path, lr=3e-5)["learning_rate"] == lr


def test_sudoku_comparison_runs_from_another_base_and_refuses_to_mix_bases(tmp_path, monkeypatch, smoke_cache, capsys):
    """`--base sudoku4-mid`: the base row, every run and the report name that base (its smoke build, a cache folder of
    its own); a `--resume` into that folder with the default base stops before any work with a one-line error, and an
    unknown base is refused by the command line before anything is built."""
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    with pytest.raises(SystemExit, match=r"dmpo-vs-d1 --base must be one of \['sudoku4', 'sudoku4-mid', 'sudoku4-strong'\], got 'sudoku9'"):
        main(["replicate", "dmpo-vs-d1", "--smoke", "--base", "sudoku9", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
    arm = "diffu-grpo (d1), F=1"
    args = ["replicate", "dmpo-vs-d1", "--smoke", "--seeds", "1", "--rollouts", "1", "--no-baselines", "--arm", arm,
            "--out", str(tmp_path / "rep")]
    assert main(args + ["--base", "sudoku4-mid", "--lr", "1e-4"]) == 0
    root = tmp_path / "rep" / "dmpo-vs-d1"
    res = json.loads((root / "results.json").read_text())
    spec = json.loads((model_dir("sudoku4-mid", SMOKE_BASE_STEPS) / "tiny_spec.json").read_text())
    assert res["base_model"] == "sudoku4-mid" and res["base_weights_sha256"] == spec["weights_sha256"]
    assert res["lr"] == 1e-4 and res["configs"][arm]["learning_rate"] == 1e-4
    assert res["configs"][arm]["model_name_or_path"] == "tiny-world:sudoku4-mid"  # the config names the base it ran
    assert "Base `sudoku4-mid`" in (root / "table.md").read_text() and "at lr 0.0001" in (root / "table.md").read_text()
    before = (root / "results.json").read_bytes()
    with pytest.raises(SystemExit, match="scored on the base 'sudoku4-mid', not 'sudoku4'"):
        main(args + ["--resume"])
    with pytest.raises(SystemExit, match="holds runs at lr 0.0001, not 0.0005"):
        main(args + ["--resume", "--base", "sudoku4-mid"])
    assert (root / "results.json").read_bytes() == before  # nothing done is lost
    assert main(args + ["--resume", "--base", "sudoku4-mid", "--lr", "1e-4"]) == 0  # the same settings resume


def test_sudoku_batch16_is_dmpo_vs_d1_at_sixteen_times_the_batch(tmp_path):
    """`sudoku-batch16`: each arm resolves to `dmpo-vs-d1`'s but for the micro-batches per optimizer step (16: 128
    puzzles x 16 answers = 2,048 per step), so its clean-SFT row fits 2,048 true solutions per step."""
    import dataclasses

    from mmrl.config.train_config import load_config
    from mmrl.tiny_world.replicate import COMPARISONS, arm_config

    assert list(COMPARISONS["sudoku-batch16"]) == list(COMPARISONS["dmpo-vs-d1"])
    for arm in COMPARISONS["sudoku-batch16"]:
        big = load_config(None, arm_config("sudoku-batch16", arm, seed=0, rollouts=10, out=tmp_path))
        ref = load_config(None, arm_config("dmpo-vs-d1", arm, seed=0, rollouts=10, out=tmp_path))
        fields = [f.name for f in dataclasses.fields(big) if not f.name.startswith("_")]
        assert {f for f in fields if getattr(big, f) != getattr(ref, f)} == {"gradient_accumulation_steps"}
        assert (big.step_batch_size, big.prompts_per_rollout, ref.step_batch_size) == (2048, 128, 128)


def test_sudoku_comparison_workers_share_a_folder_by_claiming_runs(tmp_path, monkeypatch, smoke_cache):
    """Two workers on one folder (the same command with --resume): a run another worker has claimed is skipped, not
    run twice, and the report uses the seeds finished; once the claim is gone, a resume runs it and both seeds count."""
    from mmrl.checkpointing.run_lock import RunLock
    from mmrl.tiny_world.reasoning_rl import run_slug

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    arm = "diffu-grpo (d1), F=1"
    args = ["replicate", "dmpo-vs-d1", "--smoke", "--seeds", "2", "--rollouts", "1", "--no-baselines", "--arm", arm,
            "--resume", "--out", str(tmp_path)]
    root = tmp_path / "dmpo-vs-d1"
    other = RunLock(root / "claims" / run_slug(arm, 0)).acquire()  # another worker holds seed 0's run
    try:
        assert main(args) == 0
    finally:
        other.release()
    res = json.loads((root / "results.json").read_text())
    assert res["seeds_used"] == [1] and not (root / "runs" / run_slug(arm, 0) / "result.json").exists()
    assert main(args) == 0  # the claim is free: this worker runs seed 0 now
    res = json.loads((root / "results.json").read_text())
    assert res["seeds_used"] == [0, 1] and len(res["arms"][arm]) == 2


def test_shapes_quickstart_smoke_writes_report(tmp_path, monkeypatch, smoke_cache):
    """The default main command (GCPO on the shapes world) end to end at smoke size: a 20-step base, 2 RL steps."""
    from mmrl.geneval.rules import TASKS

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    out = tmp_path / "qs"
    assert main(["quickstart", "--smoke", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["smoke"] and set(res["arms"]) == {"GCPO"} and len(res["arms"]["GCPO"]) == 1
    run = res["arms"]["GCPO"][0]
    after = run["after"]
    assert set(after) == set(TASKS) | {"overall"}
    assert abs(after["overall"] - sum(after[t] for t in TASKS) / len(TASKS)) < 1e-9
    # per-prompt test scores: each task's figure is the mean over its prompts, overall the mean over tasks
    tags, items = res["test_tags"], run["items"]
    assert len(items) == len(tags) == len(res["test_prompts"]) == len(res["before_items"])
    for t in TASKS:
        mine = [x for x, tag in zip(items, tags) if tag == t]
        assert abs(after[t] - sum(mine) / len(mine)) < 1e-9
    gain = res["rows"]["GCPO"]["gain"]
    assert gain["low"] <= gain["estimate"] <= gain["high"] and gain["n_seeds"] == 1
    for name in ("README.md", "accuracy.png", "reward.png", "grid.png", "credit.png"):
        assert (out / name).stat().st_size > 0, name
    text = (out / "README.md").read_text()
    assert "| model |" in text and "GCPO (1 seed)" in text and "grid.png" in text and "[95% CI]" in text
    assert (out / "grid.png").read_bytes()[:4] == b"\x89PNG"


def test_gcpo_vs_grpo_smoke(tmp_path, monkeypatch, smoke_cache):
    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    assert main(["replicate", "gcpo-vs-grpo", "--smoke", "--seeds", "1", "--lr", "2.5e-4", "--out", str(tmp_path / "rep")]) == 0
    root = tmp_path / "rep" / "gcpo-vs-grpo"
    res = json.loads((root / "results.json").read_text())
    assert set(res["arms"]) == {"GRPO", "GCPO", "RFT"}
    assert res["split"] == "test" and {c["learning_rate"] for c in res["configs"].values()} == {2.5e-4}
    # same prompts, batch, learning rate and KL: the arms differ only in the method
    a, b = res["configs"]["GRPO"], res["configs"]["GCPO"]
    assert {k for k in a if a[k] != b.get(k)} == {"method"}
    # the baselines: the clean-caption base, best-of-n from the base, rejection sampling at the same rollouts
    assert res["reference"]["model"] == "shapes-clean" and len(res["reference"]["items"]) == len(res["test_prompts"])
    assert {"base", "clean-caption base (same compute)", "best-of-1 (base)", "RFT"} <= set(res["rows"])
    rft = res["arms"]["RFT"][0]["rft"]
    assert rft["sampled"] == 2 * 16 and len(rft["accepted"]) == 2  # 2 rollout batches of 2 prompts x 8 images (smoke)
    assert {"GCPO - GRPO", "GRPO - RFT", "GCPO - RFT"} == set(res["differences"])
    table = (root / "table.md").read_text()
    assert "GRPO (1 seed)" in table and "GCPO (1 seed)" in table and "gain vs base" in table and "share of the gap" in table


def test_gcpo_vs_grpo_lr_choice_scores_validation_only(tmp_path, monkeypatch, smoke_cache):
    """`mmrl replicate gcpo-vs-grpo-lr` trains both arms at each lr and scores validation prompts only: no test
    prompt is ever evaluated, and the chosen lr is the one with the best validation mean over the two arms."""
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register
    from mmrl.tiny_world.shapes_rl import LR_CHOICES

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    assert main(["replicate", "gcpo-vs-grpo-lr", "--smoke", "--seeds", "1", "--out", str(tmp_path / "rep")]) == 0
    root = tmp_path / "rep" / "gcpo-vs-grpo-lr"
    choice = json.loads((root / "choice.json").read_text())
    register()
    task = load_task("shapes")
    validation = {r["prompt"]: r["metadata"]["tag"] for r in task.validation}
    test = {r["prompt"] for r in task.test}
    means = {}
    for lr in LR_CHOICES:
        res = json.loads((root / f"lr{lr:g}" / "results.json").read_text())
        scored = set(res["test_prompts"])
        assert res["split"] == "validation" and scored and scored <= set(validation)
        # the only prompts shared with the test split are single_object ones (one shape named: nothing to hold out)
        assert {validation[p] for p in scored & test} <= {"single_object"}
        assert any(validation[p] != "single_object" for p in scored)
        assert {c["learning_rate"] for c in res["configs"].values()} == {lr}
        overall = [runs[0]["after"]["overall"] for runs in res["arms"].values()]
        assert len(overall) == 2  # GRPO and GCPO, no baselines in a choice run
        means[lr] = sum(overall) / 2
        assert abs(choice["validation_overall"][f"{lr:g}"]["mean of the arms"] - means[lr]) < 1e-12
    assert choice["chosen_lr"] == max(means, key=means.get) and choice["split"] == "validation"
    assert "Chosen: lr" in (root / "table.md").read_text()


def test_lr_flag_rejected_outside_gcpo_vs_grpo_and_sudoku(tmp_path):
    """`--lr` is refused, before anything runs, where it applies to no comparison's arms (the Countdown and masked
    image-token runners) and when it is not positive (for the Sudoku comparisons too)."""
    import pytest

    for name in ("dgpo-vs-grpo", "dmpo-vs-grpo-masked"):
        with pytest.raises(SystemExit, match=rf"--lr applies to gcpo-vs-grpo and the Sudoku comparisons .*, not '{name}'"):
            main(["replicate", name, "--lr", "1e-4", "--out", str(tmp_path)])
    for name in ("gcpo-vs-grpo", "dmpo-small-batch"):
        with pytest.raises(SystemExit, match="--lr must be > 0, got -0.001"):
            main(["replicate", name, "--lr=-1e-3", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())  # nothing was run


def test_dmpo_small_batch_arms_and_diagnostics(tmp_path):
    """`dmpo-small-batch` (issue 24 items 3b and 5): each correct-cells arm differs from its plain arm only in
    `dmpo_token_mask`, every contrast names two arms, and `run_diagnostics` averages the first and last 5 training
    records as computed by hand (eval records, without a reward, are skipped)."""
    import dataclasses

    from mmrl.config.train_config import load_config
    from mmrl.tiny_world.replicate import COMPARISONS, CONTRASTS, arm_config, diagnostics_table, run_diagnostics

    arms = COMPARISONS["dmpo-small-batch"]
    cfgs = {a: load_config(None, arm_config("dmpo-small-batch", a, seed=0, rollouts=30, out=tmp_path)) for a in arms}
    fields = [f.name for f in dataclasses.fields(next(iter(cfgs.values()))) if not f.name.startswith("_")]
    for plain in ("wdce, no baseline", "wdce, group baseline"):
        a, b = cfgs[plain], cfgs[plain + ", correct cells only"]
        assert {f for f in fields if getattr(a, f) != getattr(b, f)} == {"dmpo_token_mask"}
        assert b.dmpo_token_mask == "correct_cells" and a.dmpo_token_mask is None
    assert cfgs["wdce, no baseline"].max_steps == 30 and cfgs["wdce, no baseline"].per_device_train_batch_size == 32
    assert all(x in arms and y in arms for x, y in CONTRASTS["dmpo-small-batch"])
    recs = [{"step": i + 1, "reward": 0.1 * (i + 1), "kl": 0.01 * i} for i in range(7)] + [{"step": 7, "eval/accuracy": 0.5}]
    d = run_diagnostics(recs)
    assert d["reward/first"] == pytest.approx(0.3) and d["reward/last"] == pytest.approx(0.5)  # (.1+..+.5)/5, (.3+..+.7)/5
    assert d["kl/first"] == pytest.approx(0.02) and d["kl/last"] == pytest.approx(0.04)
    assert "diag/neg_weight_frac/first" not in d
    table = diagnostics_table({"arm": [d, d]})
    assert "30.0 -> 50.0" in table and "0.020 -> 0.040 [0.040, 0.040]" in table


def test_correct_cells_token_mask_reads_the_solution_column():
    """The `correct_cells` entry of `DMPO_TOKEN_MASKS`: the rows' `solution` written as a response span (the
    policy's `response_templates`), compared with the response on the tokens the policy chose."""
    import types

    import mmrl.methods  # noqa: F401  (registers the DMPO token masks)
    from mmrl.algorithms import DMPO_TOKEN_MASKS

    class Policy:
        def response_templates(self, prompts, gen_length):
            return torch.tensor([[int(c) for c in p["response_template"]] for p in prompts])  # one token per cell

    rollout = types.SimpleNamespace(response_ids=torch.tensor([[1, 2, 3, 4], [1, 2, 4, 3]]))
    buf = types.SimpleNamespace(rollout=rollout, columns={"solution": ["1234", "1234"]},
                                loss_mask=torch.tensor([[False, True, True, True], [False, True, True, True]]))
    assert DMPO_TOKEN_MASKS["correct_cells"](Policy(), buf).tolist() == [[False, True, True, True], [False, True, False, False]]
    buf.columns = {}
    with pytest.raises(ValueError, match="needs a 'solution' column"):
        DMPO_TOKEN_MASKS["correct_cells"](Policy(), buf)


def test_sudoku_report_only_uses_the_seeds_every_row_finished(tmp_path, monkeypatch):
    """A stopped seed-major Sudoku run (`--resume` / `--report-only`): from saved runs where seed 1 of one row is
    missing, the report uses seed 0 only, keeps seed 1's finished runs under "incomplete", and its table shows
    every row's optimizer steps and training rollouts (the same rollouts for every RL arm and RFT) and the base
    build's digest; saved runs of another build than the cached one are refused."""
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir
    from mmrl.tiny_world.reasoning_rl import run_slug
    from mmrl.tiny_world.replicate import CLEAN_SFT_ROW, COMPARISONS, RFT_ROW, run_comparison

    name, n = "dmpo-reuse-sudoku4", 16  # --smoke: 16 test puzzles
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    spec = model_dir("sudoku4", SMOKE_BASE_STEPS) / "tiny_spec.json"  # the cached build's digest, no weights needed
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"weights_sha256": "c" * 64}))
    root = tmp_path / name
    (root / "runs").mkdir(parents=True)
    base_items = [0.5] * n
    (root / "base.json").write_text(json.dumps({"base": 0.5, "base_items": base_items, "base_validation": 0.55}))
    (root / "best_of_n.json").write_text(json.dumps({"items": {"best": [0.75] * n, "verified": [0.7] * n, "sampled": [0.45] * n,
                                                               "greedy": base_items}, "seconds": 1.0}))
    rl = list(COMPARISONS[name])
    steps = {"diffu-grpo (d1), F=1": 2, "dmpo, F=1": 2, "dmpo, F=8": 16, "dmpo, F=24": 48}  # 2 rollout batches x F
    for seed in (0, 1):
        for i, row in enumerate(rl + [CLEAN_SFT_ROW, RFT_ROW]):
            if seed == 1 and row == "dmpo, F=24":
                continue  # stopped before this run
            run = root / "runs" / run_slug(row, seed)
            run.mkdir()
            res = {"seed": seed, "accuracy": 0.4 + 0.01 * i, "items": [0.4 + 0.01 * i] * n, "seconds": 10.0,
                   "steps": steps.get(row, 2), "rollouts": 0 if row == CLEAN_SFT_ROW else 64}
            if row == CLEAN_SFT_ROW:
                res["trained_sequences"] = 64
            if row == RFT_ROW:
                res.update(rft_accepted=5, rft_sampled=64)
            (run / "result.json").write_text(json.dumps(res))
            if row in rl:
                recs = [{"step": s, "reward": 0.5, "kl": 0.01 * s, "diag/neg_weight_frac": 0.4} for s in range(1, 3)]
                (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs + [{"step": 2, "eval/accuracy": 0.5}]))
    res = run_comparison(name, tmp_path, seeds=2, smoke=True, progress=False, report_only=True)
    assert res["seeds_used"] == [0] and all(len(runs) == 1 for runs in res["arms"].values())
    assert set(res["arms"]) == set(rl) | {CLEAN_SFT_ROW, RFT_ROW}
    assert "dmpo, F=24" not in res["incomplete"] and [r["seed"] for r in res["incomplete"]["dmpo, F=8"]] == [1]
    assert res["differences"]["dmpo, F=24 - diffu-grpo (d1), F=1"]["estimate"] == pytest.approx(0.03)
    assert res["diagnostics"]["dmpo, F=8"][0]["kl/last"] == pytest.approx(0.015)
    lines = {line.split("|")[1].strip().split(" (")[0]: [c.strip() for c in line.split("|")[1:-1]]
             for line in (root / "table.md").read_text().splitlines() if line.startswith("| ")}
    assert lines["dmpo, F=24"][5:7] == ["48", "64"] and lines["dmpo, F=1"][5:7] == ["2", "64"]
    assert lines[CLEAN_SFT_ROW][5:7] == ["2", "0 (64 true solutions)"] and lines[RFT_ROW][6] == "64"
    assert lines["base model"][3] == "55.0"
    assert res["base_weights_sha256"] == "c" * 64 and "(weights cccccccccccc)" in (root / "table.md").read_text()
    (root / "base.json").write_text(json.dumps({"base": 0.5, "base_items": base_items, "base_validation": 0.55,
                                                "weights_sha256": "a" * 64}))
    with pytest.raises(ValueError, match="scored on build aaaaaaaaaaaa, the cached sudoku4 is cccccccccccc"):
        run_comparison(name, tmp_path, seeds=2, smoke=True, progress=False, report_only=True)
    with pytest.raises(ValueError, match="no saved runs"):
        run_comparison(name, tmp_path / "empty", seeds=2, smoke=True, progress=False, report_only=True)


def test_sudoku_import_results_pools_a_stored_reports_seeds_with_new_ones(tmp_path, monkeypatch):
    """`--import-results` for a Sudoku comparison: an earlier report's runs (seed 0 of every row, from its results.json)
    land in a new folder as saved runs, and the report pools them with seed 1 trained there; its curves and training
    diagnostics cover the runs with logs and the table says so. A report of another build, lr or comparison is
    refused before anything is written, and a saved run with other scores is never overwritten."""
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir
    from mmrl.tiny_world.reasoning_rl import STORED_FROM, run_slug
    from mmrl.tiny_world.replicate import CLEAN_SFT_ROW, COMPARISONS, RFT_ROW, STABLE, run_comparison

    name, n = "dmpo-vs-d1", 16  # --smoke: 16 test puzzles, 2 rollout batches
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    spec = model_dir("sudoku4", SMOKE_BASE_STEPS) / "tiny_spec.json"  # the cached build's digest, no weights needed
    spec.parent.mkdir(parents=True)
    spec.write_text(json.dumps({"weights_sha256": "c" * 64}))
    rl, rows = list(COMPARISONS[name]), list(COMPARISONS[name]) + [CLEAN_SFT_ROW, RFT_ROW]

    def run(row: str, seed: int, acc: float) -> dict:
        r = {"seed": seed, "accuracy": acc, "items": [acc] * n, "seconds": 10.0, "steps": 2,
             "rollouts": 0 if row == CLEAN_SFT_ROW else 64}
        return {**r, **({"trained_sequences": 64} if row == CLEAN_SFT_ROW else {}),
                **({"rft_accepted": 5, "rft_sampled": 64} if row == RFT_ROW else {})}

    stored = {"name": name, "base_model": "sudoku4", "base_weights_sha256": "c" * 64, "lr": STABLE["learning_rate"],
              "rollouts": 2, "smoke": False, "base": 0.5, "base_items": [0.5] * n, "base_validation": 0.55,
              "best_of_n": {"items": {"best": [0.75] * n, "verified": [0.7] * n, "sampled": [0.45] * n, "greedy": [0.5] * n},
                            "seconds": 1.0},
              "arms": {row: [run(row, 0, 0.25 + 0.125 * i)] for i, row in enumerate(rows)}, "incomplete": {}}
    path = tmp_path / "stored.json"
    path.write_text(json.dumps(stored))
    for bad, why in (({"base_weights_sha256": "a" * 64}, "base build aaaaaaaaaaaa is not the build in use cccccccccccc"),
                     ({"lr": 1e-4}, "holds runs at lr 0.0001 and 2 rollout batches, not lr 0.0005 and 2"),
                     ({"name": "sudoku-rewards"}, "is a report of 'sudoku-rewards' on 'sudoku4', not 'dmpo-vs-d1'")):
        other = tmp_path / "other.json"
        other.write_text(json.dumps({**stored, **bad}))
        with pytest.raises(ValueError, match=why):
            run_comparison(name, tmp_path / "refused", seeds=1, smoke=True, progress=False, report_only=True, stored=other)
        assert not (tmp_path / "refused" / name / "base.json").exists()  # refused before anything is written

    root = tmp_path / "new" / name
    for i, row in enumerate(rows):  # seed 1, as if trained in this folder (with training logs for the RL arms)
        d = root / "runs" / run_slug(row, 1)
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(run(row, 1, 0.375 + 0.125 * i)))
        if row in rl:
            recs = [{"step": s, "reward": 0.5, "kl": 0.01 * s, "diag/neg_weight_frac": 0.4} for s in (1, 2)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs + [{"step": 2, "eval/accuracy": 0.6}]))
    res = run_comparison(name, tmp_path / "new", seeds=2, smoke=True, progress=False, report_only=True, stored=path)
    assert res["seeds_used"] == [0, 1] and res["base_items"] == [0.5] * n
    for i, row in enumerate(rows):
        assert [r["items"][0] for r in res["arms"][row]] == [0.25 + 0.125 * i, 0.375 + 0.125 * i]
        assert res["arms"][row][0][STORED_FROM] == str(path) and STORED_FROM not in res["arms"][row][1]
    # paired over 16 puzzles and the 2 seeds: dmpo's seeds score 0.375 / 0.5, diffu-grpo's 0.25 / 0.375
    assert res["differences"][f"{rl[1]} - {rl[0]}"]["estimate"] == pytest.approx(0.125)
    assert res["gains"][rl[0]]["estimate"] == pytest.approx(0.3125 - 0.5)
    assert [len(d) for d in res["diagnostics"].values()] == [1, 1]  # the logged runs only
    table = (root / "table.md").read_text()
    assert f"{rl[0]} seeds [1]" in table and "imported from a stored report" in table
    row = next(line for line in table.splitlines() if line.startswith(f"| {rl[0]} (2 seeds)"))
    assert row.split("|")[4].strip().startswith("60.0 ")  # the validation column: seed 1's log only
    # a saved run with other scores is never overwritten by an import
    clash = root / "runs" / run_slug(rl[0], 0) / "result.json"
    clash.write_text(json.dumps(run(rl[0], 0, 0.9)))
    with pytest.raises(ValueError, match="exists and differs"):
        run_comparison(name, tmp_path / "new", seeds=2, smoke=True, progress=False, report_only=True, stored=path)
    assert json.loads(clash.read_text())["accuracy"] == 0.9
    with pytest.raises(SystemExit, match="--import-results applies to the Countdown comparisons"):
        main(["replicate", "gcpo-vs-grpo", "--import-results", str(path)])
    with pytest.raises(SystemExit, match="no such file"):
        main(["replicate", name, "--import-results", str(tmp_path / "missing.json")])
