"""One identical tiny GRPO run under TRL's `GRPOTrainer` and mmrl's `Trainer`, and the diff of their metrics by name
and by meaning (issue 28).

Both load the same random Qwen2 checkpoint and run the same settings (prompts, group size, batch, lengths,
sampling, loss, reward scaling, learning rate) with two rewards: `char_sum_reward` and TRL's docs' Example-4 shape,
a reward that returns None for every other prompt (so some samples are scored by one reward only). The samples
differ (two samplers), so the numbers differ; what must agree is what each shared key *means*. For each side the
script recomputes every shared reward metric from that side's own per-sample rewards of the logged batch (TRL:
`trainer._logs`; mmrl: `completions.jsonl`) and checks the logged value against the definition:

- `reward`: mean of the weighted reward sums; `reward_std`: their std over the whole batch (n - 1);
- `rewards/<fn>/mean|std`: over the samples the reward scored (None left out);
- `frac_reward_zero_std`: share of groups whose rewards are all equal;
- advantages: (r - group mean) / (group std + eps) (TRL's eps 1e-4, mmrl's 1e-6; the check allows for it).

    python benchmarks/trl_metrics.py --out /tmp/trl_metrics.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_PROMPTS, build_qwen2, char_sum_reward, qwen2_config, set_threads, wide_tokenizer, write_json  # noqa: E402

SETTINGS = dict(num_generations=4, per_device_train_batch_size=8, max_completion_length=8, temperature=1.0, top_p=1.0,
                top_k=0, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", num_iterations=1,
                learning_rate=1e-3, max_grad_norm=1.0, lr_scheduler_type="constant", weight_decay=0.0, seed=0)
"""The settings both trainers get, under the names both use."""

REWARD_KEYS = ("reward", "reward_std", "frac_reward_zero_std")


def every_other_prompt(prompts, completions, **kwargs) -> list[float | None]:
    """TRL docs' Example 4 shape: a reward for some rows only (None elsewhere)."""
    return [None if sum(map(ord, p)) % 2 else float(len(c) % 3) for p, c in zip(prompts, completions)]


REWARDS = [char_sum_reward, every_other_prompt]


def _mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def _std(xs):
    if len(xs) < 2:
        return float("nan")
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def definitions(per_reward: dict[str, list], group: int) -> dict[str, float]:
    """The shared reward metrics from per-sample rewards (None / NaN: not scored), by their TRL definitions."""
    names = list(per_reward)
    n = len(per_reward[names[0]])
    ok = lambda v: v is not None and not (isinstance(v, float) and math.isnan(v))  # noqa: E731
    totals = [None if not any(ok(per_reward[k][i]) for k in names) else sum(per_reward[k][i] for k in names if ok(per_reward[k][i]))
              for i in range(n)]
    scored = [t for t in totals if t is not None]
    out = {"reward": _mean(scored), "reward_std": _std(scored)}
    zero = []
    for g in range(0, n, group):
        grp = [t for t in totals[g : g + group] if t is not None]
        s = _std(grp)
        zero.append(not math.isnan(s) and abs(s) < 1e-8)
    out["frac_reward_zero_std"] = _mean([float(z) for z in zero])
    for k in names:
        vals = [v for v in per_reward[k] if ok(v)]
        out[f"rewards/{k}/mean"] = _mean(vals)
        out[f"rewards/{k}/std"] = _std(vals)
    return out


def run_trl(model_dir: Path, out_dir: str, steps: int) -> tuple[dict, dict[str, list]]:
    """TRL: the last logged metrics and the per-sample rewards of the last batch."""
    import datasets
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    s = SETTINGS
    cfg = GRPOConfig(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=s["per_device_train_batch_size"],
                     gradient_accumulation_steps=1, num_generations=s["num_generations"],
                     max_completion_length=s["max_completion_length"], temperature=s["temperature"], top_p=s["top_p"],
                     top_k=s["top_k"], beta=s["beta"], epsilon=s["epsilon"], loss_type=s["loss_type"],
                     scale_rewards=s["scale_rewards"], num_iterations=1, learning_rate=s["learning_rate"],
                     max_grad_norm=s["max_grad_norm"], lr_scheduler_type="constant", weight_decay=0.0, bf16=False,
                     fp16=False, use_cpu=True, logging_steps=1, report_to="none", save_strategy="no",
                     log_completions=False, disable_dropout=True, dataloader_num_workers=0, seed=s["seed"],
                     model_init_kwargs={"dtype": "float32"})
    data = datasets.Dataset.from_list([{"prompt": p} for p in BENCH_PROMPTS])
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=REWARDS, args=cfg, train_dataset=data, processing_class=tok)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "reward" in h][-1]
    n = s["per_device_train_batch_size"]
    per_reward = {k: [None if math.isnan(v) else v for v in list(col)[-n:]] for k, col in trainer._logs["rewards"].items()}
    return logged, per_reward


