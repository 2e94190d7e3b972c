#!/bin/bash
# Study (docs/RESULTS.md, "DMPO reuse F > 1 without negative weights"): the one `dllm-countdown3` arm named by the
# reasoning_rl constant $3 (e.g. DMPO_CORRECT_ONLY_F4) over 5 seeds in order at $1 rollout batches into $2, the
# validation curve at $4 points per run (`curve_points`), each run saved as it finishes (rerunning resumes), no
# baseline rows. Niced, one torch thread.
#     MMRL_CACHE=/work/cache scripts/studies/dllm_reuse_arm.sh 15 /work/runs/reuse/OUT DMPO_CORRECT_ONLY_F4 3
cd "$(dirname "$0")/../.." && . .venv/bin/activate
exec nice -n 10 env OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python -c '
import logging, sys
logging.basicConfig(level=logging.INFO)
from mmrl.tiny_world import reasoning_rl as rr
rr.run_reasoning_comparison("dllm-countdown3", sys.argv[2], seeds=5, rollouts=int(sys.argv[1]),
                            arms=[getattr(rr, sys.argv[3])], resume=True, baselines=False, curve_points=int(sys.argv[4]))
' "$1" "$2" "$3" "$4"
