"""Reasoning RL on the tiny world: the comparisons' configs, DMPO's bounded negative weights, the held-out figures
and the overfit-pool check, at smoke size."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmrl.algorithms.dmpo import dmpo_real_weights
from mmrl.cli import main
from mmrl.config.train_config import load_config
from mmrl.core.registry import METHODS
from mmrl.tiny_world import overfit_pool, reasoning_rl


def test_negative_scale_by_hand():
    w = torch.tensor([0.7, 0.2, 0.1, 0.0])
    base = torch.full((4,), 0.25)
    # d = w - 0.25 = [0.45, -0.05, -0.15, -0.25]
    assert torch.allclose(dmpo_real_weights(w, base, 1.0), torch.tensor([0.45, -0.05, -0.15, -0.25]))
    assert torch.allclose(dmpo_real_weights(w, base, 1.0, 0.0), torch.tensor([0.45, 0.0, 0.0, 0.0]))
    assert torch.allclose(dmpo_real_weights(w, base, 1.0, 0.5), torch.tensor([0.45, -0.025, -0.075, -0.125]))
    # a group with no rewarded answer (uniform weights): nothing to fit, whatever the scale
    assert torch.allclose(dmpo_real_weights(base, base, 1.0, 0.0), torch.zeros(4))


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_negative_scale_range(bad):
    with pytest.raises(Exception, match="dmpo_negative_scale"):
        load_config(None, {"method": "dmpo", "dmpo_negative_scale": bad})


def test_arms_share_the_recipe_and_rollouts(tmp_path):
    for name, comp in reasoning_rl.COMPARISONS.items():
        cfgs = {a: reasoning_rl.arm_config(name, a, seed=0, out=tmp_path) for a in comp["arms"]}
        for arm, cfg in cfgs.items():
            assert cfg["max_steps"] == comp["rollouts"] * cfg["num_iterations"]  # the same rollout batches
            own = set(comp["arms"][arm])
            for key, value in comp["recipe"].items():  # only the arm's own keys differ from the recipe
                if key not in own:
                    assert cfg[key] == value, (name, arm, key)
            load_config(None, cfg)  # valid
    dg = reasoning_rl.COMPARISONS["dgpo-vs-grpo"]["arms"]
    assert {a["method"] for a in dg.values()} == {"grpo", "dapo", "dgpo"}
    reuse = reasoning_rl.COMPARISONS["dmpo-reuse-countdown3"]["arms"]
    assert {a.get("num_iterations") for a in reuse.values()} == {1, 8, 24}


def test_overfit_pool_covers_every_method_and_the_matrix(tmp_path):
    cells = overfit_pool.cells()
    assert {m for _, m in cells} == set(METHODS)
    for m in overfit_pool.MATRIX:
        assert {f for f, mm in cells if mm == m} == set(overfit_pool.FAMILIES)
    for f, m in cells:
        load_config(None, overfit_pool.cell_config(f, m, seed=0, out=tmp_path))


def test_held_out_greedy_sampled_pass_at_k():
    """held_out on a tiny random causal LM: sampled accuracy is the mean over k, pass@k the any-correct rate."""
    from mmrl.models import adapter_class
    from mmrl.core.registry import REWARDS

    @REWARDS.register("_first_char_is_a") if "_first_char_is_a" not in REWARDS else (lambda f: f)
    def _first_char_is_a(prompts, completions, **kw):
        return [1.0 if str(c).startswith("a") else 0.0 for c in completions]

    pol = adapter_class("causal_lm").tiny(seed=0, max_new_tokens=3)
    rows = [{"prompt": "xy"}, {"prompt": "z"}]
    res = reasoning_rl.held_out(pol, rows, "_first_char_is_a", "causal_lm", 3, k=6)
    assert set(res) == {"greedy", "sampled", "pass@6"}
    assert 0 <= res["sampled"] <= res["pass@6"] <= 1 and res["greedy"] in (0.0, 0.5, 1.0)
    summary, items = reasoning_rl.held_out_items(pol, rows, "_first_char_is_a", "causal_lm", 3, k=6)
    assert summary == res  # same seeds, same figures
    assert len(items["sampled"]) == len(items["greedy"]) == len(items["pass"]) == 2
    assert sum(items["sampled"]) / 2 == pytest.approx(res["sampled"]) and sum(items["pass"]) / 2 == pytest.approx(res["pass@6"])
    assert all(p >= s for p, s in zip(items["pass"], items["sampled"]))


def test_reasoning_comparison_smoke(tmp_path, monkeypatch, smoke_cache):
    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    dapo = reasoning_rl.DAPO_RECIPE
    assert main(["replicate", "dgpo-vs-grpo", "--smoke", "--seeds", "1", "--out", str(tmp_path / "rep"), "--arm", "GRPO",
                 "--arm", "DGPO", "--arm", dapo]) == 0
    root = tmp_path / "rep" / "dgpo-vs-grpo"
    res = json.loads((root / "results.json").read_text())
    equal = reasoning_rl.equal_rollouts_label(dapo, "GRPO")  # the dynamic-sampling arm at GRPO's sampled answers
    assert set(res["arms"]) == {"GRPO", "DGPO", dapo, equal, "RFT"}  # RFT: rejection sampling at the same rollouts
    assert res["arms"]["GRPO"][0]["rollouts"] == res["arms"]["RFT"][0]["rollouts"] == res["equal_rollouts_cap"] == 2 * 32
    assert res["arms"][equal][0]["rollouts"] <= res["equal_rollouts_cap"]  # (dynamic sampling is off at smoke size)
    assert list(res["arms"]) == ["GRPO", "DGPO", dapo, equal, "RFT"] and res["seeds_used"] == [0]
    n = len(res["test_prompts"])
    assert len(res["before_items"]["sampled"]) == n and len(res["reference"]["items"]["greedy"]) == n
    for runs in res["arms"].values():
        assert {"greedy", "sampled", "pass@2"} <= set(runs[0]["after"])
        assert len(runs[0]["items"]["sampled"]) == n  # per-problem scores, per seed
        # the summary is the mean of the per-problem scores
        assert sum(runs[0]["items"]["sampled"]) / n == pytest.approx(runs[0]["after"]["sampled"])
    gain = res["arm_intervals"]["GRPO"]["gain"]
    assert gain["low"] <= gain["estimate"] <= gain["high"] and gain["n_items"] == n
    assert {f"GRPO - {dapo}", "GRPO - RFT", "GRPO - clean SFT"} <= set(res["differences"])
    assert (root / "runs" / "grpo-seed0" / "result.json").exists()  # each run saved as it finishes
    table = (root / "table.md").read_text()
    assert "base model" in table and "shortcut answers" in table and "[95% CI]" in table and "clean SFT" in table
    assert "GRPO (1 seeds)" in table or "GRPO (1 seed" in table
    lines = (root / "runs" / "grpo-seed0" / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 32 and "=" in json.loads(lines[0])["prompt"]  # 2 rollouts x 8 prompts x 4 answers
    for png in ("accuracy.png", "reward.png", "kl.png", "shortcut.png"):
        assert (root / png).read_bytes()[:4] == b"\x89PNG"


def test_overfit_pool_smoke(tmp_path, monkeypatch, smoke_cache):
    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    res = overfit_pool.run_overfit_pool(tmp_path / "rep", seeds=1, smoke=True, progress=False,
                                        only=[("causal_lm", "grpo"), ("causal_lm", "dmpo")])
    assert set(res["cells"]) == {"causal_lm / grpo", "causal_lm / dmpo"}
    for runs in res["cells"].values():
        assert len(runs[0]["rewards"]) == 2 and all(0 <= r <= 1 for r in runs[0]["rewards"])
    assert (tmp_path / "rep" / "overfit-pool" / "reward.png").read_bytes()[:4] == b"\x89PNG"


def test_dgpo_preset_is_the_comparisons_dgpo_arm(tmp_path):
    import yaml
    from pathlib import Path

    preset = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "tiny_dgpo_countdown3.yaml").read_text())
    arm = reasoning_rl.arm_config("dgpo-vs-grpo", "DGPO", seed=0, out=tmp_path)
    for key in ("output_dir", "seed", "progress_bar", "eval_steps"):
        preset.pop(key, None)
        arm.pop(key, None)
    assert preset == arm


def test_lazy_demonstrations_are_the_shortcut_in_prompt_order():
    """countdown3's `lazy_frac`: that share of targets becomes `(a op b) op c` (the prompt's numbers in order), the
    rest stay the true solutions; the "+" shortcut is right exactly when the numbers add up to the target."""
    import dataclasses

    from mmrl.rewards.countdown import countdown_correct
    from mmrl.tiny_world.models import TINY_MODELS, _training_pairs

    clean = TINY_MODELS["countdown3-ar"]
    lazy = TINY_MODELS["countdown3-ar-lazy"]
    assert lazy.data == {"lazy_frac": 0.5, "lazy_op": "*"} and lazy.arch == clean.arch and lazy.task == clean.task
    prompts, truth = _training_pairs(clean)
    for op in ("+", "*"):
        prompts2, targets = _training_pairs(dataclasses.replace(clean, data={"lazy_frac": 0.5, "lazy_op": op}))
        assert prompts2 == prompts
        n_lazy = 0
        for p, t, y in zip(prompts, truth, targets):
            nums, target = p.split("=")
            a, b, c = nums.split(",")
            if y != t:
                assert y == f"({a}{op}{b}){op}{c}"
                n_lazy += 1
                if op == "+":
                    assert countdown_correct(f"<answer>{y}</answer>", [int(a), int(b), int(c)], float(target)) == (
                        int(a) + int(b) + int(c) == int(target))
        # 0.5 of 11500 rows, less the rows whose true solution already is the shortcut: binomial sd ~ 0.005
        assert 0.40 < n_lazy / len(prompts) < 0.52, op
    with pytest.raises(ValueError, match="lazy_frac"):
        _training_pairs(dataclasses.replace(lazy, data={"lazy_frac": 1.0}))
    with pytest.raises(ValueError, match="lazy_op"):
        _training_pairs(dataclasses.replace(lazy, data={"lazy_frac": 0.5, "lazy_op": "-"}))


def test_reasoning_comparison_base_option(tmp_path):
    cfg = reasoning_rl.arm_config("dgpo-vs-grpo", "GRPO", seed=0, out=tmp_path, base="countdown3-ar")
    assert cfg["model_name_or_path"] == "tiny-world:countdown3-ar"
    with pytest.raises(ValueError, match="valid: .*countdown3-ar"):
        reasoning_rl.run_reasoning_comparison("dgpo-vs-grpo", tmp_path, base="sudoku4", progress=False)
    with pytest.raises(SystemExit, match="--base"):
        main(["replicate", "dmpo-small-batch", "--base", "countdown3-ar", "--out", str(tmp_path)])


def test_shortcut_share_counts_the_shortcut_per_step(tmp_path):
    assert reasoning_rl.is_shortcut("15,17,28=30", "(15+17)+28", "+")
    assert reasoning_rl.is_shortcut("15,17,28=60", " (15+17)+28 ", "+")  # right by luck: still the shortcut
    assert reasoning_rl.is_shortcut("2,3,4=24", "(2*3)*4", "*") and not reasoning_rl.is_shortcut("2,3,4=24", "(2*3)*4", "+")
    assert not reasoning_rl.is_shortcut("15,17,28=30", "(17-15)+28", "+")
    assert not reasoning_rl.is_shortcut("15,17,28=30", "(17+15)+28", "+")  # another order: a real solver's answer
    assert not reasoning_rl.is_shortcut("no numbers", "(15+17)+28", "+")
    rows = [(1, "1,2,3=6", "(1*2)*3"), (1, "1,2,3=6", "(3+2)+1"), (2, "4,5,6=9", "(4*5)*6"), (1, "4,5,6=9", "(4*5)*6")]
    (tmp_path / "completions.jsonl").write_text("".join(json.dumps({"step": s, "prompt": p, "completion": c}) + "\n"
                                                        for s, p, c in rows))
    assert reasoning_rl.shortcut_share(tmp_path, "*") == [(1, 2 / 3), (2, 1.0)]
    assert reasoning_rl.shortcut_share(tmp_path / "missing") == []


def test_dllm_comparison_smoke_with_the_trust_region(tmp_path, monkeypatch, smoke_cache):
    """The masked-diffusion Countdown comparison end to end at smoke size: DMPO with reuse F = 8 under the trust
    region on the `countdown3-md` base; per-item scores and paired intervals land in results.json."""
    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    res = reasoning_rl.run_reasoning_comparison("dllm-countdown3", tmp_path / "rep", seeds=1, smoke=True, progress=False,
                                                rollouts=1, arms=["DMPO F=8, trust region 0.05"],  # 8 steps on 1 rollout
                                                baselines=False)  # (rows: below)
    run = res["arms"]["DMPO F=8, trust region 0.05"][0]
    assert len(run["items"]["greedy"]) == len(res["before_items"]["greedy"]) == 16
    gain = res["intervals"]["gain"]["DMPO F=8, trust region 0.05"]["greedy"]
    assert gain["low"] <= gain["estimate"] <= gain["high"] and gain["n_items"] == 16
    records = (tmp_path / "rep" / "dllm-countdown3" / "runs" / "dmpo_f_8_trust_region_0_05-seed0" / "metrics.jsonl").read_text()
    assert "dmpo/trust_region_clipped" in records


def test_held_out_items_count_the_shortcut_and_the_non_shortcut_accuracy(monkeypatch):
    """The held-out shortcut share and the accuracy among non-shortcut answers, by hand: the evaluation's answers
    and scores are fixed here so the bookkeeping is what is checked (a shortcut answer that happens to be right
    counts as shortcut, not as a right non-shortcut answer)."""
    from mmrl.training import evaluate as ev

    rows = [{"prompt": "2,3,4=24"}, {"prompt": "5,1,7=12"}]
    answers = {None: (["(2*3)*4", "5+7"], [1.0, 1.0]),  # greedy
               1000: (["(2*3)*4", "5+7*1"], [1.0, 0.0]),  # sample 0: A is the shortcut (and right), B a wrong non-shortcut
               1001: (["2*3*4", "(5*1)*7"], [1.0, 0.0])}  # sample 1: A right, not the shortcut string; B the shortcut

    def fixed(policy, rows_, metric, *, seed=None, **kw):
        comps, scores = answers[seed]
        return ev.EvalResult("countdown3", metric, sum(scores) / len(scores), len(rows_), 0.0, scores, comps)

    monkeypatch.setattr(ev, "evaluate", fixed)
    summary, items = reasoning_rl.held_out_items(None, rows, "countdown3_accuracy", "causal_lm", 16, k=2, shortcut_op="*")
    assert items["shortcut"] == [0.5, 0.5]
    assert items["right_not_shortcut"] == [0.5, 0.0]  # A: only sample 1 counts; B: none right
    assert items["greedy_shortcut"] == [1.0, 0.0]
    assert summary["shortcut"] == pytest.approx(0.5)
    assert summary["non_shortcut_accuracy"] == pytest.approx(0.5 / 1.0)  # 1 right of the 2 non-shortcut answers
    assert summary["sampled"] == pytest.approx(0.5)  # the plain accuracy still counts the right shortcut
    plain, plain_items = reasoning_rl.held_out_items(None, rows, "countdown3_accuracy", "causal_lm", 16, k=2)
    assert "shortcut" not in plain_items and "shortcut" not in plain


def test_dmpo_kl_2x2_arms_differ_only_in_method_and_beta(tmp_path):
    """`dmpo-kl-countdown3` (issue 23 item 5): {DMPO, diffu-GRPO} x {no KL, KL 0.1} on one optimizer setting. The
    resolved configs (method defaults applied) of two arms differ only in the method, its own options and beta."""
    import dataclasses

    from mmrl.config.train_config import METHOD_DEFAULTS

    name = "dmpo-kl-countdown3"
    arms = reasoning_rl.COMPARISONS[name]["arms"]
    cfgs = {a: load_config(None, reasoning_rl.arm_config(name, a, seed=0, out=tmp_path)) for a in arms}
    assert {(c.method, c.beta) for c in cfgs.values()} == {("dmpo", 0.0), ("dmpo", 0.1), ("diffu_grpo", 0.0), ("diffu_grpo", 0.1)}
    fields = [f.name for f in dataclasses.fields(next(iter(cfgs.values()))) if not f.name.startswith("_")]
    own = {"method", "beta"} | set(METHOD_DEFAULTS["diffu_grpo"]) | set(METHOD_DEFAULTS["dmpo"]) | {f for f in fields if f.startswith("dmpo_")}
    optimizer = ("learning_rate", "lr_scheduler_type", "warmup_ratio", "adam_beta1", "adam_beta2", "max_grad_norm",
                 "weight_decay", "num_iterations", "max_steps", "per_device_train_batch_size", "num_generations")
    for a, ca in cfgs.items():
        for b, cb in cfgs.items():
            differ = {f for f in fields if getattr(ca, f) != getattr(cb, f)} - {"output_dir"}
            assert differ <= own, (a, b, differ - own)
            for f in optimizer:  # one optimizer setting: DMPO's own defaults (clip 0.2, beta2 0.99, wd 0.1) do not apply
                assert getattr(ca, f) == getattr(cb, f), (a, b, f)
            if ca.method == cb.method:
                assert differ <= {"beta"}, (a, b, differ)
    assert cfgs["DMPO, no KL"].max_grad_norm == 1.0 and cfgs["DMPO, no KL"].adam_beta2 == 0.999
    assert cfgs["DMPO, no KL"].weight_decay == 0.0 and cfgs["DMPO, KL 0.1"].num_iterations == 1


def test_dmpo_vs_d1_countdown3_arms_as_their_tables(tmp_path):
    """`dmpo-vs-d1-countdown3` keeps the arms its tables were made with: diffu-GRPO with the shared KL 0.1 and the shared
    optimizer, DMPO with no KL term (beta 0, pinned since DMPO gained an optional KL term) and its own optimizer
    defaults (clip 0.2, beta2 0.99, weight decay 0.1): the confounds docs/RESULTS.md names beside its table."""
    name = "dmpo-vs-d1-countdown3"
    cfg = {a: load_config(None, reasoning_rl.arm_config(name, a, seed=0, out=tmp_path, rollouts=30))
           for a in reasoning_rl.COMPARISONS[name]["arms"]}
    d1, dmpo = cfg["diffu-GRPO (d1)"], cfg["DMPO"]
    assert (d1.method, d1.beta, d1.adam_beta2, d1.max_grad_norm, d1.weight_decay) == ("diffu_grpo", 0.1, 0.999, 1.0, 0.0)
    assert (dmpo.method, dmpo.beta, dmpo.adam_beta2, dmpo.max_grad_norm, dmpo.weight_decay) == ("dmpo", 0.0, 0.99, 0.2, 0.1)
    assert d1.max_steps == dmpo.max_steps == 30 and d1.num_iterations == dmpo.num_iterations == 1
    assert d1.learning_rate == dmpo.learning_rate == 5e-4


def test_dmpo_kl_comparison_smoke(tmp_path, monkeypatch, smoke_cache):
    """The 2 x 2's DMPO-with-KL arm end to end at smoke size: the KL term is logged every step, the test items carry
    the shortcut counts, and the table has the shortcut columns and their differences."""
    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    res = reasoning_rl.run_reasoning_comparison("dmpo-kl-countdown3", tmp_path / "rep", seeds=1, smoke=True, progress=False,
                                                arms=["DMPO, KL 0.1", "diffu-GRPO, no KL"], baselines=False)
    n = len(res["test_prompts"])
    for arm in ("DMPO, KL 0.1", "diffu-GRPO, no KL"):
        run = res["arms"][arm][0]
        items, after = run["items"], run["after"]
        assert len(items["shortcut"]) == len(items["right_not_shortcut"]) == len(items["greedy_shortcut"]) == n
        assert all(r <= s + 1e-9 for r, s in zip(items["right_not_shortcut"], items["sampled"]))
        assert sum(items["shortcut"]) / n == pytest.approx(after["shortcut"])
    root = tmp_path / "rep" / "dmpo-kl-countdown3"
    records = [json.loads(x) for x in (root / "runs" / "dmpo_kl_0_1-seed0" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert len(steps) == 2 and all("kl" in r and "diag/kl_k3" in r for r in steps)
    grpo0 = [json.loads(x) for x in (root / "runs" / "diffu_grpo_no_kl-seed0" / "metrics.jsonl").read_text().splitlines()]
    assert any("diag/kl_k3" in r for r in grpo0)  # the diagnostics reference measures the KL of the beta-0 arm too
    table = (root / "table.md").read_text()
    assert "held-out shortcut share" in table and "accuracy among non-shortcut answers" in table
    assert "DMPO, KL 0.1 - diffu-GRPO, no KL" in res["shortcut_differences"]


def test_dapo_recipe_arm_is_dapos_recipe(tmp_path):
    """`dgpo-vs-grpo`'s DAPO-recipe arm, as loaded: dynamic sampling, no KL, clip-higher 0.2 / 0.28, token mean, the
    overlong penalty over the last fifth of L_max, DAPO's +1 / -1 reward spread; the rest the shared recipe's."""
    arms = reasoning_rl.COMPARISONS["dgpo-vs-grpo"]["arms"]
    cfg = load_config(None, reasoning_rl.arm_config("dgpo-vs-grpo", reasoning_rl.DAPO_RECIPE, seed=0, out=tmp_path))
    assert (cfg.method, cfg.beta, cfg.dynamic_sampling, cfg.epsilon, cfg.epsilon_high, cfg.loss_type) == (
        "dapo", 0.0, True, 0.2, 0.28, "dapo")
    assert cfg.overlong_penalty and cfg.overlong_buffer_len == 3 and cfg.max_completion_length == 16
    assert cfg.reward_weights == [2.0] and cfg.max_steps == 120 and cfg.num_iterations == 1
    grpo = load_config(None, reasoning_rl.arm_config("dgpo-vs-grpo", "GRPO", seed=0, out=tmp_path))
    assert (grpo.beta, grpo.dynamic_sampling) == (0.1, False)
    for key in ("learning_rate", "per_device_train_batch_size", "num_generations", "temperature", "lr_scheduler_type"):
        assert getattr(cfg, key) == getattr(grpo, key), key
    # the loss-only arm keeps the shared KL and rollouts, as its name says
    loss_only = load_config(None, reasoning_rl.arm_config("dgpo-vs-grpo", "DAPO loss (no dynamic sampling, KL 0.1)",
                                                          seed=0, out=tmp_path))
    assert (loss_only.beta, loss_only.dynamic_sampling) == (0.1, False)
    assert reasoning_rl.DAPO_RECIPE in arms


def test_count_sampled_and_the_equal_rollouts_snapshot():
    """count_sampled adds each rollout batch's sampled answers (all dynamic-sampling tries) and calls `take` once,
    before the first batch drawn after the cap was reached; complete_seeds keeps the seeds every row finished."""
    from types import SimpleNamespace

    per_batch = iter([100, 150, 120, 90])

    class Fake:
        step = 0

        def _collect(self):
            self.step += 1  # the optimizer step that follows this batch, as far as `take` can tell
            return SimpleNamespace(metrics={"dynamic_sampling/sampled_responses": next(per_batch)},
                                   rollout=SimpleNamespace(num_responses=64))

    t = Fake()
    taken = []
    state = reasoning_rl.count_sampled(t, cap=250, take=lambda step, n: taken.append((step, n)) or "snap")
    for _ in range(4):
        t._collect()
    assert state["sampled"] == 460 and taken == [(2, 250)] and state["taken"] == "snap"
    plain = SimpleNamespace(_collect=lambda: SimpleNamespace(metrics={}, rollout=SimpleNamespace(num_responses=64)))
    st = reasoning_rl.count_sampled(plain)
    plain._collect(), plain._collect()
    assert st == {"sampled": 128, "taken": None}
    assert reasoning_rl.complete_seeds({"a": {0, 1, 2}, "b": {0, 2}, "c": {2, 0, 3}}, ["a", "b", "c"], 5) == [0, 2]
    assert reasoning_rl.complete_seeds({"a": {0}}, ["a", "b"], 5) == []


@pytest.mark.parametrize("arm, preset", [("diffu-GRPO, d1's settings", "d1_diffu_grpo_llada_8b.yaml"),
                                         ("DMPO, its authors' settings", "dmpo_llada_8b_countdown.yaml")])
def test_authors_arms_follow_the_presets(tmp_path, arm, preset):
    """`dmpo-authors-countdown3`: each arm, as loaded, has its preset's (the authors' code's) algorithm and optimizer
    settings; only the documented scale-dependent ones (lr, batch, answers per prompt, lengths) are the shared
    recipe's, as for every other arm of the Countdown comparisons."""
    root = Path(__file__).resolve().parents[2]
    ref = load_config(root / "configs" / preset, validate=False)
    cfg = load_config(None, reasoning_rl.arm_config("dmpo-authors-countdown3", arm, seed=0, out=tmp_path))
    for key in ("method", "num_iterations", "beta", "epsilon", "epsilon_high", "scale_rewards", "loss_type",
                "temperature", "lr_scheduler_type", "warmup_ratio", "adam_beta1", "adam_beta2", "weight_decay",
                "max_grad_norm", "dynamic_sampling"):
        assert getattr(cfg, key) == getattr(ref, key), key
    if cfg.method == "dmpo":
        for key in ("dmpo_loss", "dmpo_target", "dmpo_baseline", "dmpo_alpha"):
            assert getattr(cfg, key) == getattr(ref, key), key
    shared = load_config(None, reasoning_rl.arm_config("dgpo-vs-grpo", "GRPO", seed=0, out=tmp_path))
    for key in ("learning_rate", "per_device_train_batch_size", "num_generations", "max_completion_length", "task"):
        assert getattr(cfg, key) == getattr(shared, key), key
    # the same 12 rollout batches for both arms: the optimizer steps follow the reuse
    assert cfg.max_steps == 12 * ref.num_iterations and cfg.num_iterations == ref.num_iterations


