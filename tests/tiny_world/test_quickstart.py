"""The README's main command (`mmrl quickstart`) at smoke size, and its preset in sync with the recipe."""
from __future__ import annotations

import json
from pathlib import Path

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


def test_replicate_smoke_same_rollout_budget(tmp_path, monkeypatch):
    from mmrl.tiny_world.replicate import COMPARISONS, arm_config

    # every arm samples the same number of rollout batches: optimizer steps = rollouts x reuse F
    for name, arms in COMPARISONS.items():
        for arm, over in arms.items():
            cfg = arm_config(name, arm, seed=0, rollouts=5, out=tmp_path)
            assert cfg["max_steps"] == 5 * over.get("num_iterations", 1)
            assert cfg["max_steps"] // cfg["num_iterations"] == 5
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    assert main(["replicate", "dmpo-small-batch", "--smoke", "--seeds", "1", "--rollouts", "1", "--out", str(tmp_path / "rep")]) == 0
    root = tmp_path / "rep" / "dmpo-small-batch"
    res = json.loads((root / "results.json").read_text())
    assert set(res["arms"]) == set(COMPARISONS["dmpo-small-batch"])
    assert all(len(runs) == 1 and 0 <= runs[0]["accuracy"] <= 1 for runs in res["arms"].values())
    n = len(res["test_puzzles"])
    assert len(res["base_items"]) == n and all(len(runs[0]["items"]) == n for runs in res["arms"].values())
    assert set(res["gains"]) == set(COMPARISONS["dmpo-small-batch"])
    table = (root / "table.md").read_text()
    assert all(arm in table for arm in COMPARISONS["dmpo-small-batch"]) and "base model" in table
    assert (root / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_shapes_quickstart_smoke_writes_report(tmp_path, monkeypatch):
    """The default main command (GCPO on the shapes world) end to end at smoke size: a 20-step base, 2 RL steps."""
    from mmrl.geneval.rules import TASKS

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
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


def test_gcpo_vs_grpo_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
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


def test_gcpo_vs_grpo_lr_choice_scores_validation_only(tmp_path, monkeypatch):
    """`mmrl replicate gcpo-vs-grpo-lr` trains both arms at each lr and scores validation prompts only: no test
    prompt is ever evaluated, and the chosen lr is the one with the best validation mean over the two arms."""
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register
    from mmrl.tiny_world.shapes_rl import LR_CHOICES

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
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


def test_lr_flag_rejected_outside_gcpo_vs_grpo(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="--lr applies to gcpo-vs-grpo only"):
        main(["replicate", "dmpo-small-batch", "--lr", "1e-4", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--lr must be > 0, got -0.001"):
        main(["replicate", "gcpo-vs-grpo", "--lr=-1e-3", "--out", str(tmp_path)])
