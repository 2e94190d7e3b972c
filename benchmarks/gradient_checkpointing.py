"""Peak memory and step time of one GRPO `Trainer` step with and without `gradient_checkpointing=true`.

The same real `Trainer` as `method_costs.py` (Qwen2-style causal LM, wide 32k vocabulary, the same prompts, reward
and seeds), GRPO with one optimizer step per rollout, all responses of a step in one micro-batch (where activations
weigh most). Each variant runs in a fresh process: one warm-up step (optimizer state allocated), then the peak over
`--steps` steps (on CPU the resident-set high-water mark, on CUDA `max_memory_allocated`) and their step times.
`extra` is the memory above what was in use before the measured steps (activations, logits, gradients); the
weights, the optimizer state and the sampler's cache are the same in both variants. Checkpointing recomputes
each decoder layer's forward in the backward pass, so the update part of the step gets slower; sampling does not
change.

    python benchmarks/gradient_checkpointing.py                     # CPU size (~3 min on one core)
    python benchmarks/gradient_checkpointing.py --smoke --out /tmp/gc.json
    python benchmarks/gradient_checkpointing.py --device cuda --hidden 896 --layers 24 --vocab 151936 --tokens 256
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_PROMPTS, PeakMemory, char_sum_reward, environment, run_json_subprocess, set_threads, summarize, write_json  # noqa: E402


def child(args: argparse.Namespace, checkpointing: bool) -> dict:
    """One variant, in this (fresh) process."""
    from method_costs import build_policy

    from mmrl.config.train_config import load_config
    from mmrl.training.trainer import Trainer

    set_threads(args.threads, args.device)
    sz = dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, dict(
            family="causal_lm", method="grpo", num_generations=args.group, per_device_train_batch_size=args.responses,
            gradient_accumulation_steps=1, max_completion_length=args.tokens, num_iterations=1, dynamic_sampling=False,
            learning_rate=1e-6, max_steps=10**6, save_steps=0, report_to=["jsonl"], progress_bar=False, output_dir=tmp,
            gradient_checkpointing=checkpointing))
        policy = build_policy("causal_lm", sz)
        # EOS = the last filler id, which a random model samples rarely: responses run to full length in both variants
        policy.generation_defaults["eos_token_id"] = [policy.vocab_size - 1]
        if args.device != "cpu":
            policy.model.to(args.device)
        trainer = Trainer(cfg, policy=policy, dataset=[{"prompt": p} for p in BENCH_PROMPTS], reward_funcs=[char_sum_reward])
        trainer.save = lambda: None
        trainer.save_model = lambda *a, **k: None  # no final model per train() call

        def step() -> dict:
            trainer.cfg.max_steps = trainer.step + 1
            return trainer.train()

        step()  # warm-up: optimizer state, allocator pools
        times, updates = [], []
        with PeakMemory(args.device) as pm:
            for _ in range(args.steps):
                m = step()
                times.append(m["perf/step_time"])
                updates.append(m["perf/step_time"] - m["perf/rollout_time"] - m["perf/reward_time"] - m["perf/buffer_time"])
        tokens = int(trainer.buffer.rollout.response_mask.sum())
    return {"memory": pm.as_dict(), "step_time": summarize(times), "update_time": summarize(updates), "response_tokens": tokens}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a tiny size that runs in seconds")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokens", type=int, default=128, help="response tokens")
    p.add_argument("--responses", type=int, default=16, help="responses per step (one micro-batch)")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=["off", "on"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.tokens, args.responses, args.group, args.steps = 64, 2, 512, 8, 4, 2, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args, args.child == "on")))
        return 0
    passed = [f"--{k}={getattr(args, k)}" for k in ("device", "threads", "hidden", "layers", "vocab", "tokens", "responses", "group", "steps")]
    script = str(Path(__file__).resolve())
    env = {}
    if args.device == "cpu":  # freed large blocks go back to the system, so the resident set tracks live memory
        env = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    res = {v: run_json_subprocess([script, *passed, "--child", v], env=env) for v in ("off", "on")}
    off, on = res["off"], res["on"]
    out = {
        "benchmark": "gradient_checkpointing", "smoke": args.smoke, "environment": environment(args.device),
        "size": {k: getattr(args, k) for k in ("hidden", "layers", "vocab", "tokens", "responses", "group", "steps")},
        "off": off, "on": on,
        "peak_ratio": on["memory"]["peak_bytes"] / max(1, off["memory"]["peak_bytes"]),
        "extra_ratio": on["memory"]["extra_bytes"] / max(1, off["memory"]["extra_bytes"]),
        "step_time_ratio": on["step_time"]["median"] / off["step_time"]["median"],
        "update_time_ratio": on["update_time"]["median"] / off["update_time"]["median"],
    }
    mib = 2**20
    print(f"GRPO step, {args.responses} responses x {args.tokens} tokens, hidden {args.hidden} x {args.layers} layers, "
          f"vocab {args.vocab}, {args.device}:")
    for name, r in (("off", off), ("on", on)):
        print(f"  checkpointing {name:3s}: peak {r['memory']['peak_bytes'] / mib:8.1f} MiB, extra {r['memory']['extra_bytes'] / mib:8.1f} MiB, "
              f"step {r['step_time']['median']:.2f} s (update {r['update_time']['median']:.2f} s)")
    print(f"  on/off: peak {out['peak_ratio']:.3f}, extra {out['extra_ratio']:.3f}, step time {out['step_time_ratio']:.3f}, "
          f"update time {out['update_time_ratio']:.3f}")
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