def test_dllm_d1_arms_carry_d1s_settings_on_the_masked_diffusion_recipe(tmp_path):
    """`dllm-countdown3-d1`: each arm, as loaded, has the d1 preset's algorithm and optimizer settings (mu = 12, clip
    0.5, KL 0.04, ...) and its mean-field estimator options; it differs from `dllm-countdown3`'s shared-recipe
    diffu-GRPO exactly in those settings (and the steps they imply), and the two arms differ only in the lr."""
    import dataclasses

    root = Path(__file__).resolve().parents[2]
    ref = load_config(root / "configs" / "d1_diffu_grpo_llada_8b.yaml", validate=False)
    shared = load_config(None, reasoning_rl.arm_config("dllm-countdown3", "diffu-GRPO", seed=0, out=tmp_path))
    arms = {lr: load_config(None, reasoning_rl.arm_config("dllm-countdown3-d1", reasoning_rl.d1_md_label(lr), seed=0,
                                                          out=tmp_path)) for lr in reasoning_rl.DLLM_D1_LRS}
    d1_keys = ("method", "num_iterations", "beta", "epsilon", "epsilon_high", "scale_rewards", "loss_type",
               "temperature", "lr_scheduler_type", "warmup_ratio", "adam_beta1", "adam_beta2", "weight_decay",
               "max_grad_norm", "logprob_estimator", "p_mask_prompt", "random_masking")
    for cfg in arms.values():
        for key in d1_keys:
            assert getattr(cfg, key) == getattr(ref, key), key
        assert (cfg.num_iterations, cfg.max_steps, cfg.eval_steps) == (12, 360, 60)
        assert (cfg.family, cfg.model_name_or_path) == ("masked_diffusion", "tiny-world:countdown3-md")
    assert arms["5e-4"].learning_rate == 5e-4 and arms["5e-4/12"].learning_rate * 12 == pytest.approx(5e-4)
    fields = [f.name for f in dataclasses.fields(shared) if not f.name.startswith("_")]
    assert {f for f in fields if getattr(arms["5e-4"], f) != getattr(arms["5e-4/12"], f)} == {"learning_rate"}
    assert {f for f in fields if getattr(shared, f) != getattr(arms["5e-4"], f)} == {
        "num_iterations", "max_steps", "eval_steps", "beta", "epsilon_high", "temperature", "lr_scheduler_type",
        "warmup_ratio", "adam_beta2", "weight_decay", "max_grad_norm"}
    with pytest.raises(ValueError, match="unknown d1-settings lr"):
        reasoning_rl.d1_md_label("1e-3")


