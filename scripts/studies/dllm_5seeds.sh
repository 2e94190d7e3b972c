#!/bin/bash
# Study (docs/RESULTS.md, "dllm-countdown3 at 5 seeds"): waits for process $1 (the base build; any finished pid
# otherwise), then runs diffu-GRPO and DMPO correct_only over 5 seeds at $2 rollout batches into /work/wt/mdrl5_runs/out
#     scripts/studies/dllm_5seeds.sh 999999 5
while kill -0 "$1" 2>/dev/null; do sleep 5; done
cd /work/wt/mdrl5 && . .venv/bin/activate
export MMRL_CACHE=/work/cache
exec nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python -c '
import logging, sys
logging.basicConfig(level=logging.INFO)
from mmrl.tiny_world.reasoning_rl import run_reasoning_comparison as r, DMPO_CORRECT_ONLY as D
r("dllm-countdown3", "/work/wt/mdrl5_runs/out", seeds=5, rollouts=int(sys.argv[1]), arms=["diffu-GRPO", D], resume=True)
' "$2"
