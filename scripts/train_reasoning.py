"""Reasoning RL for causal LMs and VLMs: DAPO with DGPO or GCPO token credit.

Causal LM, eight GPUs:
    accelerate launch --config_file configs/accelerate/zero3.yaml scripts/train_reasoning.py \
        configs/dgpo_dapo_qwen25_7b.yaml model_name_or_path=/models/Qwen2.5-7B dataset_path=/data/math.jsonl
VLM (Qwen2.5-VL), FSDP:
    accelerate launch --config_file configs/accelerate/fsdp.yaml scripts/train_reasoning.py \
        configs/gcpo_qwen25_vl_7b.yaml model_name_or_path=/models/Qwen2.5-VL-7B-Instruct dataset_path=/data/virl39k.jsonl
Two CPU processes (gloo), e.g. to try distribution on a laptop:
    accelerate launch --config_file configs/accelerate/cpu_ddp.yaml scripts/train_reasoning.py configs/tiny_dgpo_countdown3.yaml
"""
import sys

from mmrl.cli import main

if __name__ == "__main__":
    args = sys.argv[1:] or ["configs/dgpo_dapo_qwen25_7b.yaml"]
    sys.exit(main(["train", *args]))