def test_grpo_no_kl_arm_differs_from_grpo_only_in_beta(tmp_path):
    """`dgpo-vs-grpo`'s KL-free GRPO arm, as loaded: GRPO's config with beta 0 (and the frozen copy that only measures
    the KL for the diagnostics); every other field, the optimizer's and the rollouts' included, is GRPO's."""
    import dataclasses

    name = "dgpo-vs-grpo"
    grpo = load_config(None, reasoning_rl.arm_config(name, "GRPO", seed=3, out=tmp_path))
    nokl = load_config(None, reasoning_rl.arm_config(name, reasoning_rl.GRPO_NO_KL, seed=3, out=tmp_path))
    fields = [f.name for f in dataclasses.fields(grpo) if not f.name.startswith("_")]
    differ = {f for f in fields if getattr(grpo, f) != getattr(nokl, f)}
    assert differ == {"beta", "diagnostics_reference"}, differ
    assert (grpo.beta, nokl.beta) == (0.1, 0.0)
    assert (nokl.method, nokl.dynamic_sampling, nokl.diagnostics_reference) == ("grpo", False, True)
    assert (nokl.max_steps, nokl.learning_rate, nokl.seed) == (120, 5e-4, 3)


def test_dllm_correct_only_arm_is_dmpo_arm_with_its_baseline(tmp_path):
    """`dllm-countdown3`'s non-negative DMPO arm, as loaded: the DMPO arm's config with `dmpo_baseline: correct_only`
    (strength 1, F = 1), every other field the same."""
    import dataclasses

    name = "dllm-countdown3"
    arm = load_config(None, reasoning_rl.arm_config(name, reasoning_rl.DMPO_CORRECT_ONLY, seed=0, out=tmp_path, rollouts=20))
    ref = load_config(None, reasoning_rl.arm_config(name, "DMPO", seed=0, out=tmp_path, rollouts=20))
    diff = {f.name for f in dataclasses.fields(arm) if getattr(arm, f.name) != getattr(ref, f.name)}
    assert diff == {"dmpo_baseline"} and arm.dmpo_baseline == "correct_only" and ref.dmpo_baseline == "group"
    assert (arm.dmpo_baseline_strength, arm.num_iterations, arm.max_steps) == (1.0, 1, 20)


