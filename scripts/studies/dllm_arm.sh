#!/bin/bash
# Study (docs/RESULTS.md, "dllm-countdown3 at 30 rollout batches" and "DMPO reuse F > 1 without negative weights"):
# waits for process $1 (the runs before it; a finished pid otherwise), then runs the `dllm-countdown3` arm named
# by the reasoning_rl constant $4 (e.g. DMPO_CORRECT_ONLY_NO_KL; several, comma-separated, run seed-major: every arm of
# seed 0, then of seed 1, ...) over 5 seeds in order at $2 rollout batches into $3
# (each run saved as it finishes; rerunning resumes; the base row already in $3 is reused; no baseline rows: another
# job runs those), with $5 validation points per run (`curve_points`; default: the comparison's). Niced, one torch
# thread.
#     MMRL_CACHE=/work/cache scripts/studies/dllm_arm.sh 999999 30 /work/runs/dllm20/OUT DMPO_CORRECT_ONLY_NO_KL
#     MMRL_CACHE=/work/cache scripts/studies/dllm_arm.sh 999999 15 /work/runs/reuse/OUT DMPO_CORRECT_ONLY_F4 3
#     MMRL_CACHE=/work/runs/optstate/cache scripts/studies/dllm_arm.sh 999999 30 /work/runs/optstate/OUT DIFFU_GRPO_BASE_STATE,DMPO_CORRECT_ONLY_BASE_STATE
while kill -0 "$1" 2>/dev/null; do sleep 5; done
cd "$(dirname "$0")/../.." && . .venv/bin/activate
exec nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python -c '
import logging, sys
logging.basicConfig(level=logging.INFO)
from mmrl.tiny_world import reasoning_rl as rr
rr.run_reasoning_comparison("dllm-countdown3", sys.argv[2], seeds=5, rollouts=int(sys.argv[1]),
                            arms=[getattr(rr, a) for a in sys.argv[3].split(",")], resume=True, baselines=False,
                            curve_points=int(sys.argv[4]) if sys.argv[4] else None)
' "$2" "$3" "$4" "${5:-}"