def run_mmrl(model_dir: Path, out_dir: str, steps: int) -> tuple[dict, dict[str, list]]:
    """mmrl: the last logged metrics and the per-sample rewards of the last batch (its completions table)."""
    from mmrl.config.train_config import load_config
    from mmrl.reporting.metrics_log import read_metrics
    from mmrl.training.trainer import Trainer

    cfg = load_config(None, dict(method="grpo", family="causal_lm", model_name_or_path=str(model_dir), max_steps=steps,
                                 gradient_accumulation_steps=1, dynamic_sampling=False, save_steps=0, report_to=["jsonl"],
                                 progress_bar=False, output_dir=out_dir, log_completions=True, **SETTINGS))
    Trainer(cfg, dataset=[{"prompt": p} for p in BENCH_PROMPTS], reward_funcs=REWARDS).train()
    logged = read_metrics(out_dir)[-1]
    rows = [json.loads(x) for x in (Path(out_dir) / "completions.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["step"] == rows[-1]["step"]]
    per_reward = {k: [r["rewards"].get(k) for r in last] for k in last[0]["rewards"]}
    return logged, per_reward


def compare(trl_logged: dict, trl_rewards: dict, mmrl_logged: dict, mmrl_rewards: dict, group: int, tol: float = 1e-4) -> dict:
    """Shared / one-sided keys, and each side's logged reward metrics against their definitions."""
    shared = sorted(set(trl_logged) & set(mmrl_logged))
    report: dict[str, Any] = {"shared_keys": shared, "only_trl": sorted(set(trl_logged) - set(mmrl_logged)),
                              "only_mmrl": sorted(set(mmrl_logged) - set(trl_logged)), "meaning": {}}
    want = {"trl": definitions(trl_rewards, group), "mmrl": definitions(mmrl_rewards, group)}
    got = {"trl": trl_logged, "mmrl": mmrl_logged}
    for key in sorted(set(want["trl"]) & set(shared)):
        row = {}
        for side in ("trl", "mmrl"):
            w, g = want[side][key], float(got[side][key])
            agree = (math.isnan(w) and math.isnan(g)) or (not math.isnan(w) and abs(w - g) <= tol * max(1.0, abs(w)))
            row[side] = {"logged": g, "definition": w, "agrees": bool(agree)}
        report["meaning"][key] = row
    report["all_agree"] = all(r[s]["agrees"] for r in report["meaning"].values() for s in ("trl", "mmrl"))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the report as JSON here")
    args = ap.parse_args(argv)
    set_threads(1)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        tok = wide_tokenizer(512)
        model = build_qwen2(qwen2_config(vocab_size=512, hidden=32, layers=2, tokenizer=tok), seed=0)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        trl = run_trl(model_dir, str(Path(tmp) / "trl"), args.steps)
        mm = run_mmrl(model_dir, str(Path(tmp) / "mmrl"), args.steps)
    report = compare(*trl, *mm, SETTINGS["num_generations"])
    print(f"shared keys ({len(report['shared_keys'])}): {', '.join(report['shared_keys'])}")
    print(f"only TRL ({len(report['only_trl'])}): {', '.join(report['only_trl'])}")
    print(f"only mmrl ({len(report['only_mmrl'])}): {', '.join(report['only_mmrl'])}")
    print(f"{'metric':34s} {'TRL logged':>11s} {'TRL def':>11s} {'mmrl logged':>11s} {'mmrl def':>11s}  agree")
    for key, row in report["meaning"].items():
        t, m = row["trl"], row["mmrl"]
        print(f"{key:34s} {t['logged']:11.4f} {t['definition']:11.4f} {m['logged']:11.4f} {m['definition']:11.4f}  "
              f"{'yes' if t['agrees'] and m['agrees'] else 'NO'}")
    if args.out:
        write_json(args.out, report)
    return 0 if report["all_agree"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