def test_dllm_correct_only_kl_controls_differ_in_one_field(tmp_path):
    """The KL controls of `dllm-countdown3`: `DMPO_CORRECT_ONLY` (which keeps the recipe's beta 0.1) and its no-KL twin
    differ in beta alone; the reference-target arm differs from the no-KL twin in the target alone."""
    import dataclasses

    name = "dllm-countdown3"
    kl = load_config(None, reasoning_rl.arm_config(name, reasoning_rl.DMPO_CORRECT_ONLY, seed=0, out=tmp_path, rollouts=20))
    nokl = load_config(None, reasoning_rl.arm_config(name, reasoning_rl.DMPO_CORRECT_ONLY_NO_KL, seed=0, out=tmp_path,
                                                     rollouts=20))
    diff = {f.name for f in dataclasses.fields(kl) if getattr(kl, f.name) != getattr(nokl, f.name)}
    assert diff == {"beta"} and (kl.beta, nokl.beta) == (0.1, 0.0)
    assert nokl.dmpo_baseline == "correct_only" and nokl.method == "dmpo"
    ref = load_config(None, reasoning_rl.arm_config(name, reasoning_rl.DMPO_CORRECT_ONLY_REFERENCE, seed=0, out=tmp_path,
                                                    rollouts=20))
    diff = {f.name for f in dataclasses.fields(ref) if getattr(ref, f.name) != getattr(nokl, f.name)}
    assert diff == {"dmpo_target"} and (ref.dmpo_target, nokl.dmpo_target) == ("reference", "behaviour")


