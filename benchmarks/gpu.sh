#!/usr/bin/env bash
# The benchmark suite sized for one GPU, meant to finish in under 10 minutes: Qwen2.5-0.5B-sized causal LMs (method
# costs, diagnostics on / off, mmrl against TRL), a LLaDA-architecture model (126k vocabulary, scaled to 2048 wide)
# for Fast-dLLM's caches on the native class, Janus-Pro-1B-like CFG sampling shapes. Where vLLM is installed, its
# engine tests (up to 5 minutes) and its rollouts against the built-in sampler (a causal LM, then a Qwen2.5-VL;
# up to 2 x 4 minutes) run too.
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
    python benchmarks/llada_cache.py --smoke --out "$out/llada_cache.json"
else
    # quickstart_time is skipped: its goal is about 2 CPU cores, and it would take most of the 10 minutes; each
    # benchmark gets at most 150 s and the whole suite 540 s (run_all writes summary.json after each one)
    timeout 540 python benchmarks/run_all.py --gpu --out "$out" --skip quickstart_time --timeout 150 || echo "gpu.sh: run_all stopped early ($?)"
    timeout 60 python benchmarks/llada_cache.py --device cuda --hidden 2048 --layers 8 --batch 8 --prompt-length 128 \
        --gen-length 256 --block-length 32 --repeats 2 --out "$out/llada_cache.json" || echo "gpu.sh: llada_cache stopped early"
    # vLLM rollouts (use_vllm, colocate) against the built-in sampler: tokens/s and seconds per step (issue 28), the
    # causal LM and the VLM (a Qwen2.5-VL, one 112 x 112 image per prompt: 196 image tokens; needs vLLM's Qwen2.5-VL
    # module, i.e. torchvision)
    if python -c "import vllm" 2>/dev/null; then
        # the real-engine tests first (greedy rollouts equal the built-in sampler's, weights follow the policy, LoRA
        # merged, a training run; the VLM's where vLLM's Qwen2.5-VL imports), then the measurements
        mkdir -p "$out"
        timeout 300 python -m pytest -q -rs tests/models/test_vllm_engine.py 2>&1 | tee "$out/vllm_engine_tests.txt" \
            || echo "gpu.sh: vLLM engine tests failed or stopped"
        timeout 240 python benchmarks/vllm_rollouts.py --device cuda --hidden 896 --layers 24 --prompts 16 --group 8 \
            --new-tokens 256 --out "$out/vllm_rollouts.json" || echo "gpu.sh: vllm_rollouts stopped early"
        if python -c "import vllm.model_executor.models.qwen2_5_vl" 2>/dev/null; then
            timeout 240 python benchmarks/vllm_rollouts.py --family vlm --device cuda --hidden 896 --layers 24 \
                --vision-hidden 640 --vision-depth 8 --image-size 112 --prompts 16 --group 8 --new-tokens 256 \
                --out "$out/vllm_rollouts_vlm.json" || echo "gpu.sh: vllm_rollouts (vlm) stopped early"
        else
            echo "gpu.sh: vLLM's Qwen2.5-VL module does not import (torchvision?): vllm_rollouts (vlm) skipped"
        fi
    else
        echo "gpu.sh: vLLM is not installed: vllm_rollouts skipped (pip install 'mmrl[vllm]')"
    fi
    # sharded (FSDP) checkpoints resumed bitwise: needs 2 GPUs (skipped in seconds on one; about 3 minutes beyond the
    # 10 when it runs)
    timeout 600 python benchmarks/sharded_resume_check.py --out "$out/sharded_resume.json" || echo "gpu.sh: sharded_resume_check failed or stopped ($?)"
fi
echo "gpu.sh: $(( $(date +%s) - start )) s; results in $out (python benchmarks/report.py --results $out --stdout)"
