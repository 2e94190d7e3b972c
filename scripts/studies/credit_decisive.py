"""Study (docs/RESULTS.md, issue 25 item 3): the share of DGPO's and GCPO's token credit on the decisive tokens of
`countdown4_steps` answers (the step headers, `countdown_steps.decisive_mask`) against uniform credit.

One answer per VALIDATION problem is sampled at temperature 1 (the training sampler) from POLICY (default: the
`countdown4-steps-ar` base); each method's registered class computes its credit on those answers through its own
`prepare` and `loss` with every advantage 1 (`mmrl.tiny_world.credit_share.method_credit`), against the base as the
reference. No RL training is needed for GCPO (its contrast is between two prompts of one policy); for DGPO the policy
must have moved from its reference, so at the base (POLICY = reference) its weights are exactly 1 and its share is
the uniform one by construction: give POLICY = a DGPO run's final checkpoint for a non-trivial measurement.
Shares with paired-bootstrap 95% intervals over answers (`mmrl.tiny_world.stats`); OUT/results.json holds the
per-answer shares, OUT/credit-<method>.html the token-credit view of the first answers (decisive tokens underlined).

    OMP_NUM_THREADS=1 python scripts/studies/credit_decisive.py OUT [POLICY_DIR] [N=300]
"""
import copy
import json
import sys
from pathlib import Path

import torch

from mmrl.data.tasks import load_task
from mmrl.models import adapter_class
from mmrl.reporting.credit_viz import text_heatmap_html
from mmrl.tiny_world import register
from mmrl.tiny_world.countdown_steps import decisive_mask, score
from mmrl.tiny_world.credit_share import decisive_share, decisive_tokens, method_config, method_credit
from mmrl.tiny_world.models import load_base_policy, spec_for
from mmrl.tiny_world.stats import difference_interval, mean_interval

NAME, METHODS, PAGES, BATCH = "countdown4-steps-ar", ("dgpo", "gcpo"), 8, 100

torch.set_num_threads(1)
register()
out = Path(sys.argv[1])
policy_dir = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "base" else None
n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
out.mkdir(parents=True, exist_ok=True)
spec = spec_for(NAME)
base = load_base_policy(NAME, progress=False)
pol = adapter_class(spec.family).from_pretrained(policy_dir) if policy_dir else base
pol.ref_model = copy.deepcopy(base.model).requires_grad_(False).eval()  # the reference: the base
rows = load_task(spec.task).validation[:n]
L = spec.gen_length

report = {"policy": policy_dir or f"base {NAME}", "reference": f"base {NAME}", "split": "validation", "methods": {}}
per_method = {m: {"share": [], "uniform": []} for m in METHODS}
pages = {m: ([], [], [], []) for m in METHODS}
kept = solved = total = 0
for start in range(0, len(rows), BATCH):
    batch = rows[start : start + BATCH]
    roll = pol.sample([r["prompt"] for r in batch], 1, seeds=[7919 + start + i for i in range(len(batch))],
                      max_new_tokens=L, temperature=1.0)
    decisive, usable = decisive_tokens(pol, roll, decisive_mask)
    done = roll.extras["terminated"].bool().cpu()
    use = usable & done  # parsable answers that ended by themselves (the loss masks truncated ones)
    total += len(batch)
    kept += int(use.sum())
    idx = torch.nonzero(use).flatten()
    if not len(idx):
        continue
    sub, dec = roll.select(idx), decisive[idx]
    solved += sum(score(roll.completions[i], batch[i]["numbers"], batch[i]["target"]) for i in idx.tolist())
    toks = pol.token_strings(sub)
    for m in METHODS:
        cfg = method_config(m, spec.family, max_completion_length=L)
        credit = method_credit(cfg, pol, sub)  # [n, T]
        share, uniform = decisive_share(credit, sub.response_mask.bool(), dec)
        per_method[m]["share"] += share.tolist()
        per_method[m]["uniform"] += uniform.tolist()
        t, c, ti, mk = pages[m]
        for j in range(min(len(idx), PAGES - len(t))):
            valid = sub.response_mask[j].bool()
            t.append(toks[j])
            c.append(credit[j][valid].tolist())
            mk.append(dec[j][valid].tolist())
            ti.append(f"{batch[int(idx[j])]['prompt']}  reward {score(sub.completions[j], batch[int(idx[j])]['numbers'], batch[int(idx[j])]['target']):.0f}"
                      f"  share on decisive {share[j]:.3f} (uniform {uniform[j]:.3f})")

report.update(answers=total, usable=kept, usable_solved=solved)
print(f"policy {report['policy']}, reference {report['reference']}: {total} validation answers, {kept} parsable and "
      f"terminated ({solved} of them correct)")
for m in METHODS:
    s, u = per_method[m]["share"], per_method[m]["uniform"]
    iv_s, iv_u, iv_d = mean_interval(s), mean_interval(u), difference_interval(s, u)
    ratio = torch.tensor(s) / torch.tensor(u)
    report["methods"][m] = {"share": iv_s.to_dict(), "uniform": iv_u.to_dict(), "share_minus_uniform": iv_d.to_dict(),
                            "ratio_mean": float(ratio.mean()), "items": per_method[m]}
    print(f"  {m}: share on decisive tokens {iv_s.fmt()}%, uniform {iv_u.fmt()}%, difference {iv_d.fmt(signed=True)} "
          f"points (excludes 0: {iv_d.excludes_zero}); mean ratio {float(ratio.mean()):.2f}")
    t, c, ti, mk = pages[m]
    (out / f"credit-{m}.html").write_text(text_heatmap_html(t, c, ti, f"{m} token credit (advantage 1) on validation "
                                                            f"answers of {report['policy']}", marks=mk,
                                                            mark_legend="the decisive tokens (step headers)"))
(out / "results.json").write_text(json.dumps(report, indent=1))