def test_dllm_reuse_arms_differ_from_correct_only_in_f_and_the_trust_region(tmp_path):
    """The reuse arms of `dllm-countdown3` (issue 24 item 3(a)): `DMPO_CORRECT_ONLY` with F = 4 / 8 optimizer steps
    per rollout batch (max_steps = 15 x F at 15 batches) and the trust region on the F = 8 one; `curve_points=3`
    evaluates every 5 rollout batches whatever F is."""
    import dataclasses

    name, rr = "dllm-countdown3", reasoning_rl
    f1 = load_config(None, rr.arm_config(name, rr.DMPO_CORRECT_ONLY, seed=0, out=tmp_path, rollouts=15, curve_points=3))
    for arm, f, tr in [(rr.DMPO_CORRECT_ONLY_F4, 4, None), (rr.DMPO_CORRECT_ONLY_F8, 8, None), (rr.DMPO_CORRECT_ONLY_F8_TR, 8, 0.05)]:
        cfg = load_config(None, rr.arm_config(name, arm, seed=0, out=tmp_path, rollouts=15, curve_points=3))
        diff = {x.name for x in dataclasses.fields(cfg) if getattr(cfg, x.name) != getattr(f1, x.name)} - {"_explicit"}
        assert diff == {"num_iterations", "max_steps", "eval_steps"} | ({"dmpo_trust_region"} if tr else set())
        assert (cfg.num_iterations, cfg.max_steps, cfg.eval_steps, cfg.dmpo_trust_region) == (f, 15 * f, 5 * f, tr)
    assert f1.eval_steps == 5
    with pytest.raises(ValueError, match="curve_points"):
        rr.arm_config(name, rr.DMPO_CORRECT_ONLY, seed=0, out=tmp_path, curve_points=-1)


def test_pass_at_k_by_hand():
    # 4 samples, 1 right: pass@2 = 1 - C(3, 2) / C(4, 2) = 1 - 3/6
    assert reasoning_rl.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert reasoning_rl.pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 is the share right
    assert reasoning_rl.pass_at_k(16, 0, 4) == 0.0 and reasoning_rl.pass_at_k(16, 13, 4) == 1.0  # n - c < k
    assert reasoning_rl.pass_at_k(16, 2, 16) == 1.0 and reasoning_rl.pass_at_k(16, 0, 16) == 0.0
    with pytest.raises(ValueError, match="pass_at_k"):
        reasoning_rl.pass_at_k(4, 5, 2)


def test_held_out_items_pass_at_j_and_stacked():
    """pass@j from k samples lies between the sampled accuracy and pass@k; the stacked pass gives the same figures'
    shapes and ranges."""
    from mmrl.models import adapter_class
    from mmrl.core.registry import REWARDS

    @REWARDS.register("_first_char_is_b") if "_first_char_is_b" not in REWARDS else (lambda f: f)
    def _first_char_is_b(prompts, completions, **kw):
        return [1.0 if str(c).startswith("b") else 0.0 for c in completions]

    pol = adapter_class("causal_lm").tiny(seed=0, max_new_tokens=2)
    rows = [{"prompt": "xy"}, {"prompt": "z"}, {"prompt": "q"}]
    for stacked in (False, True):
        summary, items = reasoning_rl.held_out_items(pol, rows, "_first_char_is_b", "causal_lm", 2, k=8, ks=(1, 4),
                                                     stacked=stacked, batch_size=5)
        assert items["pass@1"] == pytest.approx(items["sampled"])
        assert all(s <= p4 + 1e-9 <= p + 2e-9 for s, p4, p in zip(items["sampled"], items["pass@4"], items["pass"]))
        assert summary["pass@4"] == pytest.approx(sum(items["pass@4"]) / 3) and set(summary) >= {"pass@8", "pass@4"}


def test_long_answer_comparison_wiring(tmp_path):
    """dgpo-countdown4-steps: the arms on one recipe and rollout count; DGPO and GCPO are DAPO's recipe with their
    methods (their token credit the only difference); DAPO's overlong buffer is L / 5; four curve points a run; the
    regime comparison's GRPO run is this comparison's GRPO run."""
    name = "dgpo-countdown4-steps"
    comp = reasoning_rl.COMPARISONS[name]
    cfgs = {a: load_config(None, reasoning_rl.arm_config(name, a, seed=1, out=tmp_path)) for a in comp["arms"]}
    grpo, dgpo, dapo = cfgs["GRPO"], cfgs["DGPO"], cfgs[reasoning_rl.DAPO_RECIPE]
    assert (grpo.method, dgpo.method, dapo.method) == ("grpo", "dgpo", "dapo")
    assert grpo.max_steps == dgpo.max_steps == dapo.max_steps == comp["rollouts"]
    assert grpo.eval_steps == comp["rollouts"] // 4 and grpo.beta == dgpo.beta == dapo.beta == 0.0
    assert not grpo.dynamic_sampling and dgpo.dynamic_sampling and dapo.dynamic_sampling
    assert dapo.overlong_penalty and dapo.overlong_buffer_len == 34 and dapo.max_completion_length == 170
    diff = {k for k, v in dgpo.to_dict().items() if dapo.to_dict()[k] != v}
    assert diff <= {"method"}, diff  # every option the same but the method
    # GCPO (issue 25 item 4) on the same recipe: its method and its dual clip, which with one update per rollout
    # (ratio 1 at the update) never acts, so GCPO - DAPO is its token weighting alone
    gcpo = cfgs["GCPO"]
    diff = {k for k, v in gcpo.to_dict().items() if dapo.to_dict()[k] != v}
    assert gcpo.method == "gcpo" and diff <= {"method", "dual_clip"}, diff
    assert gcpo.num_iterations == 1 and gcpo.negative_instruction
    assert grpo.prompts_per_rollout * grpo.num_generations == 64 and grpo.model_name_or_path.endswith("countdown4-steps-ar")
    regime = reasoning_rl.arm_config("grpo-regime-countdown4-steps", "GRPO", seed=1, out=tmp_path)
    assert regime == reasoning_rl.arm_config(name, "GRPO", seed=1, out=tmp_path)


