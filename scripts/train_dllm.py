"""Diffusion-LM reasoning RL (LLaDA, Dream) with DMPO or d1's diffu-GRPO.

One GPU:
    python scripts/train_dllm.py configs/dmpo_llada_8b_countdown.yaml model_name_or_path=/models/LLaDA-8B-Instruct
Eight GPUs, DeepSpeed ZeRO-2 (what d1 and DMPO used):
    accelerate launch --config_file configs/accelerate/zero2.yaml scripts/train_dllm.py \
        configs/dmpo_llada_8b_countdown.yaml model_name_or_path=/models/LLaDA-8B-Instruct
d1's baseline on the same task:
    accelerate launch --config_file configs/accelerate/zero2.yaml scripts/train_dllm.py \
        configs/d1_diffu_grpo_llada_8b.yaml task=countdown model_name_or_path=/models/LLaDA-8B-Instruct
The tiny world (no GPU, no download):
    python scripts/train_dllm.py configs/tiny_dmpo_sudoku4.yaml
"""
import sys

from mmrl.cli import main

if __name__ == "__main__":
    args = sys.argv[1:] or ["configs/dmpo_llada_8b_countdown.yaml"]
    sys.exit(main(["train", *args]))
