"""Study (docs/RESULTS.md, `dmpo-vs-d1`'s best-of-n rows): best-of-n from the `sudoku4` base on the comparison's test
puzzles, reranked two ways: by the reward (reads the true solution: an oracle's ceiling) and by the constraint
verifier a user could run (`sudoku4_verifier`: fewest violated row / column / box / given-cell constraints, reads
only the puzzle); per-puzzle scores and paired-bootstrap 95% intervals against greedy decoding.

    OMP_NUM_THREADS=1 python scripts/studies/sudoku_best_of_n.py OUT [n=16]
"""
import json
import sys
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.tiny_world import register
from mmrl.tiny_world.models import ensure_built, load_base_policy, weights_digest
from mmrl.tiny_world.quickstart import QUICKSTART_RECIPE, evaluate_items
from mmrl.tiny_world.reasoning_rl import held_out_items
from mmrl.tiny_world.stats import difference_interval, mean_interval
from mmrl.tiny_world.tasks import sudoku4_verifier

torch.set_num_threads(1)
register()
out = Path(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
out.mkdir(parents=True, exist_ok=True)
task = load_task("sudoku4")
test = task.test[: QUICKSTART_RECIPE["eval_limit"]]  # the rows `mmrl replicate dmpo-vs-d1` scores
digest = weights_digest(ensure_built("sudoku4", progress=False))
policy = load_base_policy("sudoku4", progress=False)
_, base_items = evaluate_items(policy, test, task.metric)  # the runner's base row: greedy, steps = length
summary, items = held_out_items(policy, test, task.metric, "masked_diffusion", 16, k=n, verifier=sudoku4_verifier)
rows = {"base (greedy)": base_items, f"best-of-{n}, the reward picks (oracle)": items["best"],
        f"best-of-{n}, the constraint verifier picks": items["verified"], f"one sampled answer (mean of {n})": items["sampled"]}
report = {"base_weights_digest": digest, "n": n, "puzzles": len(test), "items": rows, "intervals": {}}
print(f"sudoku4 base {digest[:12]}, {len(test)} test puzzles, {n} samples each (cell accuracy, %)")
for label, it in rows.items():
    m = mean_interval([it])
    d = difference_interval([it], [base_items]) if label != "base (greedy)" else None
    report["intervals"][label] = {"mean": m.__dict__, "vs_base": d.__dict__ if d else None}
    print(f"  {label:48s} {m.fmt()}" + (f"   vs base {d.fmt(signed=True)}" if d else ""))
d = difference_interval([items["best"]], [items["verified"]])
report["intervals"]["oracle - verifier"] = d.__dict__
print(f"  oracle - verifier {d.fmt(signed=True)}")
(out / "results.json").write_text(json.dumps(report, indent=1))