def test_dllm_baseline_rows_rft_and_continued_sft_then_the_report(tmp_path, monkeypatch):
    """The masked-diffusion comparison's baseline rows (`only_baselines`, no RL arm run): RFT at the first arm's
    rollouts and continued SFT on right answers at its optimizer steps x answers per step, both fitted with the base
    recipe's own loss (countdown3-md: no 1/t, mean over masked tokens); best-of-n at its answers per prompt; then a
    report over a saved RL arm shows every row, pass@k and each difference. A tiny untrained policy stands in for the
    base and a stand-in scorer reads the weights, so a row that did not train scores as the base."""
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter
    from mmrl.tiny_world import models, rft

    monkeypatch.setattr(models, "load_base_policy", lambda name, **kw: MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32))
    calls = {"options": [], "fits": []}
    nll, fit = rft.masked_diffusion_nll, rft.fit_batches
    monkeypatch.setattr(rft, "masked_diffusion_nll", lambda seed=0, **o: calls["options"].append(o) or nll(seed, **o))
    monkeypatch.setattr(rft, "fit_batches", lambda pol, batches, *a, **kw: calls["fits"].append(list(batches)) or fit(pol, batches, *a, **kw))

    def scorer(policy, rows, metric, family, length, k=4, batch_size=128, shortcut_op=None, **kw):
        w = float(sum(p.detach().double().sum() for p in policy.model.parameters()))  # moves when the weights do
        x = [float((i + int(abs(w) * 1e4)) % 3 == 0) for i in range(len(rows))]
        items = {"greedy": x, "sampled": x, "pass": x, "best": x, "shortcut": [0.0] * len(rows), "right_not_shortcut": x,
                 "greedy_shortcut": [0.0] * len(rows)}
        return {"greedy": sum(x) / len(x), "sampled": sum(x) / len(x), f"pass@{k}": sum(x) / len(x), "w": w}, items

    monkeypatch.setattr(reasoning_rl, "held_out_items", scorer)
    name, arm = "dllm-countdown3", "diffu-GRPO"
    out = reasoning_rl.run_reasoning_comparison(name, tmp_path, seeds=1, smoke=True, progress=False, arms=[arm],
                                                only_baselines=True, resume=True)
    root = tmp_path / name
    sft, rft_row = reasoning_rl.CONTINUED_SFT_ARM, reasoning_rl.RFT_ARM
    assert sorted(out["baseline_runs"]) == sorted([rft_row, sft]) and not (root / "runs" / "diffu_grpo-seed0").exists()
    assert calls["options"] and all(o == {"time_weight": "none", "normalise": "masked"} for o in calls["options"])
    base_w = json.loads((root / "base.json").read_text())["before"]["w"]
    answers = {r["solution"] for r in __import__("mmrl.data.tasks", fromlist=["load_task"]).load_task("countdown3").train}
    for seed in (0,):
        r = json.loads((root / "runs" / reasoning_rl.run_slug(rft_row, seed) / "result.json").read_text())
        s = json.loads((root / "runs" / reasoning_rl.run_slug(sft, seed) / "result.json").read_text())
        assert r["rollouts"] == 2 * 8 * 4 and r["steps"] == 2  # smoke: 2 rollout batches of 8 problems x 4 answers
        assert s["rollouts"] == 0 and s["steps"] == 2 and s["trained_sequences"] == 2 * 32 and len(s["loss"]) == 2
        assert s["after"]["w"] != base_w  # the continued SFT trained the weights
    sft_fits = [b for b in calls["fits"] if b and isinstance(b[0], tuple)]
    assert len(sft_fits) == 1 and all(len(b) == 2 for b in sft_fits)
    pol = MaskedDiffusionAdapter.tiny(seed=0, gen_length=16, hidden_size=32)
    for x_p, m_p, x_r, fixed in sft_fits[0]:
        assert x_r.shape == (32, 16) and not fixed.any()
        assert all(pol.tokenizer.decode(row).split(pol.tokenizer.eos_token)[0].replace(" ", "") in answers for row in x_r)
    assert json.loads((root / "best_of_n.json").read_text())["n"] == 4  # the first arm's answers per prompt
    # an RL arm's saved runs (as another call leaves them), then the report over every row
    for seed in (0,):
        d = root / "runs" / reasoning_rl.run_slug(arm, seed)
        d.mkdir(parents=True)
        x = [1.0] * 16
        (d / "result.json").write_text(json.dumps({"seed": seed, "after": {"greedy": 1.0, "sampled": 1.0, "pass@2": 1.0},
                                                   "items": {"greedy": x, "sampled": x, "pass": x, "best": x, "shortcut": [0.0] * 16,
                                                             "right_not_shortcut": x, "greedy_shortcut": [0.0] * 16},
                                                   "seconds": 1.0, "rollouts": 64, "steps": 2}))
    res = reasoning_rl.run_reasoning_comparison(name, tmp_path, seeds=1, smoke=True, progress=False, arms=[arm], report_only=True)
    assert list(res["arms"]) == [arm, rft_row, sft] and res["seeds_used"] == [0]
    assert {f"{arm} - {rft_row}", f"{arm} - {sft}", f"{arm} - best-of-4 from the base"} <= set(res["differences"])
    table = (root / "table.md").read_text()
    assert f"{sft} (1 seeds)" in table and "RFT (1 seeds)" in table and reasoning_rl.best_of_label(4) in table
    assert "pass@2" in table.splitlines()[0] and "64 sequences fitted per run" in table
    with pytest.raises(ValueError, match="only_baselines"):
        reasoning_rl.run_reasoning_comparison(name, tmp_path, smoke=True, progress=False, only_baselines=True, report_only=True)


