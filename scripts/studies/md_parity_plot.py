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
    keys = [f"{k}={o[k]}" for k in ("token_reweight", "diffusion_lr", "suffix_frac", "anneal_steps", "seed") if k in o and (k != "seed" or o[k])]
    return f"md {o['causal']} causal + {o['diff']} diffusion" + (", " + ", ".join(keys) if keys else "")


base = json.loads(Path(sys.argv[1]).read_text())
runs = [json.loads(x) for x in Path(sys.argv[2]).read_text().splitlines() if x.strip()]
# the causal phase each run started from (its accuracy, in the run's final record): runs on a rebuilt causal phase
# (a fresh cache) are labelled with it, so a control on that phase is told apart from the earlier runs
phases = sorted({r["causal_phase_val_acc"] for r in runs if "causal_phase_val_acc" in r})
first_phase = next((r["causal_phase_val_acc"] for r in runs if "causal_phase_val_acc" in r), None)
run_phase: dict[str, float] = {}
curves: dict[str, list] = {}
for r in runs:  # a run's eval records come before its final record
    if "step" in r:
        curves.setdefault(json.dumps(r["opts"], sort_keys=True), []).append((r["step"], r["val_acc"]))
    elif "final" in r:
        key = json.dumps(r["opts"], sort_keys=True)
        pts = curves.pop(key, [])
        ph = r.get("causal_phase_val_acc", first_phase)
        name = label(r["opts"]) + ("" if ph == first_phase else f" (causal phase rebuilt: {100 * ph:.1f}%)")
        curves[name] = pts
        run_phase[name] = ph
fig, ax = plt.subplots(figsize=(11, 4.5))
ax.plot(*zip(*base["causal"]), "ko-", lw=2, label="causal LM (countdown3-ar recipe, one 1200-step schedule)")
ax.plot(*zip(*base["masked_diffusion"]), "s--", color="grey", label="md 600 causal + 600 diffusion (old countdown3-md)")
colours = iter(plt.cm.tab20.colors)
for name, pts in curves.items():  # runs on a rebuilt causal phase dotted, with downward markers
    rebuilt = run_phase.get(name, first_phase) != first_phase
    ax.plot(*zip(*sorted(pts)), "v:" if rebuilt else "^-", color=next(colours), label=name)
for i, ph in enumerate(phases):  # the causal phase's own accuracy (causal attention) where the diffusion phase starts
    ax.plot([600], [ph], "k*" if ph == first_phase else "r*", ms=12,
            label="the causal phase alone (causal attention, its own schedule)" + ("" if ph == first_phase else ", rebuilt"))
ax.axvline(1200, color="grey", lw=0.5, ls=":")
ax.set_xlabel("pre-training optimizer steps (batch 64), causal phase included")
ax.set_ylabel("validation greedy accuracy (256 rows)")
ax.set_xlim(0, 1850)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=120)
print(json.dumps({k: sorted(v) for k, v in curves.items()}))
