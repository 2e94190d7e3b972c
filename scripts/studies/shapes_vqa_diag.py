"""Diagnostic (docs/RESULTS.md "Tiny VLM", issue 25 item 5): what RL did to the base's answers (the base the runs
started from, ROOT/base.json "model"; `shapes-vqa` for a report from before that field), on the
VALIDATION split only: for the base and every saved RL run under ROOT/runs (`<arm>-seed<k>/model.safetensors`,
written by `mmrl replicate gcpo-vs-grpo-vqa`), greedy accuracy per question type and the share of that type's
questions given its single most common answer (1.0: one constant answer, the prior; the base's own share is the
reference), with the training reward (first / last 10 steps) and the k3 KL of the last step.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_diag.py [ROOT=runs/replicate/gcpo-vs-grpo-vqa]
"""
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.models import adapter_class
from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy
from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES, normalise_answer
from mmrl.tiny_world.vqa_rl import BASE, EVAL_GENERATION
from mmrl.training.evaluate import evaluate

torch.set_num_threads(1)
register()
root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/replicate/gcpo-vs-grpo-vqa")
rows = load_task("shapes_vqa").validation


def describe(policy) -> dict:
    res = evaluate(policy, rows, "shapes_vqa", batch_size=128, progress=False, **EVAL_GENERATION)
    out = {}
    for t in QUESTION_TYPES:
        idx = [i for i, r in enumerate(rows) if r["qtype"] == t]
        answers = Counter(normalise_answer(res.completions[i]) for i in idx)
        top, n = answers.most_common(1)[0]
        out[t] = {"accuracy": sum(res.scores[i] for i in idx) / len(idx), "top_answer": top, "top_share": n / len(idx)}
    return out


base_file = root / "base.json"
base_name = json.loads(base_file.read_text()).get("model", BASE) if base_file.is_file() else BASE
report = {"base": {"model": base_name, **describe(load_base_policy(base_name, progress=False))}}
for run in sorted(p for p in (root / "runs").glob("*-seed*") if (p / "model.safetensors").is_file()):
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    reward = [r["reward"] for r in recs if "reward" in r]
    kl = [r["diag/kl_k3"] for r in recs if "diag/kl_k3" in r]
    report[run.name] = {**describe(adapter_class("vlm").from_pretrained(run)),
                        "reward_first_last10": [sum(reward[:10]) / 10, sum(reward[-10:]) / 10], "kl_k3_last": kl[-1]}
(root / "diagnostics.json").write_text(json.dumps(report, indent=1))
for name, d in report.items():
    cells = "  ".join(f"{t} {d[t]['accuracy']:.2f} ({d[t]['top_answer']!r} {d[t]['top_share']:.2f})" for t in QUESTION_TYPES)
    extra = (f"  reward {d['reward_first_last10'][0]:.2f}->{d['reward_first_last10'][1]:.2f}, kl {d['kl_k3_last']:.3f}"
             if "kl_k3_last" in d else "")
    print(f"{name:12s} {cells}{extra}")
