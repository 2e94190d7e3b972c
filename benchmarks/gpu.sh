#!/usr/bin/env bash
# The benchmark suite sized for one GPU (about 0.5B-parameter Qwen2 shapes), meant to finish in under 8 minutes.
#
#   bash benchmarks/gpu.sh [OUT_DIR]          # default bench_results/gpu; then: python benchmarks/report.py --results OUT_DIR
#   MMRL_BENCH_SMOKE=1 bash benchmarks/gpu.sh  # the same plumbing at smoke sizes (seconds; works on CPU too)
#
# B6 (the README command) is a CPU goal and runs on the CPU; everything else runs on cuda:0. Peak memory is
# torch.cuda.max_memory_allocated per method, each in a fresh process.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench_results/gpu}"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1
start=$(date +%s)
if [[ "${MMRL_BENCH_SMOKE:-0}" == "1" ]]; then
    python benchmarks/run_all.py --smoke --out "$out" --skip quickstart_time
else
    # quickstart_time is skipped: its goal is about 2 CPU cores, and it would take most of the 8 minutes
    python benchmarks/run_all.py --gpu --out "$out" --skip quickstart_time --timeout 300
fi
echo "gpu.sh: $(( $(date +%s) - start )) s; results in $out (python benchmarks/report.py --results $out --stdout)"
