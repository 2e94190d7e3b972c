"""Study (docs/RESULTS.md, "dLLM"): plot the causal and masked-diffusion Countdown bases' validation accuracy
against pre-training compute (optimizer steps of batch 64; the masked-diffusion base counts its causal phase).

    python scripts/studies/dllm_base_curves.py CAUSAL.jsonl BUILD.log OUT_DIR

CAUSAL.jsonl: `mdm_countdown.py ... causal_only=1` records; BUILD.log: `build_with_curve.py countdown3-md` output.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

causal = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
build = [json.loads(x) for x in Path(sys.argv[2]).read_text().splitlines() if x.startswith("{")]
info = next(b for b in build if "curve" in b)
ar = int(info["recipe"].get("ar_init_steps", 0))
out = Path(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
c_pts = [(r["step"], r["acc"]) for r in causal if r.get("family") == "causal_lm"]
m_pts = [(ar + r["step"], r["eval"]) for r in info["curve"]]
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(*zip(*c_pts), "o-", label="causal LM (countdown3-ar recipe)")
ax.plot(*zip(*m_pts), "s-", label=f"masked diffusion, {ar} causal + diffusion steps (countdown3-md)")
ax.axvline(ar, color="grey", lw=0.5, ls="--")
ax.set_xlabel("pre-training optimizer steps (batch 64)")
ax.set_ylabel("validation greedy accuracy (256 rows)")
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out / "base_curves.png", dpi=120)
(out / "base_curves.json").write_text(json.dumps({"causal": c_pts, "masked_diffusion": m_pts, "build": info,
                                                  "test": [b for b in build if "test" in b]}, indent=2))
print(json.dumps({"causal": c_pts, "masked_diffusion": m_pts}))