def test_held_out_items_verified_best_of_k_scores_the_sample_the_verifier_picks(monkeypatch):
    """Best-of-k with a verifier that does not read the answer: per row the metric's score of the verifier's first
    choice (ties: the earliest sample), set by hand against fixed answers; the oracle "best" stays the max."""
    from mmrl.tiny_world.tasks import sudoku4_verifier
    from mmrl.training import evaluate as ev

    puzzle, solution = "1030000221400300", "1234341221434321"
    wrong_blank = "1434341221434321"  # 3 violations, 7 of 9 blanks right
    changed_given = "2234341221434321"  # 4 violations, every blank right
    rows = [{"prompt": "p", "puzzle": puzzle, "solution": solution}] * 2
    answers = {None: ([wrong_blank, wrong_blank], [0.0, 0.0]),
               1000: ([changed_given, wrong_blank], [1.0, 7 / 9]),  # row 0: fewer violations in sample 1
               1001: ([wrong_blank, solution], [7 / 9, 1.0])}  # row 1: the solution, 0 violations

    def fixed(policy, rows_, metric, *, seed=None, **kw):
        comps, scores = answers[seed]
        return ev.EvalResult("sudoku4", metric, sum(scores) / len(scores), len(rows_), 0.0, scores, comps)

    monkeypatch.setattr(ev, "evaluate", fixed)
    summary, items = reasoning_rl.held_out_items(None, rows, "sudoku4", "masked_diffusion", 16, k=2, verifier=sudoku4_verifier)
    assert items["best"] == [1.0, 1.0]  # the oracle: the highest score
    assert items["verified"] == pytest.approx([7 / 9, 1.0])  # (float32 scores) row 0: the 3-violation answer over the 4-violation one
    assert summary["verified"] == pytest.approx((7 / 9 + 1.0) / 2)
    tie = lambda row, c: 0.0  # noqa: E731
    assert reasoning_rl.held_out_items(None, rows, "sudoku4", "masked_diffusion", 16, k=2, verifier=tie)[1]["verified"] == pytest.approx([1.0, 7 / 9])


def test_lr_label_spells_the_lr_as_the_sweep_arms_do():
    """`lr_label`: one significant digit, the exponent without its zero; a non-positive lr is refused."""
    assert reasoning_rl.lr_label("diffu-GRPO", 5e-4) == "diffu-GRPO, lr 5e-4"
    assert reasoning_rl.lr_label("x", 2e-3) == "x, lr 2e-3" and reasoning_rl.lr_label("x", 1e-3) == "x, lr 1e-3"
    with pytest.raises(ValueError, match="> 0"):
        reasoning_rl.lr_label("x", 0.0)


def test_choose_lr_takes_the_best_figure_and_gives_ties_to_the_default():
    """The sweep's rule: the highest validation figure; a tie with the default goes to the default, others to the
    smaller lr."""
    assert reasoning_rl.choose_lr({2e-4: 0.15, 5e-4: 0.16, 1e-3: 0.18, 2e-3: 0.12}, 5e-4) == 1e-3
    assert reasoning_rl.choose_lr({2e-4: 0.18, 5e-4: 0.18, 1e-3: 0.18}, 5e-4) == 5e-4
    assert reasoning_rl.choose_lr({1e-3: 0.18, 2e-3: 0.18, 5e-4: 0.1}, 5e-4) == 1e-3
    with pytest.raises(ValueError, match="at least one"):
        reasoning_rl.choose_lr({}, 5e-4)


def test_dllm_lr_arms_differ_from_their_dllm_countdown3_arm_in_the_lr_alone(tmp_path):
    """`dllm-countdown3-lr`: every arm x lr, as loaded, is its `dllm-countdown3` arm with `learning_rate` changed;
    at 5e-4 it is the same configuration."""
    import dataclasses

    for arm in reasoning_rl.DLLM_LR_METHODS:
        ref = load_config(None, reasoning_rl.arm_config("dllm-countdown3", arm, seed=1, out=tmp_path))
        for lr in reasoning_rl.DLLM_LR_SWEEP:
            cfg = load_config(None, reasoning_rl.arm_config("dllm-countdown3-lr", reasoning_rl.lr_label(arm, lr), seed=1,
                                                            out=tmp_path))
            diff = {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(ref, f.name)}
            assert diff == (set() if lr == 5e-4 else {"learning_rate"}) and cfg.learning_rate == lr
            assert (cfg.max_steps, cfg.beta, cfg.lr_scheduler_type) == (30, 0.1, "cosine")


def test_dllm_base_state_arms_differ_from_their_twins_in_the_optimizer_start_only(tmp_path):
    """issue 24 item 5: `dllm-countdown3`'s pre-training-optimizer-state arms are diffu-GRPO and `DMPO_CORRECT_ONLY`
    with `init_optimizer_from_base` and nothing else changed (so they pair with the fresh-optimizer runs)."""
    import dataclasses

    name, rr = "dllm-countdown3", reasoning_rl
    for arm, twin in [(rr.DIFFU_GRPO_BASE_STATE, "diffu-GRPO"), (rr.DMPO_CORRECT_ONLY_BASE_STATE, rr.DMPO_CORRECT_ONLY)]:
        cfg = load_config(None, rr.arm_config(name, arm, seed=3, out=tmp_path, rollouts=30))
        ref = load_config(None, rr.arm_config(name, twin, seed=3, out=tmp_path, rollouts=30))
        diff = {x.name for x in dataclasses.fields(cfg) if getattr(cfg, x.name) != getattr(ref, x.name)} - {"_explicit"}
        assert diff == {"init_optimizer_from_base"} and cfg.init_optimizer_from_base and not ref.init_optimizer_from_base
    from mmrl.tiny_world.models import SMOKE_BASE_STEPS, model_dir

    smoke = rr.arm_config(name, rr.DIFFU_GRPO_BASE_STATE, seed=0, out=tmp_path, smoke=True)  # the smoke base's own state
    assert smoke["model_name_or_path"] == str(model_dir("countdown3-md", SMOKE_BASE_STEPS))


