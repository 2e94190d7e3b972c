"""Write the README's "Performance" section from the benchmarks' JSON (`benchmarks/run_all.py --out DIR`).

The section sits between `<!-- performance:start -->` and `<!-- performance:end -->`; running this again replaces
it, so the README always shows the last measured figures. Without the markers a "## Performance" section with them
is appended. Nothing here measures anything: every number comes from the JSON files.

    python benchmarks/report.py --results bench_results               # update README.md
    python benchmarks/report.py --results bench_results --stdout      # print the section only

An optional `<results>/notes.json` ({goal key: text}, keys as in `GOAL_KEYS`) adds a note to a goal's row: what
limits a missed goal, or how it was measured. The notes are written by whoever ran the benchmarks; the numbers and
verdicts still come only from the measurements' JSON.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
START, END = "<!-- performance:start -->", "<!-- performance:end -->"
MIB = 2**20


def load(results: Path, name: str) -> dict | None:
    p = results / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def spread(s: dict | None, digits: int = 2) -> str:
    """`median [min-max]` of a `_common.summarize` dict."""
    if not s or s.get("median") is None:
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def ratio_cell(r: dict | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    lo, hi = r.get("round_min"), r.get("round_max")
    return f"{r['ratio']:.3f}" + (f" [{lo:.3f}-{hi:.3f}]" if lo is not None and hi is not None else "")


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**"}.get(met, "not measured")


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


# ------------------------------------------------------------------------------------------------ sections
GOAL_KEYS = ("dgpo_step_time", "gcpo_step_time", "dgpo_peak_memory", "gcpo_peak_memory", "dmpo_step_time", "dmpo_peak_memory",
             "dllm_samplers",
             "dllm_samplers_single", "trl_beta_0.0", "trl_beta_0.04", "janus_sampling", "quickstart_time",
             "diagnostics_grpo_beta0", "diagnostics_grpo_beta0.04", "diagnostics_dmpo", "diagnostics_dllm_dmpo")
"""Keys of `notes.json`, one per row of the goals table."""


def goals(results: Path) -> list[list[str]]:
    """One row per issue-7 goal: what, measured, verdict, note (from `notes.json`)."""
    notes_path = results / "notes.json"
    notes = json.loads(notes_path.read_text()) if notes_path.exists() else {}
    rows = [row + [notes.get(key, "")] for key, row in _goal_rows(results)]
    return rows


def _goal_rows(results: Path) -> list[tuple[str, list[str]]]:
    """(key, [what, measured, verdict]) per goal."""
    rows = []
    mc = load(results, "method_costs")
    families = (mc or {}).get("families", {})
    pairs = {(fam, r["numerator"], r["denominator"]): r for fam, f in families.items() for r in f.get("ratios", [])}
    checked = (("causal_lm", "dgpo", "grpo_beta0.04", "DGPO / GRPO (beta 0.04, same forwards)", "dgpo"),
               ("causal_lm", "gcpo", "grpo_beta0", "GCPO / GRPO", "gcpo"),
               ("masked_diffusion", "dmpo", "diffu_grpo", "DMPO (R = 4) / diffu-GRPO, masked diffusion", "dmpo"))
    for part, label in (("step_time", "step time"), ("peak_memory", "peak memory")):
        for fam, num, den, what, key in checked:
            r = pairs.get((fam, num, den))
            if r is None:
                rows.append((f"{key}_{part}", [f"{what} {label}", "-", verdict(None)]))
                continue
            goal = r.get("goal", {}).get(part)
            val = ratio_cell(r[part]) if part == "step_time" else (f"{r[part]:.3f}" if part in r else "-")
            if part == "step_time" and "cpu_step_time" in r:
                val += f" (CPU time {ratio_cell(r['cpu_step_time'])})"
            met = r.get("goal_met", {}).get(part)
            if part == "step_time" and goal and (r.get("cpu_step_time") or {}).get("ratio") is not None:
                met = r["cpu_step_time"]["ratio"] <= goal  # on a shared CPU the CPU-time ratio is the figure to judge
            rows.append((f"{key}_{part}", [f"{what} {label}" + (f" <= {goal}" if goal else ""), val, verdict(met)]))
    found = False
    for name in ("dllm_samplers", "dllm_samplers_single"):
        b3 = load(results, name)
        if not b3:
            continue
        found = True
        g = b3["goal"]
        acc = "-" if g.get("accuracy_diff") is None else f"{100 * g['accuracy_diff']:+.1f} points"
        k = b3["args"].get("call_batch")
        setting = f"{k} prompt{'s' if k != 1 else ''} per call" if k else f"batch of {b3['args']['batch']}"
        rows.append((name, [f"threshold + prefix cache >= 4x tokens/s of low-confidence (steps = length), accuracy within 2 "
                            f"points ({setting})", f"{g['speedup']:.2f}x, {acc}", verdict(g["met"])]))
    if not found:
        rows.append(("dllm_samplers", ["threshold + prefix cache >= 4x tokens/s of low-confidence, accuracy within 2 points", "-",
                                       verdict(None)]))
    b4 = load(results, "trl_comparison")
    for beta, e in (b4 or {}).get("betas", {}).items():
        cpu = f" (CPU time {ratio_cell(e['mmrl_over_trl_cpu'])})" if "mmrl_over_trl_cpu" in e else ""
        met = e["goal_met"]
        if (e.get("mmrl_over_trl_cpu") or {}).get("ratio") is not None:  # judged on CPU time, as the step ratios
            met = e["mmrl_over_trl_cpu"]["ratio"] <= 0.50
        rows.append((f"trl_beta_{beta}", [f"mmrl GRPO step <= 0.50 x TRL's (beta {beta})", ratio_cell(e["mmrl_over_trl"]) + cpu,
                                          verdict(met)]))
    if not b4:
        rows.append(("trl_beta_0.0", ["mmrl GRPO step <= 0.50 x TRL's", "-", verdict(None)]))
    b5 = load(results, "janus_sampling")
    rows.append(("janus_sampling", ["Janus sampling >= 0.9x transformers' speed", f"{b5['speed_ratio']:.2f}x" if b5 else "-",
                                    verdict(b5.get("goal_met") if b5 else None)]))
    diag = load(results, "diagnostics_overhead")
    for name, c in (diag or {}).get("configs", {}).items():  # judged on CPU time, the clock the benchmark reads
        if c.get("goal") is None:  # a configuration off the defaults (e.g. the asked-for reference): no goal
            continue
        rows.append((f"diagnostics_{name}", [f"`diag/` diagnostics on / off, step time <= {c['goal']} ({name}, {c['family']})",
                                            ratio_cell(c["ratio"]), verdict(c["ratio"]["ratio"] <= c["goal"])]))
    b6 = load(results, "quickstart_time")
    if b6 and b6.get("status") == "ok":
        rows.append(("quickstart_time", ["README main command <= 10 minutes on 2 CPU cores", f"{b6['wall_seconds'] / 60:.1f} min",
                                         verdict(b6["goal_met"])]))
    else:
        why = (b6 or {}).get("reason") or ((b6 or {}).get("status") and f"status {b6['status']}") or "not run"
        rows.append(("quickstart_time", ["README main command <= 10 minutes on 2 CPU cores", f"- ({why})", verdict(None)]))
    return rows


def method_costs(d: dict) -> list[str]:
    out = ["### Cost per method (B1 step time, B2 peak memory)", "",
           "Real `Trainer` optimizer steps, one rollout per step, every method on the same model, prompts, seeds and "
           f"batch, steps interleaved round-robin ({d['repeats']} timed rounds after {d['warmup']} warm-up); seconds as "
           "median [min-max]. *buffer* = no-grad forwards before the update (reference log-probs, DMPO's likelihoods), "
           "*update* = gradient forwards and backwards (GCPO's negative forward, DGPO's reference pass and statistics "
           "included) and the optimizer step. Peak memory: each method in a fresh process (resident set on CPU, "
           "`max_memory_allocated` on CUDA)."]
    for family, f in d["families"].items():
        sz = f["sizes"]
        out += ["", f"**{family}**: {f['params'] / 1e6:.1f}M parameters, vocabulary {sz['vocab']}, {sz['tokens']} "
                f"response tokens, {sz['responses']} responses per step (G = {sz['group']}, micro-batch {sz['micro_batch']}).", ""]
        rows = []
        for name, e in f["methods"].items():
            mem = e.get("memory")
            rows.append([name, spread(e["step"]), spread(e.get("cpu")), spread(e["rollout"]), spread(e["buffer"]), spread(e["update"]),
                         f"{mem['peak_bytes'] / MIB:.0f}" if mem else "-",
                         spread(e["step_amortised_F8"]) if "step_amortised_F8" in e else ""])
        out += table(["method", "step (s)", "CPU time (s)", "rollout (s)", "buffer (s)", "update (s)", "peak MiB", "step at F = 8 (s)"], rows)
        out += [""]
        rows = []
        for r in f["ratios"]:
            g = r.get("goal")
            cpu_ratio = (r.get("cpu_step_time") or {}).get("ratio")
            judged = {k: (cpu_ratio <= v if k == "step_time" and cpu_ratio is not None else r["goal_met"].get(k))
                      for k, v in (g or {}).items()}  # step time judged on CPU time where it was recorded
            goal = "; ".join(f"{k} <= {v}: {verdict(judged[k])}" for k, v in g.items()) if g else ""
            rows.append([r["label"], ratio_cell(r["step_time"]), ratio_cell(r.get("cpu_step_time")), ratio_cell(r["train_time"]),
                         f"{r['peak_memory']:.3f}" if "peak_memory" in r else "-", goal])
        out += table(["ratio", "step time", "CPU time", "without rollout", "peak memory", "goal"], rows)
    out += ["", "Ratios are of medians; brackets: the range of the per-round (paired) ratios. *step at F = 8*: DMPO's "
            "amortised step when each rollout is reused for 8 optimizer steps (its default), update + (rollout + reward + "
            "buffer) / 8."]
    return out


def dllm_samplers(d: dict) -> list[str]:
    a = d["args"]
    single = d["args"].get("call_batch") == 1
    out = ["### Diffusion-LM samplers (B3" + (", one prompt per call)" if single else ")"), "",
           f"Model: {d['info'].get('model')}; {a['batch']} prompts"
           + (f", {a['call_batch']} per sampler call" if a.get("call_batch") else " in one batch")
           + f", {a['gen_length']} generated tokens, blocks of "
           f"{a['block_length']}, greedy; median of {a['repeats']} round-robin repeats. Accuracy: the task's metric "
           "(fraction of blank cells filled correctly).", ""]
    rows = [[name, f"{r['tokens_per_s']:.0f}", f"{r['speedup']:.2f}x", r["forward_passes"], f"{r['fed_ratio']:.2f}x",
             "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.1f}%",
             f"{100 * r['agreement']:.1f}%" if "agreement" in r else "-"] for name, r in d["results"].items()]
    out += table(["sampler", "tokens/s", "speed-up", "forward passes", "fewer positions fed", "accuracy",
                  "outputs equal to the baseline's"], rows)
    return out


def trl_comparison(d: dict) -> list[str]:
    s = d["settings"]
    out = ["### mmrl against TRL (B4)", "",
           f"GRPO optimizer steps on the same {d['params'] / 1e6:.1f}M-parameter Qwen2 (vocabulary {s['vocab']}), "
           f"{s['responses']} completions per step (num_generations {s['group']}, micro-batch {s['micro_batch']}) x "
           f"{s['tokens']} tokens, identical settings; seconds per step including generation, median [min-max] over "
           f"{s['blocks']} alternating blocks of {s['repeats']} steps (TRL {d['environment'].get('trl')}).", ""]
    rows = [[beta, spread(e["trl_step_s"]), spread(e["mmrl_step_s"]), ratio_cell(e["mmrl_over_trl"]), spread(e.get("trl_cpu_s")),
             spread(e.get("mmrl_cpu_s")), ratio_cell(e.get("mmrl_over_trl_cpu"))] for beta, e in d["betas"].items()]
    out += table(["beta", "TRL GRPOTrainer (s)", "mmrl Trainer (s)", "mmrl / TRL", "TRL CPU time (s)", "mmrl CPU time (s)",
                  "mmrl / TRL (CPU time)"], rows)
    return out


def janus_sampling(d: dict) -> list[str]:
    r = d.get("speed_ratio_rounds", {})
    return ["### Janus CFG sampling (B5)", "",
            f"{d['images']} images x {d['image_tokens']} tokens, hidden {d['hidden']}, {d['layers']} layers, CFG {d['cfg_scale']}: "
            f"transformers `generate(generation_mode=\"image\")` {d['transformers_tokens_per_s']:.0f} tokens/s, mmrl "
            f"`JanusAdapter.sample` (with per-token log-probs and decoding) {d['mmrl_tokens_per_s']:.0f} tokens/s: "
            f"**{d['speed_ratio']:.2f}x**" + (f" (rounds {r['min']:.2f}-{r['max']:.2f})" if r else "") + "."]


def causal_lm_sampling(d: dict) -> list[str]:
    a = d["args"]
    t = d["tokens_per_s"]
    return ["### Causal-LM rollouts", "",
            f"{d['responses']} responses x {a['new_tokens']} tokens (Qwen2 hidden {a['hidden']}, {a['layers']} layers, vocabulary "
            f"{a['vocab']}): `model.generate` (what TRL calls) {t['generate']:.0f} tokens/s, mmrl's sampler (with log-probs) "
            f"{t['mmrl_sample']:.0f} tokens/s: **{d['speed_ratio']:.2f}x**."]


def hellinger_memory(d: dict) -> list[str]:
    ch = d["results"]["chunked"]
    return ["### DGPO statistics memory", "",
            f"Hellinger distance and entropy on {d['shape']} bf16 logits: chunked peak extra memory "
            f"{ch['peak_extra_bytes'] / MIB:.0f} MiB = {d['chunked_over_fp32_copy']:.3f} of one float32 copy of the logits "
            f"(goal < 0.25), same result as unchunked: {d['same_result']}."]


def amused_sampling(d: dict) -> list[str]:
    return ["### aMUSEd sampling", "",
            f"{d['images']} images x {d['image_tokens']} tokens, {d['steps']} steps, hidden {d['hidden']}, {d['layers']} layers, "
            f"CFG {d['cfg_scale']}: diffusers `AmusedPipeline` {d['pipeline_images_per_s']:.1f} images/s, mmrl's sampler (per-row "
            f"generators, per-step log-probs) {d['mmrl_images_per_s']:.1f} images/s: **{d['speed_ratio']:.2f}x** (median of "
            f"{d['repeats']} repeats)."]


def diagnostics_overhead(d: dict) -> list[str]:
    rows = [[name, c["family"], "yes" if c.get("reference_built") else "no", spread(c["on"]), spread(c["off"]),
             ratio_cell(c["ratio"])] for name, c in d["configs"].items()]
    return ["### Diagnostics overhead (`log_diagnostics` on / off)", "",
            f"Real `Trainer` steps with the `diag/` metrics on and off, alternating, {d['repeats']} timed steps each after "
            f"{d['warmup']} warm-up; process CPU time per step (s), median [min-max]; ratio of medians, brackets the per-pair "
            "range. *reference*: whether the run holds a frozen reference (for a KL term or the method's own likelihoods, "
            "or asked for with `diagnostics_reference=true`); by default the diagnostics never build one."] + [""] + table(
        ["config", "family", "reference", "on (s)", "off (s)", "on / off"], rows)


def quickstart(d: dict) -> list[str]:
    if d.get("status") != "ok":
        return ["### README main command (B6)", "", f"Not measured: {d.get('reason') or d.get('status')}."]
    return ["### README main command (B6)", "",
            f"`{d['command']}`: {d['wall_seconds'] / 60:.1f} minutes wall, {d['cpu_seconds'] / 60:.1f} CPU-minutes, peak resident "
            f"set {d['peak_rss_bytes'] / MIB:.0f} MiB."]


SECTIONS = [("method_costs", method_costs), ("dllm_samplers", dllm_samplers), ("dllm_samplers_single", dllm_samplers),
            ("trl_comparison", trl_comparison),
            ("janus_sampling", janus_sampling), ("amused_sampling", amused_sampling), ("causal_lm_sampling", causal_lm_sampling),
            ("diagnostics_overhead", diagnostics_overhead), ("quickstart_time", quickstart), ("hellinger_memory", hellinger_memory)]


def _load(avg: list | None) -> str:
    return "-" if not avg else f"{avg[0]:.2f} / {avg[1]:.2f}"


def provenance(results: Path) -> list[str]:
    """When, on which commit and under what load each benchmark shown was run (from summary.json and the JSON)."""
    runs = (load(results, "summary") or {}).get("benchmarks", {})
    rows = []
    for name, _ in SECTIONS:
        d = load(results, name)
        if d is None:
            continue
        r = runs.get(name, {})
        rows.append([name, (d.get("environment") or {}).get("git_commit") or "-", r.get("finished", "-"),
                     _load(r.get("loadavg_start")), _load(r.get("loadavg_end"))])
    if not rows:
        return []
    return ["**On a shared machine the ratios (both sides measured in the same process, interleaved) are the figures to read; "
            "the absolute seconds depend on the load and are no speed claim.** Load: the machine's 1-minute / 5-minute load "
            "averages (2 cores) when a benchmark started and ended.", ""] + table(
        ["benchmark", "commit", "finished", "load at start", "load at end"], rows) + [""]


def render(results: Path) -> str:
    envs = [d["environment"] for n, _ in SECTIONS if (d := load(results, n)) and "environment" in d]
    env = next((e for e in envs if "torch" in e), envs[0] if envs else {})
    smoke = any((load(results, n) or {}).get("smoke") for n, _ in SECTIONS)
    threads = (load(results, "summary") or {}).get("threads")
    where = (f"; {env.get('cpu_count')} CPU cores" if env.get("device", "cpu") == "cpu" else f"; {env.get('gpu')}")
    if threads and env.get("device", "cpu") == "cpu":
        where = (f"; CPU, {threads} torch thread{'s' if threads != 1 else ''} per benchmark (a shared "
                 f"{env.get('cpu_count')}-core machine, one benchmark at a time)")
    lines = [START, "", "Measured by `python benchmarks/run_all.py` and written by `python benchmarks/report.py` (do not edit by "
             "hand)" + where
             + (f", torch {env['torch']}" if env.get("torch") else "") + "; the commit of each benchmark below." + (" **Smoke sizes: these numbers say nothing about speed.**" if smoke else ""), ""]
    lines += provenance(results)
    lines += ["| goal (issues 7, 29) | measured | | note |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in goals(results)]
    for name, fn in SECTIONS:
        d = load(results, name)
        if d is None:
            continue
        lines += [""] + fn(d)
    lines += ["", END]
    return "\n".join(lines)


def update_readme(readme: Path, section: str) -> None:
    text = readme.read_text()
    if START in text and END in text:
        pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), flags=re.S)
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n## Performance\n\n" + section + "\n"
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench_results"), help="the directory run_all.py wrote")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--stdout", action="store_true", help="print the section instead of writing the README")
    args = ap.parse_args(argv)
    results = Path(args.results)
    if not results.is_dir():
        print(f"no results directory {results}: run benchmarks/run_all.py --out {results} first", file=sys.stderr)
        return 2
    section = render(results)
    if args.stdout:
        print(section)
    else:
        update_readme(Path(args.readme), section)
        print(f"wrote the Performance section of {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
