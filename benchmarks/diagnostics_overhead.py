"""Issue 29: the cost of the default `diag/` diagnostics, `log_diagnostics` on against off, as the ratio of real
`Trainer` step times measured in one process, interleaved (on, off, off, on, ... blocks), on the models and batches
of `benchmarks/method_costs.py`.

Configurations (name: family, method):

| name | family | method | what the diagnostics cost there |
|---|---|---|---|
| grpo_beta0 | causal_lm | GRPO beta 0 | weight mass, the update-size copy (no reference: the KL is not logged) |
| grpo_beta0.04 | causal_lm | GRPO beta 0.04 | the same; the KL comes from the KL term's reference log-probs |
| dmpo | causal_lm | DMPO (R = 4) | the KL from the likelihood forwards DMPO runs anyway (exact log-probs) |
| dllm_dmpo | masked_diffusion | DMPO (WDCE, R = 4) | one no-grad mean-field forward of the policy and of the reference per rollout |
| grpo_beta0_diagref | causal_lm | GRPO beta 0, `diagnostics_reference=true` | the asked-for frozen copy's forward (not the default) |

    python benchmarks/diagnostics_overhead.py --threads 1 --out benchmarks/results/diagnostics_overhead.json
    python benchmarks/diagnostics_overhead.py --smoke --out /tmp/diag.json      # seconds (CI)
    python benchmarks/diagnostics_overhead.py --configs dllm_dmpo --repeats 4

The goal (issue 29): on / off <= 1.03 for every default configuration. On CPU the ratio is of the process CPU time
of each step (robust to other jobs on a shared machine), with the wall-time ratio beside it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import environment, paired_ratio, print_table, set_threads, summarize, write_json  # noqa: E402

CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "grpo_beta0": ("causal_lm", "grpo_beta0", {}),
    "grpo_beta0.04": ("causal_lm", "grpo_beta0.04", {}),
    "dmpo": ("causal_lm", "dmpo", {}),
    "dllm_dmpo": ("masked_diffusion", "dmpo", {}),
    "grpo_beta0_diagref": ("causal_lm", "grpo_beta0", {"diagnostics_reference": True}),
}
"""name -> (family, `method_costs.METHODS` entry, extra `TrainConfig` overrides)."""

DEFAULTS = ("grpo_beta0", "grpo_beta0.04", "dmpo", "dllm_dmpo")
"""The configurations the goal is about (the diagnostics' default settings)."""

GOAL = 1.03
"""Issue 29: the diagnostics cost at most 3% of a step by default."""


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Step times with the diagnostics on and off, interleaved in blocks on, off, off, on (ABBA: a drift in the
    machine's load hits both alike). On CPU the main figure is the process CPU time of each step (one torch thread:
    the compute the step itself did; the wall time of a shared machine also holds the time other jobs took the core,
    which here varied 2x between identical steps); the wall-time ratio is kept beside it."""
    import time

    import method_costs as mc

    family, method, extra = CONFIGS[name]
    sz = mc.sizes(args, family)
    wall: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {flag: mc.make_trainer(family, method, sz, tmp, extra={**extra, "log_diagnostics": flag == "on"},
                                          tag=f"_{name}_{flag}") for flag in ("on", "off")}
        for flag in ("on", "off"):  # warm-up
            for _ in range(args.warmup):
                mc.one_step(trainers[flag])
        for r in range(args.repeats):
            for flag in (("on", "off") if r % 2 == 0 else ("off", "on")):
                c0 = time.process_time()
                wall[flag].append(mc.one_step(trainers[flag])["step"])
                cpu[flag].append(time.process_time() - c0)
        ref_built = trainers["on"].policy.ref_model is not None
    main = cpu if args.device == "cpu" else wall
    return {"family": family, "method": method, "extra": extra, "clock": "process CPU time" if args.device == "cpu" else "wall",
            "on": summarize(main["on"]), "off": summarize(main["off"]), "ratio": paired_ratio(main["on"], main["off"]),
            "wall_on": summarize(wall["on"]), "wall_off": summarize(wall["off"]),
            "wall_ratio": paired_ratio(wall["on"], wall["off"]), "reference_built": ref_built,
            "goal": GOAL if name in DEFAULTS else None}


def parse_args(argv=None) -> argparse.Namespace:
    import method_costs as mc

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(DEFAULTS), help=f"comma-separated, of {list(CONFIGS)}")
    ap.add_argument("--repeats", type=int, default=4, help="timed steps per setting (alternating on/off blocks)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    own, rest = ap.parse_known_args(argv)
    args = mc.parse_args(rest + (["--smoke"] if own.smoke else []))  # the model sizes of method_costs
    args.configs = [c for c in own.configs.split(",") if c]
    if own.smoke and own.configs == ",".join(DEFAULTS):
        args.configs = ["grpo_beta0", "dllm_dmpo"]  # CI: one of each family
    bad = [c for c in args.configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configuration(s) {bad}; valid: {list(CONFIGS)}")
    args.repeats = 2 if own.smoke else own.repeats
    args.out, args.smoke = own.out, own.smoke
    return args


def main(argv=None) -> int:
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    args = parse_args(argv)
    set_threads(args.threads, args.device)
    result: dict[str, Any] = {"benchmark": "diagnostics_overhead", "smoke": args.smoke, "environment": environment(args.device),
                              "repeats": args.repeats, "warmup": args.warmup, "configs": {}}
    rows = []
    for name in args.configs:
        res = measure(name, args)
        result["configs"][name] = res
        write_json(args.out, result)
        r = res["ratio"]
        w = res["wall_ratio"]
        rows.append({"config": name, "on": f"{res['on']['median']:.2f}", "off": f"{res['off']['median']:.2f}",
                     "ratio": f"{r['ratio']:.3f} [{r['round_min']:.3f}-{r['round_max']:.3f}]",
                     "wall": f"{w['ratio']:.3f} [{w['round_min']:.3f}-{w['round_max']:.3f}]",
                     "ref": "yes" if res["reference_built"] else "no",
                     "goal": "" if res["goal"] is None else f"<= {GOAL}: {'met' if r['ratio'] <= GOAL else 'MISSED'}"})
    print_table(rows, [("config", "configuration"), ("on", "diagnostics on (CPU s)"), ("off", "off (CPU s)"),
                       ("ratio", "on / off [paired]"), ("wall", "wall on / off [paired]"), ("ref", "reference built"),
                       ("goal", "goal")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
