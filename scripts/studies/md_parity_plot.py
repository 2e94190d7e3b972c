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
    keys = [f"{k}={o[k]}" for k in ("token_reweight", "diffusion_lr", "suffix_frac") if k in o]
    return f"md {o['causal']} causal + {o['diff']} diffusion" + (", " + ", ".join(keys) if keys else "")


base = json.loads(Path(sys.argv[1]).read_text())
runs = [json.loads(x) for x in Path(sys.argv[2]).read_text().splitlines() if x.strip()]
curves: dict[str, list] = {}
for r in runs:
    if "step" in r:
        curves.setdefault(label(r["opts"]), []).append((r["step"], r["val_acc"]))
fig, ax = plt.subplots(figsize=(11, 4.5))
ax.plot(*zip(*base["causal"]), "ko-", lw=2, label="causal LM (countdown3-ar recipe, one 1200-step schedule)")
ax.plot(*zip(*base["masked_diffusion"]), "s--", color="grey", label="md 600 causal + 600 diffusion (old countdown3-md)")
for name, pts in curves.items():
    ax.plot(*zip(*sorted(pts)), "^-", label=name)
phase = next((r for r in runs if "causal_phase_val_acc" in r), None)
if phase is not None:  # the causal phase's own accuracy (causal attention) where the diffusion phase starts
    ax.plot([phase["opts"]["causal"]], [phase["causal_phase_val_acc"]], "k*", ms=12,
            label="the causal phase alone (causal attention, its own schedule)")
ax.axvline(1200, color="grey", lw=0.5, ls=":")
ax.set_xlabel("pre-training optimizer steps (batch 64), causal phase included")
ax.set_ylabel("validation greedy accuracy (256 rows)")
ax.set_xlim(0, 1850)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[3], dpi=120)
print(json.dumps({k: sorted(v) for k, v in curves.items()}))
