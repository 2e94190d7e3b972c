"""Text-to-image RL (Janus-Pro) with GCPO or GRPO on GenEval rewards.

One GPU / CPU:
    python scripts/train_t2i.py configs/gcpo_janus_pro_7b_geneval.yaml model_name_or_path=/models/Janus-Pro-7B
Eight GPUs, DeepSpeed ZeRO-3 (what the GCPO authors used):
    accelerate launch --config_file configs/accelerate/zero3.yaml scripts/train_t2i.py \
        configs/gcpo_janus_pro_7b_geneval.yaml model_name_or_path=/models/Janus-Pro-7B
Several nodes: add --num_machines N --machine_rank R --main_process_ip HOST --main_process_port PORT.
The tiny world (no GPU, no download):
    python scripts/train_t2i.py configs/tiny_gcpo_shapes.yaml
"""
import sys

from mmrl.cli import main

if __name__ == "__main__":
    args = sys.argv[1:] or ["configs/gcpo_janus_pro_7b_geneval.yaml"]
    sys.exit(main(["train", *args]))
