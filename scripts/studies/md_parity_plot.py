"""Study (docs/RESULTS.md, "dLLM"): validation accuracy against pre-training compute (optimizer steps of batch 64)
of the causal Countdown base and of the masked-diffusion variants of `md_parity.py`.

    python scripts/studies/md_parity_plot.py docs/results/dllm/base_curves.json RUNS.jsonl OUT.png

base_curves.json: the causal curve and the old `countdown3-md` curve (`dllm_base_curves.py`); RUNS.jsonl: the
`md_parity.py` records (one curve per distinct option set).
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(o: dict) -> str:
    keys = [f"{k}={o[k]}" for k in ("token_reweight", "diffusion_lr", "suffix_frac", "anneal_steps", "pad_loss", "seed")
            if k in o and (k != "seed" or o[k])]
    return f"md {o['causal']} causal + {o['diff']} diffusion" + (", " + ", ".join(keys) if keys else "")


base = json.loads(Path(sys.argv[1]).read_text())
runs = [json.loads(x) for x in Path(sys.argv[2]).read_text().splitlines() if x.strip()]
# the causal phase each run started from: (causal steps, seed) and its accuracy, in the run's final record. A run
# whose phase accuracy differs from the first one of its (causal steps, seed) started from a rebuilt causal phase (a
# fresh cache) and is labelled with it, so a control on that phase is told apart from the earlier runs
first_phase: dict[tuple, float] = {}
for r in runs:
    if "causal_phase_val_acc" in r:
        first_phase.setdefault((r["opts"]["causal"], r["opts"].get("seed", 0)), r["causal_phase_val_acc"])
phases: dict[tuple, bool] = {}  # (causal steps, seed, accuracy) -> rebuilt
run_rebuilt: dict[str, bool] = {}
curves: dict[str, list] = {}
for r in runs:  # a run's eval records come before its final record
    if "step" in r:
        curves.setdefault(json.dumps(r["opts"], sort_keys=True), []).append((r["step"], r["val_acc"]))
    elif "final" in r:
        key = json.dumps(r["opts"], sort_keys=True)
        pts = curves.pop(key, [])
        which = (r["opts"]["causal"], r["opts"].get("seed", 0))
        ph = r.get("causal_phase_val_acc", first_phase.get(which))
        rebuilt = ph != first_phase.get(which, ph)
        name = label(r["opts"]) + (f" (causal phase rebuilt: {100 * ph:.1f}%)" if rebuilt else "")
        curves[name] = pts
        run_rebuilt[name] = rebuilt
        if ph is not None:
            phases[(*which, ph)] = rebuilt
fig, ax = plt.subplots(figsize=(11, 4.5))
ax.plot(*zip(*base["causal"]), "ko-", lw=2, label="causal LM (countdown3-ar recipe, one 1200-step schedule)")
ax.plot(*zip(*base["masked_diffusion"]), "s--", color="grey", label="md 600 causal + 600 diffusion (old countdown3-md)")
colours = iter(plt.cm.tab20.colors * 2)
for name, pts in curves.items():  # runs on a rebuilt causal phase dotted, with downward markers
    ax.plot(*zip(*sorted(pts)), "v:" if run_rebuilt.get(name) else "^-", color=next(colours), label=name)
for (steps, seed, ph), rebuilt in sorted(phases.items()):  # each causal phase's own accuracy (causal attention)
    ax.plot([steps], [ph], "r*" if rebuilt else "k*", ms=12,
            label=f"the causal phase alone, {steps} steps" + (f", seed {seed}" if seed else "") + (", rebuilt" if rebuilt else ""))
ax.axvline(1200, color="grey", lw=0.5, ls=":")
ax.set_xlabel("pre-training optimizer steps (batch 64), causal phase included")
ax.set_ylabel("validation greedy accuracy (256 rows)")
ax.set_xlim(0, 1850)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=120)
print(json.dumps({k: sorted(v) for k, v in curves.items()}))
