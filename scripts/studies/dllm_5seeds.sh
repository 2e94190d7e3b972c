#!/bin/bash
# Study (docs/RESULTS.md, "dllm-countdown3 at 5 seeds"): waits for process $1 (the base build; a finished pid
# otherwise), then runs diffu-GRPO and DMPO correct_only over 5 seeds, seed-major, at $2 rollout batches into $3
# (each run saved as it finishes; rerunning resumes). Niced, one torch thread.
#     MMRL_CACHE=/work/cache scripts/studies/dllm_5seeds.sh 999999 5 /work/wt/mdrl5_runs/out
while kill -0 "$1" 2>/dev/null; do sleep 5; done
cd "$(dirname "$0")/../.." && . .venv/bin/activate
exec nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python -c '
import logging, sys
logging.basicConfig(level=logging.INFO)
from mmrl.tiny_world.reasoning_rl import run_reasoning_comparison as r, DMPO_CORRECT_ONLY as D
r("dllm-countdown3", sys.argv[2], seeds=5, rollouts=int(sys.argv[1]), arms=["diffu-GRPO", D], resume=True)
' "$2" "$3"
