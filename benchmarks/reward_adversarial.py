"""Time the text rewards on adversarial completions against ordinary ones, measured in the same process.

The GenEval/reward issue asks every adversarial completion (code, `9**9**9`, 10,000-digit numbers, unicode digits,
unbalanced brackets, empty strings, ...) to be scored within 50 ms. Prints, per reward, the worst adversarial time,
the median ordinary time and their ratio. `--smoke` runs one repetition.

    python benchmarks/reward_adversarial.py [--smoke]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_rewards_text import ADVERSARIAL, TEXT_REWARDS  # noqa: E402

from mmrl.rewards import REWARDS  # noqa: E402

ORDINARY = ["<reasoning>\n1+1\n</reasoning>\n<answer>\n12\n</answer>\n", "<answer>30 - (100 - 93)</answer>",
            "\\boxed{\\frac{1}{2}}", "<answer>\\boxed{x^2+1}</answer>", "<answer>3142243142131324</answer>"]


def time_one(fn, text, kw) -> float:
    start = time.perf_counter()
    fn([""], [text], **kw)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    reps = 1 if args.smoke else 5
    for fn_name in sorted(TEXT_REWARDS):
        fn, kw = REWARDS[fn_name], TEXT_REWARDS[fn_name]
        for text in ORDINARY:  # warm-up: imports, sympy's lazy modules
            fn([""], [text], **kw)
        ordinary = statistics.median(time_one(fn, t, kw) for _ in range(reps) for t in ORDINARY)
        worst, worst_text = 0.0, ""
        for _ in range(reps):
            for text in ADVERSARIAL:
                t = time_one(fn, text, kw)
                if t > worst:
                    worst, worst_text = t, text
        print(f"{fn_name:16s} worst adversarial {worst * 1e3:8.3f} ms ({worst_text[:24]!r}...), ordinary median "
              f"{ordinary * 1e3:8.3f} ms, ratio {worst / max(ordinary, 1e-9):7.2f}x, budget 50 ms: "
              f"{'ok' if worst < 0.05 else 'OVER'}")


if __name__ == "__main__":
    main()
