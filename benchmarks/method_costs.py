"""B1 step time and B2 peak memory of one `Trainer` optimizer step per method, as ratios against GRPO measured in the
same process on the same model, prompts, seeds and batch.

Every configuration is a real `mmrl.training.trainer.Trainer` (policy object, prompt list, reward callable) running one
optimizer step per rollout (`num_iterations = 1`, dynamic sampling off, so every method does the same rollout work).
The configurations' steps are interleaved round-robin (one warm-up step each, then `--repeats` rounds), and each step
is split with the trainer's own timers into

- rollout: `perf/rollout_time` (sampling G responses per prompt, with rollout-time log-probs);
- reward: `perf/reward_time`;
- buffer: `perf/buffer_time` (no-grad forwards: behaviour log-probs, reference log-probs, DGPO statistics, DMPO
  likelihoods and weights);
- update: the rest of `perf/step_time` (the gradient forwards and backwards over the micro-batches, GCPO's
  negative-condition forward, clipping and the optimizer step).

Families and methods:

| family | methods | baseline |
|---|---|---|
| causal_lm (Qwen2, 28M parameters, vocab 32k, 256 response tokens, 16 responses) | GRPO beta 0, GRPO beta 0.04, GCPO, DGPO, DMPO | GRPO |
| masked_diffusion (bidirectional Llama, vocab 32k, 64 generated tokens, 16 responses) | GRPO beta 0 (d1 mean-field), diffu-GRPO (beta 0.04), DMPO (WDCE, R = 4) | GRPO |

DGPO scores the rollout policy's distributions against the reference, so it needs the reference forward that a GRPO
with a KL term (beta > 0, DeepSeekMath, verl) also runs: DGPO / GRPO(beta 0.04) is the same-forwards ratio (the main
one), DGPO / GRPO(beta 0) is reported too. DMPO is timed at one optimizer step per rollout like the others; its
amortised step at the buffer reuse it is run with (F = 8, the authors' default) is update + (rollout + reward +
buffer) / 8. On a causal LM `forward_noise` is the identity, so DMPO's WDCE is the weighted sequence NLL (R = 1).

Peak memory (B2): every configuration runs again in a fresh process (a fork server that has only imported the
libraries), one warm-up step, then the peak over `--memory-steps` steps: on CPU the resident-set high-water mark
(glibc returns freed blocks above 128 KiB to the system there, so the resident set tracks live memory), on CUDA
`max_memory_allocated`. `peak` is the whole process (weights, reference, optimizer state, activations), `extra` the
part above the memory in use before the measured step.

    python benchmarks/method_costs.py                          # full size, both families (~15 min on 2 CPU cores)
    python benchmarks/method_costs.py --smoke --out /tmp/b1.json   # seconds (CI)
    python benchmarks/method_costs.py --family causal_lm --methods grpo_beta0,dgpo --repeats 3
    python benchmarks/method_costs.py --device cuda --hidden 896 --layers 24 --vocab 151936   # one GPU
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH_PROMPTS,
    PeakMemory,
    char_sum_reward,
    environment,
    n_params,
    paired_ratio,
    print_table,
    set_threads,
    summarize,
    write_json,
)

METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "causal_lm": {
        "grpo_beta0": {"method": "grpo", "beta": 0.0},
        "grpo_beta0.04": {"method": "grpo", "beta": 0.04},
        "gcpo": {"method": "gcpo"},
        "gcpo_batched": {"method": "gcpo", "gcpo_negative_forward": "batched"},
        "dgpo": {"method": "dgpo"},
        "dmpo": {"method": "dmpo", "dmpo_num_copies": 4},
    },
    "masked_diffusion": {
        "grpo_beta0": {"method": "grpo", "beta": 0.0},
        "diffu_grpo": {"method": "diffu_grpo"},
        "dmpo": {"method": "dmpo", "dmpo_num_copies": 4},
    },
}
"""Per family: configuration name -> `TrainConfig` overrides (beside the shared batch geometry)."""

RATIOS: dict[str, list[tuple[str, str, str]]] = {
    "causal_lm": [
        ("gcpo", "grpo_beta0", "GCPO / GRPO (beta 0; GCPO has no KL)"),
        ("gcpo_batched", "grpo_beta0", "GCPO, negative batched into the gradient forward / GRPO (beta 0)"),
        ("dgpo", "grpo_beta0.04", "DGPO / GRPO beta 0.04 (same forwards: main)"),
        ("dgpo", "grpo_beta0", "DGPO / GRPO beta 0"),
        ("dmpo", "grpo_beta0", "DMPO / GRPO beta 0"),
        ("grpo_beta0.04", "grpo_beta0", "GRPO beta 0.04 / beta 0"),
    ],
    "masked_diffusion": [
        ("dmpo", "grpo_beta0", "DMPO (WDCE, R=4) / GRPO beta 0"),
        ("diffu_grpo", "grpo_beta0", "diffu-GRPO (beta 0.04) / GRPO beta 0"),
        ("dmpo", "diffu_grpo", "DMPO (WDCE, R=4) / diffu-GRPO"),
    ],
}
"""(numerator, denominator, label) of the ratio table."""

GOALS = {
    ("causal_lm", "gcpo", "grpo_beta0"): {"step_time": 1.05, "peak_memory": 1.05},
    ("causal_lm", "dgpo", "grpo_beta0.04"): {"step_time": 1.03, "peak_memory": 1.05},
    ("masked_diffusion", "dmpo", "diffu_grpo"): {"step_time": 1.2, "peak_memory": 1.2},
}
"""Issues 7 and 29's goals (ratio <= value; GCPO's step goal tightened from 1.40 to 1.05 in issue 29)."""

DMPO_REUSE = 8
"""The buffer reuse F DMPO runs with (authors' default), for the amortised step time."""


# ------------------------------------------------------------------------------------------------ sizes
def sizes(args: argparse.Namespace, family: str) -> dict[str, Any]:
    """Model and batch geometry of a family."""
    if family == "causal_lm":
        return dict(vocab=args.vocab, hidden=args.hidden, layers=args.layers, tokens=args.tokens, responses=args.responses,
                    group=args.group, micro_batch=args.micro_batch)
    return dict(vocab=args.vocab, hidden=args.dllm_hidden, layers=args.dllm_layers, tokens=args.dllm_tokens,
                block=args.dllm_block, responses=args.responses, group=args.group, micro_batch=args.micro_batch)


def build_policy(family: str, sz: dict[str, Any], seed: int = 0):
    """The policy of a family at size `sz`, with weights depending only on `seed`."""
    import torch

    from _common import build_qwen2, qwen2_config, wide_tokenizer

    tok = wide_tokenizer(sz["vocab"])
    if family == "causal_lm":
        from mmrl.models.causal_lm import CausalLMAdapter

        model = build_qwen2(qwen2_config(vocab_size=sz["vocab"], hidden=sz["hidden"], layers=sz["layers"], tokenizer=tok), seed)
        return CausalLMAdapter(model, tok)
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

    h = sz["hidden"]
    heads = max(1, h // 64)
    config = LlamaConfig(vocab_size=sz["vocab"], hidden_size=h, intermediate_size=(8 * h // 3 // 32) * 32, num_hidden_layers=sz["layers"],
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=False, attn_implementation="sdpa")
    config.is_causal = False
    config.mask_token_id = tok.mask_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    return MaskedDiffusionAdapter(model, tok)


def train_config(family: str, name: str, sz: dict[str, Any], out_dir: str, seed: int = 0, extra: dict | None = None):
    from mmrl.config.train_config import load_config

    values: dict[str, Any] = dict(
        family=family, num_generations=sz["group"], per_device_train_batch_size=sz["micro_batch"],
        gradient_accumulation_steps=max(1, sz["responses"] // sz["micro_batch"]), max_completion_length=sz["tokens"],
        num_iterations=1, dynamic_sampling=False, overlong_penalty=False, learning_rate=1e-6, temperature=1.0,
        max_steps=10**6, save_steps=0, report_to=["jsonl"], progress_bar=False, seed=seed, output_dir=out_dir,
    )
    if family == "masked_diffusion":
        # d1's training sampler (two tokens per step, semi-AR blocks) over Fast-dLLM's prefix cache
        values.update(block_length=sz["block"], diffusion_steps=sz["tokens"] // 2, diffusion_cache="prefix")
    values.update(METHODS[family][name])
    values.update(extra or {})
    return load_config(None, values)


def make_trainer(family: str, name: str, sz: dict[str, Any], out_root: str, seed: int = 0, extra: dict | None = None,
                 tag: str = ""):
    """A real `Trainer` whose checkpoint writing is switched off (this benchmark times steps, not disk); `extra`:
    further `TrainConfig` overrides."""
    from mmrl.training.trainer import Trainer

    cfg = train_config(family, name, sz, str(Path(out_root) / f"{family}_{name}{tag}"), seed, extra)
    rows = [{"prompt": p} for p in BENCH_PROMPTS]
    trainer = Trainer(cfg, policy=build_policy(family, sz, seed), dataset=rows, reward_funcs=[char_sum_reward])
    trainer.save = lambda: None  # no checkpoints: they would only add disk time between the timed steps
    trainer.save_model = lambda *a, **k: None  # nor the final model each train() call would write
    return trainer


def one_step(trainer) -> dict[str, float]:
    """Run exactly one more optimizer step through `Trainer.train` and split its time."""
    trainer.cfg.max_steps = trainer.step + 1
    c0 = time.process_time()  # CPU time beside wall time: on a shared machine it is what the other jobs cannot inflate
    m = trainer.train()
    cpu = time.process_time() - c0
    rollout, reward, buffer = m["perf/rollout_time"], m["perf/reward_time"], m["perf/buffer_time"]
    step = m["perf/step_time"]
    return {"step": step, "rollout": rollout, "reward": reward, "buffer": buffer, "update": step - rollout - reward - buffer,
            "train": step - rollout - reward, "cpu": cpu}


# ------------------------------------------------------------------------------------------------ memory (B2)
def memory_child(family: str, name: str, sz: dict[str, Any], steps: int, threads: int, device: str) -> dict[str, Any]:
    """Runs in a fresh process: one warm-up step (optimizer state allocated), then the peak over `steps` steps."""
    set_threads(threads, device)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(family, name, sz, tmp)
        one_step(trainer)
        with PeakMemory(device) as pm:
            for _ in range(steps):
                one_step(trainer)
    return pm.as_dict()


def _memory_worker(queue, *a) -> None:
    try:
        queue.put(("ok", memory_child(*a)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback

        queue.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def measure_memory(family: str, names: list[str], sz: dict[str, Any], steps: int, threads: int, device: str) -> dict[str, dict]:
    """Peak memory of every configuration, each in its own process forked from a server that only imported."""
    if device == "cpu":
        # freed blocks above 128 KiB go back to the system at once, so the resident set tracks live memory (fixed
        # thresholds also switch off glibc's dynamic mmap threshold, which would keep freed activations cached)
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
        os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", "131072")
    ctx = mp.get_context("forkserver")
    # everything a child would otherwise import on its first step (the server imports only: it runs no torch op, so
    # forking it is safe)
    ctx.set_forkserver_preload(["torch", "transformers", "accelerate", "mmrl.training.trainer", "mmrl.models.causal_lm",
                                "mmrl.models.masked_diffusion", "mmrl.rewards", "mmrl.models.tokenizers",
                                "transformers.models.qwen2.modeling_qwen2", "transformers.models.llama.modeling_llama",
                                "torch.utils.tensorboard", "tqdm.auto", "_common"])
    out = {}
    for name in names:
        q = ctx.Queue()
        p = ctx.Process(target=_memory_worker, args=(q, family, name, sz, steps, threads, device))
        p.start()
        status, value = "error", "the process died without an answer"
        while True:
            try:
                status, value = q.get(timeout=1.0)
                break
            except queue.Empty:
                if not p.is_alive():
                    value += f" (exit code {p.exitcode})"
                    break
        p.join()
        if status != "ok":
            raise RuntimeError(f"memory measurement of {family}/{name} failed: {value}")
        out[name] = value
    return out


# ------------------------------------------------------------------------------------------------ timing (B1)
def measure_times(family: str, names: list[str], sz: dict[str, Any], repeats: int, warmup: int) -> tuple[dict, dict]:
    """Round-robin steps of every configuration in this process; returns (per-name lists of splits, model info)."""
    from tqdm.auto import tqdm

    with tempfile.TemporaryDirectory() as tmp:
        trainers = {name: make_trainer(family, name, sz, tmp) for name in names}
        info = {"params": n_params(trainers[names[0]].policy.unwrapped)}
        splits: dict[str, dict[str, list[float]]] = {n: {} for n in names}
        total = (warmup + repeats) * len(names)
        with tqdm(total=total, desc=f"B1 {family}", unit="step", leave=False) as bar:
            for r in range(warmup + repeats):
                order = names[r % len(names):] + names[: r % len(names)]  # rotate: nobody always runs first
                for name in order:
                    s = one_step(trainers[name])
                    bar.update(1)
                    if r >= warmup:
                        for k, v in s.items():
                            splits[name].setdefault(k, []).append(v)
        del trainers
    return splits, info


# ------------------------------------------------------------------------------------------------ main
def run_family(family: str, args: argparse.Namespace) -> dict[str, Any]:
    sz = sizes(args, family)
    names = [n for n in METHODS[family] if not args.methods or n in args.methods]
    t0 = time.perf_counter()
    splits, info = measure_times(family, names, sz, args.repeats, args.warmup)
    timing_s = time.perf_counter() - t0
    memory = measure_memory(family, names, sz, args.memory_steps, args.threads, args.device) if args.memory else {}
    methods = {}
    for name in names:
        entry = {k: summarize(v) for k, v in splits[name].items()}
        entry["config"] = METHODS[family][name]
        if name in memory:
            entry["memory"] = memory[name]
        if METHODS[family][name]["method"] == "dmpo":
            amortised = [u + (ro + rw + b) / DMPO_REUSE for u, ro, rw, b in
                         zip(splits[name]["update"], splits[name]["rollout"], splits[name]["reward"], splits[name]["buffer"])]
            entry["step_amortised_F8"] = summarize(amortised)
        methods[name] = entry
    ratios = []
    for num, den, label in RATIOS[family]:
        if num not in splits or den not in splits:
            continue
        row: dict[str, Any] = {"numerator": num, "denominator": den, "label": label,
                               "step_time": paired_ratio(splits[num]["step"], splits[den]["step"]),
                               "train_time": paired_ratio(splits[num]["train"], splits[den]["train"]),
                               "cpu_step_time": paired_ratio(splits[num]["cpu"], splits[den]["cpu"]),
                               "update_time": paired_ratio(splits[num]["update"], splits[den]["update"])}
        if num in memory and den in memory:
            row["peak_memory"] = memory[num]["peak_bytes"] / memory[den]["peak_bytes"]
            row["extra_memory"] = memory[num]["extra_bytes"] / max(1, memory[den]["extra_bytes"])
        goal = GOALS.get((family, num, den))
        if goal:
            row["goal"] = goal
            values = {k: row[k]["ratio"] if isinstance(row[k], dict) else row[k] for k in goal if k in row}
            row["goal_met"] = {k: values[k] is not None and values[k] <= v for k, v in goal.items() if k in values}
        ratios.append(row)
    return {"sizes": sz, "params": info["params"], "timing_seconds": timing_s, "methods": methods, "ratios": ratios}


def print_family(family: str, res: dict[str, Any]) -> None:
    sz = res["sizes"]
    print(f"\n== {family}: {res['params'] / 1e6:.1f}M parameters, vocab {sz['vocab']}, {sz['tokens']} response tokens, "
          f"{sz['responses']} responses (G={sz['group']}, micro-batch {sz['micro_batch']}); median [min-max] seconds per step")
    rows = []
    for name, e in res["methods"].items():
        row = {"method": name}
        for k in ("step", "rollout", "buffer", "update"):
            row[k] = f"{e[k]['median']:.2f} [{e[k]['min']:.2f}-{e[k]['max']:.2f}]"
        if "memory" in e:
            row["peak MiB"] = f"{e['memory']['peak_bytes'] / 2**20:.0f}"
            row["extra MiB"] = f"{e['memory']['extra_bytes'] / 2**20:.0f}"
        if "step_amortised_F8" in e:
            row["step at F=8"] = f"{e['step_amortised_F8']['median']:.2f}"
        rows.append(row)
    cols = [("method", "method"), ("step", "step"), ("rollout", "rollout"), ("buffer", "buffer"), ("update", "update"),
            ("peak MiB", "peak MiB"), ("extra MiB", "extra MiB"), ("step at F=8", "step at F=8")]
    print_table(rows, cols)
    print("\nratios (median of each / median of baseline; per-round paired ratios in brackets)")
    rows = []
    for r in res["ratios"]:
        st, tr = r["step_time"], r["train_time"]
        row = {"ratio": r["label"], "step": f"{st['ratio']:.3f} [{st['round_min']:.3f}-{st['round_max']:.3f}]",
               "train": f"{tr['ratio']:.3f} [{tr['round_min']:.3f}-{tr['round_max']:.3f}]"}
        if "peak_memory" in r:
            row["peak mem"] = f"{r['peak_memory']:.3f}"
            row["extra mem"] = f"{r['extra_memory']:.3f}"
        if "goal" in r:
            row["goal"] = ", ".join(f"{k} <= {v}: " + ({True: "met", False: "MISSED"}.get(r["goal_met"].get(k), "not measured"))
                                    for k, v in r["goal"].items())
        rows.append(row)
    print_table(rows, [("ratio", "ratio"), ("step", "step time"), ("train", "train time (no rollout)"),
                       ("peak mem", "peak mem"), ("extra mem", "extra mem"), ("goal", "goal (issues 7, 29)")])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny models, one round: seconds (CI)")
    ap.add_argument("--family", default="all", choices=["all", "causal_lm", "masked_diffusion"])
    ap.add_argument("--methods", default="", help="comma-separated configuration names (default: all of the family)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    ap.add_argument("--memory-steps", type=int, default=1, help="measured steps per memory process")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip B2")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="causal LM response tokens")
    ap.add_argument("--dllm-hidden", type=int, default=256)
    ap.add_argument("--dllm-layers", type=int, default=4)
    ap.add_argument("--dllm-tokens", type=int, default=64, help="masked diffusion generated span")
    ap.add_argument("--dllm-block", type=int, default=32)
    ap.add_argument("--responses", type=int, default=16, help="responses per optimizer step (N)")
    ap.add_argument("--group", type=int, default=8, help="responses per prompt (G)")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.vocab, args.hidden, args.layers, args.tokens = 512, 32, 1, 8
        args.dllm_hidden, args.dllm_layers, args.dllm_tokens, args.dllm_block = 32, 1, 8, 8
        args.responses, args.group, args.micro_batch, args.repeats, args.warmup = 4, 2, 2, 1, 1
    args.methods = [m for m in args.methods.split(",") if m]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_threads(args.threads, args.device)
    families = ["causal_lm", "masked_diffusion"] if args.family == "all" else [args.family]
    result: dict[str, Any] = {"benchmark": "method_costs", "smoke": args.smoke, "environment": environment(args.device),
                              "repeats": args.repeats, "warmup": args.warmup, "memory_steps": args.memory_steps,
                              "dmpo_reuse_F": DMPO_REUSE, "families": {}}
    for family in families:
        res = run_family(family, args)
        result["families"][family] = res
        print_family(family, res)
        write_json(args.out, result)  # after each family, so a long run leaves its first half behind
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