def test_a_base_state_arm_on_a_cache_without_the_state_fails_before_any_work(tmp_path, monkeypatch):
    """A `countdown3-md` cache built before bases kept their AdamW state: the comparison stops at once, naming the base
    and the rebuild command, before the base is scored (no folder of results is written)."""
    from mmrl.tiny_world.models import model_dir

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / "cache"))
    folder = model_dir("countdown3-md")
    folder.mkdir(parents=True)
    (folder / "tiny_spec.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="mmrl pretrain-tiny --force --no-eval countdown3-md"):
        reasoning_rl.run_reasoning_comparison("dllm-countdown3", tmp_path / "rep", seeds=1, progress=False,
                                              arms=[reasoning_rl.DIFFU_GRPO_BASE_STATE], baselines=False)
    assert not (tmp_path / "rep").exists()

def test_import_stored_runs_pools_stored_seeds_with_new_ones(tmp_path, monkeypatch):
    """An earlier report's results.json (per-problem scores of seeds 0-1, no run folders) imported into a report
    folder beside a new seed-2 run: the report covers seeds 0-2 with the intervals of the pooled items, the training
    diagnostics and the last validation point from seed 2 alone (the table says so); a stored report of another build
    or comparison is refused, a second import is a no-op, a conflicting run is never overwritten."""
    from mmrl.tiny_world.stats import difference_interval

    name, digest = "dgpo-countdown4-steps", "ab" * 32
    arms = list(reasoning_rl.COMPARISONS[name]["arms"])
    monkeypatch.setattr(reasoning_rl, "build_digest", lambda base, steps=None: digest)
    n = 20  # test rows (the comparison takes up to 100)
    rows = [{"prompt": f"problem {i}"} for i in range(n)]  # (the report reads the rows' prompts only)
    monkeypatch.setattr("mmrl.data.tasks.load_task", lambda task: SimpleNamespace(test=rows, validation=rows, metric="countdown4_steps"))

    def items(seed: int, shift: int) -> dict[str, list[float]]:
        x = [float((i * 7 + seed * 3 + shift) % 5 == 0) for i in range(n)]
        return {"greedy": x, "sampled": [v / 2 for v in x], "pass@4": x, "pass": x, "best": x}

    def summary(it: dict[str, list[float]]) -> dict[str, float]:
        return {("pass@16" if k == "pass" else k): sum(v) / n for k, v in it.items() if k != "best"}

    def run(arm: str, seed: int) -> dict:
        it = items(seed, arms.index(arm))
        return {"seed": seed, "after": summary(it), "items": it,
                "seconds": 10.0, "rollouts": 5120, "steps": 80}

    base_items = items(9, 4)
    val = {"eval/accuracy": 0.1, "eval/greedy": 0.2, "eval/pass@4": 0.3, "eval/pass@16": 0.5}
    stored = {"name": name, "base": "countdown4-steps-ar", "base_weights_sha256": digest, "smoke": False,
              "before": summary(base_items), "before_items": base_items,
              "base_validation": val, "reference": None, "arms": {a: [run(a, 0), run(a, 1)] for a in arms}}
    results = tmp_path / "stored.json"
    results.write_text(json.dumps(stored))
    root = tmp_path / "rep" / name
    assert reasoning_rl.import_stored_runs(results, root, name=name, base_name="countdown4-steps-ar", digest=digest) == {
        a: [0, 1] for a in arms}
    # a new seed's runs, with their training logs and validation items (as `one_run` leaves them)
    for a in arms:
        d = root / "runs" / reasoning_rl.run_slug(a, 2)
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(run(a, 2)))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "entropy": 0.1 - s / 1000, "diag/kl_k3": 0.01 * s,
                                                             "rewards/countdown4_steps/mean": 0.1, "eval/greedy": 0.1 + s / 10})
                                                 + "\n" for s in (1, 2)))
        vi = items(2, arms.index(a) + 1)
        (d / "validation_items.jsonl").write_text(json.dumps({"step": 80, "items": vi}) + "\n")
    (root / "base_validation_items.jsonl").write_text(json.dumps({"step": 0, "items": base_items}) + "\n")
    plotted: dict[str, dict] = {}  # the curves each figure would draw (file name -> {arm: [one curve per run]})
    monkeypatch.setattr("mmrl.tiny_world.report.plot_curves", lambda curves, path, **kw: plotted.update({Path(path).name: curves}))
    res = reasoning_rl.run_reasoning_comparison(name, tmp_path / "rep", seeds=3, progress=False, baselines=False,
                                                arms=["GRPO", "DGPO"], report_only=True, stored=results)  # (a second import: no change)
    assert res["seeds_used"] == [0, 1, 2] and res["base_weights_sha256"] == digest
    assert [r.get(reasoning_rl.STORED_FROM) is not None for r in res["arms"]["GRPO"]] == [True, True, False]
    want = difference_interval([items(s, 0)["sampled"] for s in (0, 1, 2)], [items(s, 1)["sampled"] for s in (0, 1, 2)])
    assert res["intervals"]["difference"]["GRPO - DGPO"]["sampled"] == want.to_dict()  # over every seed's items
    assert res["validation_final"]["GRPO"]["seeds"] == [2]
    assert plotted["entropy.png"]["GRPO"] == [[(1, 0.099), (2, 0.098)]]  # the one run with training logs
    assert plotted["validation_greedy.png"]["DGPO"] == [[(0, 0.2), (1, 0.2), (2, pytest.approx(0.3))]]  # from the base's figure on
    table = (root / "table.md").read_text()
    assert "GRPO (3 seeds)" in table and "GRPO seeds [2]" in table and "(weights abababababab)" in table
    # refused: another build, another comparison; a run that differs from the stored one
    with pytest.raises(ValueError, match="not the build in use"):
        reasoning_rl.import_stored_runs(results, root, name=name, base_name="countdown4-steps-ar", digest="cd" * 32)
    with pytest.raises(ValueError, match="not 'dgpo-vs-grpo'"):
        reasoning_rl.import_stored_runs(results, root, name="dgpo-vs-grpo", base_name="countdown4-steps-ar", digest=digest)
    (root / "runs" / "grpo-seed1" / "result.json").write_text(json.dumps(run("GRPO", 0) | {"seed": 1}))
    with pytest.raises(ValueError, match="differs"):
        reasoning_rl.import_stored_runs(results, root, name=name, base_name="countdown4-steps-ar", digest=digest)
    with pytest.raises(SystemExit, match="--import-results applies to the Countdown comparisons"):
        main(["replicate", "gcpo-vs-grpo", "--import-results", str(results)])


def test_import_of_a_report_without_its_build_digest_needs_the_same_base_scores(tmp_path, monkeypatch):
    """A report written before `base_weights_sha256` was saved falls back to `REFERENCE_BUILDS`; on another build it is
    imported only when this build's per-problem base scores equal the stored ones exactly (one sample off: refused)."""
    name, here = "dgpo-countdown4-steps", "ab" * 32
    monkeypatch.setattr("mmrl.tiny_world.models.REFERENCE_BUILDS", {})  # (the report's base has no reference entry)
    x = [1.0, 0.0, 0.5, 0.25]
    base_items = {"greedy": x, "sampled": x}
    arm = next(iter(reasoning_rl.COMPARISONS[name]["arms"]))
    stored = {"name": name, "base": "countdown4-steps-ar", "smoke": False, "before": {"sampled": 0.4},
              "before_items": base_items, "arms": {arm: [{"seed": 0, "items": base_items, "after": {}}]}}
    results = tmp_path / "stored.json"
    results.write_text(json.dumps(stored))
    with pytest.raises(ValueError, match="base build unknown is not the build in use abababababab"):
        reasoning_rl.import_stored_runs(results, tmp_path / "a", name=name, base_name="countdown4-steps-ar", digest=here)
    off = {"greedy": x, "sampled": [1.0, 0.0, 0.5, 0.5]}
    with pytest.raises(ValueError, match="not the build in use"):
        reasoning_rl.import_stored_runs(results, tmp_path / "b", name=name, base_name="countdown4-steps-ar", digest=here,
                                        base_items=off)
    assert reasoning_rl.import_stored_runs(results, tmp_path / "c", name=name, base_name="countdown4-steps-ar",
                                           digest=here, base_items={"greedy": list(x), "sampled": list(x)}) == {arm: [0]}
    assert json.loads((tmp_path / "c" / "base.json").read_text())["weights_sha256"] == here


def test_dllm_dmpo_authors_arm_carries_the_preset_on_the_masked_diffusion_recipe(tmp_path):
    """`dllm-countdown3-dmpo-authors`: the arm, as loaded, has the DMPO preset's algorithm and optimizer settings
    (F = 8, reference target, individual baseline, no KL, T = 0.2, ...), the masked-diffusion base and batch of
    `dllm-countdown3`, and lr 5e-4 / 8 (lr x steps per rollout batch of the shared recipe)."""
    root = Path(__file__).resolve().parents[2]
    ref = load_config(root / "configs" / "dmpo_llada_8b_countdown.yaml", validate=False)
    cfg = load_config(None, reasoning_rl.arm_config("dllm-countdown3-dmpo-authors", reasoning_rl.DMPO_AUTHORS_MD,
                                                    seed=0, out=tmp_path))
    shared = load_config(None, reasoning_rl.arm_config("dllm-countdown3", "diffu-GRPO", seed=0, out=tmp_path))
    for key in ("method", "num_iterations", "beta", "temperature", "lr_scheduler_type", "warmup_ratio", "adam_beta1",
                "adam_beta2", "weight_decay", "max_grad_norm", "dmpo_loss", "dmpo_target", "dmpo_baseline", "dmpo_alpha"):
        assert getattr(cfg, key) == getattr(ref, key), key
    for key in ("family", "model_name_or_path", "per_device_train_batch_size", "num_generations", "max_completion_length"):
        assert getattr(cfg, key) == getattr(shared, key), key
    assert (cfg.num_iterations, cfg.max_steps) == (8, 240)
    assert cfg.learning_rate * 8 == pytest.approx(5e-4)
