"""The benchmark suite at its `--smoke` size (what CI runs): every script runs in its own process through
`benchmarks/run_all.py`, writes the JSON the README report is built from, with the keys the report reads. Timings
are never checked (the machine may be busy); only structure and the properties that do not depend on speed."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import PeakMemory, paired_ratio, summarize, wide_tokenizer  # noqa: E402

NAMES = ["method_costs", "trl_comparison", "dllm_samplers", "dllm_samplers_single", "janus_sampling", "quickstart_time",
         "causal_lm_sampling", "hellinger_memory", "amused_sampling", "diagnostics_overhead"]
SUMMARY_KEYS = {"median", "p25", "p75", "min", "max", "n", "values"}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--smoke", "--jobs", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in out.glob("*.log"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    return out


def read(results: Path, name: str) -> dict:
    return json.loads((results / f"{name}.json").read_text())


def check_summary(s: dict, n: int | None = None) -> None:
    assert SUMMARY_KEYS <= set(s), s
    assert s["min"] <= s["median"] <= s["max"]
    if n is not None:
        assert s["n"] == len(s["values"]) == n


def test_run_all_summary(results):
    summary = read(results, "summary")
    assert summary["size"] == "smoke"
    assert {n: b["status"] for n, b in summary["benchmarks"].items()} == {n: "ok" for n in NAMES}
    for name in NAMES:
        assert (results / f"{name}.json").exists() and (results / f"{name}.log").exists()


def test_method_costs_json(results):
    d = read(results, "method_costs")
    assert d["smoke"] is True and set(d["families"]) == {"causal_lm", "masked_diffusion"}
    expected = {"causal_lm": {"grpo_beta0", "grpo_beta0.04", "gcpo", "gcpo_batched", "dgpo", "dmpo"},
                "masked_diffusion": {"grpo_beta0", "diffu_grpo", "dmpo"}}
    for family, f in d["families"].items():
        assert set(f["methods"]) == expected[family]
        assert f["params"] > 0 and f["sizes"]["responses"] == 4
        for name, m in f["methods"].items():
            for part in ("step", "rollout", "reward", "buffer", "update", "train", "cpu"):
                check_summary(m[part], d["repeats"])
            for i in range(d["repeats"]):  # the split adds up to the step, per step
                parts = sum(m[p]["values"][i] for p in ("rollout", "reward", "buffer", "update"))
                assert parts == pytest.approx(m["step"]["values"][i], rel=1e-9)
            mem = m["memory"]
            assert mem["peak_bytes"] >= mem["base_bytes"] > 0 and mem["extra_bytes"] == mem["peak_bytes"] - mem["base_bytes"]
            assert ("step_amortised_F8" in m) == (name == "dmpo")
        for r in f["ratios"]:
            for k in ("step_time", "train_time", "update_time", "cpu_step_time"):
                assert {"ratio", "round_min", "round_max"} <= set(r[k])
            assert r["peak_memory"] > 0
    pairs = {(r["numerator"], r["denominator"]): r for r in d["families"]["causal_lm"]["ratios"]}
    for pair in (("gcpo", "grpo_beta0"), ("dgpo", "grpo_beta0.04"), ("dgpo", "grpo_beta0")):
        assert pair in pairs
    assert set(pairs[("dgpo", "grpo_beta0.04")]["goal_met"]) == {"step_time", "peak_memory"}


def test_diagnostics_overhead_json(results):
    d = read(results, "diagnostics_overhead")
    assert d["smoke"] is True and set(d["configs"]) == {"grpo_beta0", "dllm_dmpo"}
    for name, c in d["configs"].items():
        for k in ("on", "off", "wall_on", "wall_off"):
            check_summary(c[k], d["repeats"])
        assert {"ratio", "round_min", "round_max"} <= set(c["ratio"]) and c["goal"] == 1.03
    # no frozen copy of the policy is built for the diagnostics alone (beta 0); DMPO and a KL term have a reference
    assert not d["configs"]["grpo_beta0"]["reference_built"]
    assert d["configs"]["dllm_dmpo"]["reference_built"]


def test_trl_comparison_json(results):
    d = read(results, "trl_comparison")
    assert set(d["betas"]) == {"0.0", "0.04"}
    for e in d["betas"].values():
        check_summary(e["trl_step_s"], 1)
        check_summary(e["mmrl_step_s"], 1)
        assert e["mmrl_over_trl"]["ratio"] == pytest.approx(e["mmrl_step_s"]["median"] / e["trl_step_s"]["median"])
        check_summary(e["trl_cpu_s"], 1)
        check_summary(e["mmrl_cpu_s"], 1)
        assert e["mmrl_over_trl_cpu"]["ratio"] == pytest.approx(e["mmrl_cpu_s"]["median"] / e["trl_cpu_s"]["median"])
        assert isinstance(e["goal_met"], bool)
    assert d["environment"]["trl"]


def test_dllm_samplers_json(results):
    d = read(results, "dllm_samplers")
    res = d["results"]
    for name in ("low_conf_steps=len", "low_conf_steps=len/2", "threshold", "threshold+cache"):
        assert {"tokens_per_s", "forward_passes", "accuracy", "speedup", "seconds_spread"} <= set(res[name])
    gl = d["args"]["gen_length"]
    assert res["low_conf_steps=len"]["forward_passes"] == gl and res["low_conf_steps=len/2"]["forward_passes"] == gl // 2
    assert d["goal"]["speedup"] == pytest.approx(res["threshold+cache"]["speedup"]) and isinstance(d["goal"]["met"], bool)
    single = read(results, "dllm_samplers_single")  # 4 prompts per call: forwards add up over the 2 calls
    assert single["args"]["call_batch"] == 4
    assert single["results"]["low_conf_steps=len"]["forward_passes"] == 2 * gl
    assert single["results"]["low_conf_steps=len/2"]["forward_passes"] == gl


def test_janus_and_rollout_json(results):
    j = read(results, "janus_sampling")
    assert j["speed_ratio"] == pytest.approx(j["mmrl_tokens_per_s"] / j["transformers_tokens_per_s"])
    assert isinstance(j["goal_met"], bool) and len(j["mmrl_times_s"]) == j["repeats"]
    c = read(results, "causal_lm_sampling")
    assert set(c["tokens_per_s"]) == {"generate", "mmrl_sample"} and c["speed_ratio"] > 0
    a = read(results, "amused_sampling")
    assert a["speed_ratio"] == pytest.approx(a["mmrl_images_per_s"] / a["pipeline_images_per_s"])
    assert len(a["mmrl_times_s"]) == len(a["pipeline_times_s"]) == a["repeats"]


def test_quickstart_and_hellinger_json(results):
    q = read(results, "quickstart_time")
    assert q["status"] == "ok" and q["exit_code"] == 0 and q["command"] == "mmrl --version"
    assert q["wall_seconds"] > 0 and q["goal_met"] is None  # smoke: not the README's command
    assert "readme_command" in q
    h = read(results, "hellinger_memory")
    assert h["same_result"] is True and set(h["results"]) == {"chunked", "unchunked"}


def test_report_writes_a_replaceable_section(results, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# project\n\nIntro.\n")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "report.py"), "--results", str(results), "--readme", str(readme)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    first = readme.read_text()
    assert first.startswith("# project\n\nIntro.\n") and first.count("## Performance") == 1
    assert first.count("<!-- performance:start -->") == first.count("<!-- performance:end -->") == 1
    for heading in ("Cost per method", "Diffusion-LM samplers", "mmrl against TRL", "Janus CFG sampling", "README main command"):
        assert heading in first, heading
    assert "Smoke sizes" in first
    assert "ratios (both sides measured in the same process, interleaved) are the figures to read" in first
    assert "| benchmark | commit | finished | load at start | load at end |" in first
    readme.write_text(first + "\n## After\n\nkept\n")
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    second = readme.read_text()
    assert second == first + "\n## After\n\nkept\n"  # regenerated in place: same section, text around it kept


def test_run_all_extra_arguments(tmp_path):
    import run_all

    cmd = run_all.command("method_costs", "full", tmp_path, "cpu", 1, ["--methods", "dgpo,grpo_beta0.04", "--repeats", "2"])
    # after the size's own arguments (so the last --repeats wins in argparse), before --out and --threads
    assert cmd[2:] == ["--repeats", "3", "--methods", "dgpo,grpo_beta0.04", "--repeats", "2", "--out",
                       str(tmp_path / "method_costs.json"), "--threads", "1"]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--out", str(tmp_path), "--extra", "nosuch=1"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and "--extra 'nosuch=1': expected NAME=ARGS" in proc.stderr
    assert not (tmp_path / "summary.json").exists()  # refused before anything ran


def test_run_all_refuses_parallel_full_size_timings(tmp_path):
    import run_all

    with pytest.raises(SystemExit, match="--jobs 2: expected 1, or more than 1 together with --smoke"):
        run_all.main(["--jobs", "2", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--jobs 0"):
        run_all.main(["--smoke", "--jobs", "0", "--out", str(tmp_path)])
    assert not (tmp_path / "summary.json").exists()


def test_summaries_and_ratios_by_hand():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4) and s["values"] == [3.0, 1.0, 2.0, 10.0]
    assert (s["p25"], s["p75"]) == (1.75, 4.75)
    r = paired_ratio([2.0, 4.0, 9.0], [1.0, 4.0, 3.0])
    assert r["ratio"] == pytest.approx(4.0 / 3.0) and (r["round_min"], r["round_median"], r["round_max"]) == (1.0, 2.0, 3.0)


def test_peak_memory_sees_a_freed_allocation():
    import mmap

    size, page = 100_000_000, mmap.PAGESIZE
    with PeakMemory("cpu") as pm:
        # fresh anonymous pages, each touched, unmapped before the end: a tensor of this size could be served from
        # memory an earlier test freed and left resident (the allocator's), and then the RSS would not move at all
        buf = mmap.mmap(-1, size)
        for i in range(0, size, page):
            buf[i] = 1
        buf.close()
    assert pm.extra >= 90_000_000 and pm.peak >= pm.base


def test_wide_tokenizer():
    tok = wide_tokenizer(32000)
    assert len(tok) == 32000 and tok.pad_token_id == 0 and tok.eos_token_id == 2 and tok.mask_token_id == 4
    ids = tok("ab")["input_ids"]
    assert len(ids) == 2 and tok.decode(ids) == "ab"
    assert tok.decode([31999]) == "<w31999>"
    with pytest.raises(ValueError, match="vocab_size"):
        wide_tokenizer(50)
