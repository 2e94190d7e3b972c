"""Fixed-seed short runs of every method on every family and of every tiny preset; their metrics, bitwise.

A refactor of the trainer or the methods must not change any number: run this before (`--save before.json`) and
after (`--compare before.json`); every metric of every step must be equal as a float (timings excluded).

    OMP_NUM_THREADS=1 python scripts/check_bitwise_runs.py --save /tmp/before.json
    OMP_NUM_THREADS=1 python scripts/check_bitwise_runs.py --compare /tmp/before.json

Tiny random models of each family (`model_name_or_path: tiny`), CPU, one thread; about two minutes on one core.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

import torch  # noqa: E402

from mmrl.config.train_config import load_config  # noqa: E402
from mmrl.models import adapter_class  # noqa: E402
from mmrl.training.trainer import Trainer  # noqa: E402
from tiny_world_fixtures import CELLS, FAMILIES, dataset_for, reward_for  # noqa: E402

import mmrl.tiny_world  # noqa: E402

mmrl.tiny_world.register()  # the presets use the tiny world's tasks (the engine does not import it)

PRESETS = ["tiny_dgpo_countdown3", "tiny_dmpo_sudoku4", "tiny_gcpo_shapes"]
"""configs/<name>.yaml run with a tiny random model of its family and small sizes."""

BASE = dict(max_steps=2, num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
            learning_rate=1e-2, max_completion_length=8, block_length=4, progress_bar=False, dynamic_sampling=False,
            save_steps=0, report_to=["jsonl"], seed=0)

VARIANTS: dict[str, dict] = {
    "one_step": dict(num_iterations=1),
    "reuse": dict(num_iterations=2),
    "kl": dict(num_iterations=2, beta=0.04),
    "kl_one_step": dict(num_iterations=1, beta=0.04),
}
"""Settings every method x family cell is run with."""

EXTRA: dict[str, dict] = {
    "gcpo_full_kl": dict(method="gcpo", gcpo_divergence="full_kl", num_iterations=2),
    "gcpo_full_kl_one_step": dict(method="gcpo", gcpo_divergence="full_kl", num_iterations=1),
    "dgpo_current": dict(method="dgpo", dgpo_policy="current", num_iterations=2),
    "dmpo_wddo": dict(method="dmpo", dmpo_loss="wddo", num_iterations=2),
    "dmpo_model_baseline": dict(method="dmpo", dmpo_baseline="model", num_iterations=2),
    "dmpo_reference": dict(method="dmpo", dmpo_target="reference", num_iterations=2),
    "dmpo_behaviour_group": dict(method="dmpo", dmpo_target="behaviour", dmpo_baseline="group", num_iterations=2),
    "dapo_overlong": dict(method="dapo", overlong_penalty=True, num_iterations=1),
    "dapo_dynamic": dict(method="dapo", dynamic_sampling=True, num_iterations=1),
    "nll": dict(method="grpo", nll_coef=0.1, num_iterations=1),
    "dr_grpo_loss": dict(method="grpo", loss_type="dr_grpo", num_iterations=2),
}
"""Further settings, each run on every family."""


def _clean(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("perf/") and k not in ("timestamp", "time")}


def _run(values: dict, family: str, dataset=None, rewards=None) -> list[dict]:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(None, {**values, "output_dir": out})
        policy = adapter_class(family).tiny(seed=0)
        kw = {} if dataset is None else dict(dataset=dataset, reward_funcs=rewards)
        Trainer(cfg, policy=policy, **kw).train()
        return [_clean(json.loads(line)) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def cases():
    for family in FAMILIES:
        for method in [m for m, f in CELLS if f == family]:
            for vname, v in VARIANTS.items():
                yield f"{method}/{family}/{vname}", dict(BASE, method=method, family=family, **v), family, True
        for name, v in EXTRA.items():
            yield f"{name}/{family}", dict(BASE, family=family, **v), family, True
    for preset in PRESETS:
        import yaml

        values = yaml.safe_load((ROOT / "configs" / f"{preset}.yaml").read_text())
        values.update(model_name_or_path="tiny", max_steps=2, num_generations=4, per_device_train_batch_size=8,
                      eval_steps=0, save_steps=0, credit_steps=0, progress_bar=False, report_to=["jsonl"])
        if values["family"] == "masked_diffusion":
            values.update(diffusion_steps=4)
        values.update(num_iterations=min(values.get("num_iterations", 2), 2))
        yield f"preset/{preset}", values, values["family"], False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", help="write the metrics here")
    ap.add_argument("--compare", help="compare with metrics written by --save")
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args()
    torch.set_num_threads(1)
    got: dict[str, list[dict]] = {}
    for name, values, family, fixture in cases():
        if args.only and args.only not in name:
            continue
        if fixture:
            got[name] = _run(values, family, dataset_for(family), [reward_for(family)])
        else:
            got[name] = _run(values, family)
        print(name, "ok", flush=True)
    if args.save:
        Path(args.save).write_text(json.dumps(got, indent=1, sort_keys=True))
    if args.compare:
        want = json.loads(Path(args.compare).read_text())
        bad, new = [], [name for name in got if name not in want]
        for name, recs in got.items():
            if name in new:
                continue  # a case added since the baseline (e.g. a new method): nothing to compare with
            if recs != want[name]:
                for a, b in zip(recs, want[name]):
                    diff = {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
                    if diff:
                        bad.append(f"{name} step {a.get('step')}: {diff}")
        n_metrics = sum(len(r) for name, recs in got.items() if name not in new for r in recs)
        print(f"{len(got) - len(new)} runs, {n_metrics} metric values compared; {len(bad)} differences"
              + (f" ({len(new)} runs not in the baseline: {', '.join(new)})" if new else ""))
        for line in bad:
            print("  ", line)
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
