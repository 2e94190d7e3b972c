"""Study (docs/RESULTS.md, "dLLM"): paired-bootstrap intervals across `dllm-countdown3` result files run in pieces
(same base, same test rows and evaluation seeds, so the per-item scores pair up).

    python scripts/studies/dllm_combine.py OUT.json RUN_DIR/results.json [RUN_DIR/results.json ...]
"""
import json
import sys

from mmrl.tiny_world.reasoning_rl import paired_intervals

res = [json.load(open(p)) for p in sys.argv[2:]]
base = res[0]["before_items"]
assert all(r["before_items"] == base for r in res), "the pieces must share the base's per-item scores"
arms = {a: [run["items"] for run in runs] for r in res for a, runs in r["arms"].items()}
iv = paired_intervals(base, arms)
summary = {a: {"after": [run["after"] for run in runs], "seconds": [run["seconds"] for run in runs]}
           for r in res for a, runs in r["arms"].items()}
out = {"before": res[0]["before"], "arms": summary, "intervals": iv}
open(sys.argv[1], "w").write(json.dumps(out, indent=2))
print("\n".join(iv["lines"]))
