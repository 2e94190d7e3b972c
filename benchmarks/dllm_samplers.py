"""Tokens/s and forward passes of the masked-diffusion samplers on one fixed model, as ratios against LLaDA's
low-confidence sampler with steps = gen_length, all measured in this process on the same prompts.

Samplers (all greedy by default, the evaluation setting):

| name | what |
|---|---|
| low_conf_steps=len (baseline) | LLaDA semi-AR low-confidence remasking, one token per step |
| low_conf_steps=len/2 | two tokens per step (d1's training setting) |
| threshold | Fast-dLLM parallel decoding (top-1 + confidence >= threshold) |
| threshold+cache | the same over Fast-dLLM's prefix KV cache |
| threshold+dual_cache | the same over Fast-dLLM's dual KV cache (only the block is fed) |
| low_conf_len/2+cache | two tokens per step over the prefix cache (DMPO's default training sampler) |
| low_conf+cache / low_conf+dual_cache | the baseline's schedule over the prefix / dual cache: the cache alone |
| random_order | DMPO's ROAR sampler with exact log-probs (one token per step) |

The fixed model: without `--model`, a small bidirectional Llama is trained here for `--train-seconds` on 4x4 Sudoku
(prompt `Puzzle: <16 digits, 0 = blank>\\n`, response the 16 solution digits then EOS padding; split by solution
grid), because a random model is never confident and threshold decoding would be meaningless on it. Accuracy is
the fraction of blank cells filled correctly (d1's Sudoku metric). With `--model PATH` a saved
`MaskedDiffusionAdapter` is loaded instead (e.g. the tiny world's Sudoku model); `--task NAME` then takes the test
prompts of a registered task (`mmrl.data.tasks`) and reports the task's metric reward as accuracy.

    python benchmarks/dllm_samplers.py --save-model /tmp/sudoku_dllm   # ~2-3 min on 2 CPU cores
    python benchmarks/dllm_samplers.py --model /tmp/sudoku_dllm --task builtin_sudoku   # again, without training
    python benchmarks/dllm_samplers.py --smoke                        # seconds (random model, CI)
    python benchmarks/dllm_samplers.py --model runs/tiny/sudoku --task sudoku4 --gen-length 32 --out speeds.json
    python benchmarks/dllm_samplers.py --tiny-world sudoku4 --out speeds.json   # the tiny world's Sudoku base model

In a batch, the threshold samplers run as many forwards per block as the least confident row needs (rows that
finish early wait), so their saving shrinks with the batch; `--call-batch 1` feeds one prompt per call, the
setting of Fast-dLLM's throughput figures.

Agreement: the share of the decoded positions (the masked ones of an infilling canvas, else the whole span) where a
sampler's output equals the baseline's. The caches are approximate inside a block (the kept keys / values of the
prefix would change as the block fills, under bidirectional attention), so the cached low-confidence rows' agreement
is what the cache alone changes in the outputs of a trained model (issue 29: equal outputs).

Goal (issue 7, B3): threshold + prefix cache >= 4x the tokens/s of low-confidence with steps = length, at an accuracy
within 2 points; the JSON's `goal` entry says whether it holds.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BASELINE = "low_conf_steps=len"


# ------------------------------------------------------------------------------------------ built-in Sudoku task
@functools.lru_cache(maxsize=1)
def sudoku_grids() -> list[str]:
    """All 288 valid 4x4 Sudoku grids as 16-digit strings (rows, columns and 2x2 boxes hold 1-4 once)."""
    rows = list(itertools.permutations("1234"))
    out = []
    for r in itertools.product(rows, repeat=4):
        cols_ok = all(len({r[i][c] for i in range(4)}) == 4 for c in range(4))
        boxes_ok = all(len({r[i][c] for i in (bi, bi + 1) for c in (bj, bj + 1)}) == 4 for bi in (0, 2) for bj in (0, 2))
        if cols_ok and boxes_ok:
            out.append("".join("".join(x) for x in r))
    return out


def make_puzzle(solution: str, grids, rng: random.Random, blanks: int) -> str:
    """Blank up to `blanks` cells of `solution`, keeping the solution unique among `grids` ([288, 16] uint8 array)."""
    import numpy as np

    puzzle = np.frombuffer(solution.encode(), dtype=np.uint8).copy()
    zero = ord("0")
    for i in rng.sample(range(16), 16):
        if int((puzzle != zero).sum()) <= 16 - blanks:
            break
        old, puzzle[i] = puzzle[i], zero
        if int(((puzzle == zero) | (puzzle == grids)).all(-1).sum()) > 1:
            puzzle[i] = old
    return puzzle.tobytes().decode()


def sudoku_rows(n: int, grids: list[str], seed: int) -> list[dict]:
    import numpy as np

    arr = np.frombuffer("".join(sudoku_grids()).encode(), dtype=np.uint8).reshape(-1, 16)
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sol = rng.choice(grids)
        puz = make_puzzle(sol, arr, rng, rng.randint(6, 10))
        out.append({"prompt": f"Puzzle: {puz}\n", "puzzle": puz, "solution": sol})
    return out


def cell_accuracy(completions: list[str], rows: list[dict]) -> float:
    """d1's Sudoku metric over all puzzles: correct blank cells / blank cells (first 16 digits of the answer)."""
    good = total = 0
    for text, row in zip(completions, rows):
        digits = ("".join(ch for ch in text if ch.isdigit()) + "0" * 16)[:16]
        blanks = [i for i, ch in enumerate(row["puzzle"]) if ch == "0"]
        good += sum(digits[i] == row["solution"][i] for i in blanks)
        total += len(blanks)
    return good / max(total, 1)


def split_grids(seed: int) -> tuple[list[str], list[str]]:
    """(240 training grids, 48 held-out grids), shuffled with `seed`."""
    grids = list(sudoku_grids())
    random.Random(seed).shuffle(grids)
    return grids[:240], grids[240:]


def train_sudoku_model(seconds: float, gen_length: int, seed: int, hidden: int, layers: int):
    """A bidirectional Llama trained with the masked-diffusion loss on the built-in Sudoku task (test grids held out)."""
    import torch

    from mmrl.models.base import left_pad, right_pad
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter
    from mmrl.core.protocol import Rollout

    train_grids, test_grids = split_grids(seed)
    adapter = MaskedDiffusionAdapter.tiny(
        seed=seed, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, gen_length=gen_length, temperature=0.0,
    )
    tok, eos = adapter.tokenizer, adapter.eos_token_ids[0]
    opt = torch.optim.AdamW(adapter.model.parameters(), lr=3e-3, weight_decay=0.0)
    rng = random.Random(seed + 1)
    pool = sudoku_rows(4096, train_grids, seed + 2) if seconds > 0 else []
    adapter.model.train()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        rows = rng.sample(pool, 128)
        pid, pm = left_pad([tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows], adapter.pad_token_id)
        answers = [tok(r["solution"], add_special_tokens=False)["input_ids"] + [eos] * (gen_length - 16) for r in rows]
        rid, rm = right_pad(answers, eos)
        batch = Rollout(prompt_ids=pid, prompt_mask=pm, response_ids=rid, response_mask=rm, group_size=1,
                        prompts=[r["prompt"] for r in rows], completions=[""] * len(rows))
        noised = adapter.forward_noise(batch, 1, torch.Generator().manual_seed(steps))  # one copy, rate U(0.1, 1)
        lp = adapter.denoise_logprob(noised)  # [R, N, T]
        loss = -(lp.sum(-1) / noised.n_masked).mean()  # masked CE per masked token (DMPO's normalisation)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    adapter.model.eval()
    return adapter, test_grids, steps


# ------------------------------------------------------------------------------------------ measurement
def sampler_table(gen_length: int, block_length: int, threshold: float) -> dict[str, dict]:
    half = max(1, gen_length // 2)
    return {
        BASELINE: dict(sampler="low_confidence", steps=gen_length),
        "low_conf_steps=len/2": dict(sampler="low_confidence", steps=half),
        "threshold": dict(sampler="threshold", threshold=threshold),
        "threshold+cache": dict(sampler="threshold_cache", threshold=threshold),
        "threshold+dual_cache": dict(sampler="threshold", threshold=threshold, cache="dual"),
        "low_conf_len/2+cache": dict(sampler="low_confidence", steps=half, cache="prefix"),
        "low_conf+cache": dict(sampler="low_confidence", steps=gen_length, cache="prefix"),
        "low_conf+dual_cache": dict(sampler="low_confidence", steps=gen_length, cache="dual"),
        "random_order": dict(sampler="random_order", steps=gen_length),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="random tiny model, small batch: seconds (CI)")
    ap.add_argument("--model", default=None, help="a saved MaskedDiffusionAdapter directory instead of the built-in model")
    ap.add_argument("--task", default=None, help="with --model: builtin_sudoku, or a task name of mmrl.data.tasks whose test "
                    "prompts and metric to use")
    ap.add_argument("--dataset-path", default=None, help="with --task: passed to mmrl.data.tasks.load_task")
    ap.add_argument("--tiny-world", default=None, help="the tiny world's base model of this task (mmrl.tiny_world.models."
                    "load_base_policy), scored on the task's test prompts")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--call-batch", type=int, default=None, help="rows per sampler call (default: the whole batch at once; "
                    "1 = one prompt at a time, the latency setting of Fast-dLLM's throughput figures)")
    ap.add_argument("--gen-length", type=int, default=24)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--train-seconds", type=float, default=90.0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--save-model", default=None, help="save the built-in trained model here (reuse it with --model)")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.gen_length, args.block_length, args.repeats, args.train_seconds = 8, 16, 8, 1, 0.0

    import torch

    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

    torch.set_num_threads(args.threads)
    info: dict = {}
    if args.tiny_world:
        from mmrl.tiny_world.models import load_base_policy, spec_for

        adapter = load_base_policy(args.tiny_world, family="masked_diffusion")
        adapter.model.to(args.device)
        # the span and blocks the model was built for, unless given
        gen_defaults = getattr(adapter, "generation_defaults", {})
        if "--gen-length" not in sys.argv and gen_defaults.get("gen_length"):
            args.gen_length = int(gen_defaults["gen_length"])
        if "--block-length" not in sys.argv:
            args.block_length = int(gen_defaults.get("block_length") or args.gen_length)
        # the base's own task (countdown3-md is trained on countdown3), unless --task names another
        rows, score = task_rows(args.task or spec_for(args.tiny_world).task, args.batch, args.seed, args.dataset_path)
        info["model"] = f"tiny-world:{args.tiny_world}"
    elif args.model:
        adapter = MaskedDiffusionAdapter.from_pretrained(args.model, device=args.device)
        rows, score = task_rows(args.task, args.batch, args.seed, args.dataset_path)
        info["model"] = args.model
    else:
        adapter, test_grids, steps = train_sudoku_model(args.train_seconds, args.gen_length, args.seed, args.hidden, args.layers)
        adapter.model.to(args.device)
        if args.save_model:
            adapter.save_pretrained(args.save_model)
        rows = sudoku_rows(args.batch, test_grids, args.seed + 7)
        score = lambda completions, rows: cell_accuracy(completions, rows)  # noqa: E731
        info.update(model=f"built-in Sudoku Llama (hidden {args.hidden}, {args.layers} layers)", train_steps=steps,
                    train_seconds=args.train_seconds)
    pid, pm = adapter.encode_prompts([r["prompt"] for r in rows])
    # infilling tasks (the tiny world's sudoku4: the puzzle is the response canvas, its givens kept): every sampler
    # starts from the task's response templates, as the trainer's rollouts do
    init = adapter.response_templates([r["prompt"] for r in rows], args.gen_length)  # [n, T] or None
    info["infilling"] = init is not None
    if init is not None:
        info["positions_to_decode_mean"] = float((init == adapter.mask_token_id).sum(-1).float().mean())
    n = pid.shape[0]
    seeds = list(range(n))
    from mmrl.models.base import mask_through_first_eos

    table = {
        name: dict(opts, gen_length=args.gen_length, block_length=args.block_length, temperature=args.temperature)
        for name, opts in sampler_table(args.gen_length, args.block_length, args.threshold).items()
    }

    def generate(opts):
        """All rows, `--call-batch` rows per sampler call (forward passes and positions fed add up over calls)."""
        k = args.call_batch or n
        parts = [adapter.generate(pid[i:i + k], pm[i:i + k], seeds=seeds[i:i + k], init=None if init is None else init[i:i + k],
                                  **opts) for i in range(0, n, k)]
        if len(parts) == 1:
            return parts[0]
        return {"ids": torch.cat([q["ids"] for q in parts]), "nfe": sum(q["nfe"] for q in parts),
                "tokens_fed": sum(q["tokens_fed"] for q in parts)}

    def run(opts):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = generate(opts)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    outs = {name: run(opts)[0] for name, opts in table.items()}  # warm-up, and the outputs to score
    times: dict[str, list[float]] = {name: [] for name in table}
    for _ in range(args.repeats):  # round robin, so that every sampler sees the same machine load
        for name, opts in table.items():
            times[name].append(run(opts)[1])
    results: dict[str, dict] = {}
    base_resp = outs[BASELINE]["ids"][:, pid.shape[1]:]  # [n, T]
    decoded = torch.ones_like(base_resp, dtype=torch.bool) if init is None else (init == adapter.mask_token_id)  # [n, T]
    for name, out in outs.items():
        resp = out["ids"][:, pid.shape[1]:]
        valid = mask_through_first_eos(resp, adapter.eos_token_ids)
        completions = [adapter.tokenizer.decode(r[m].tolist(), skip_special_tokens=True) for r, m in zip(resp, valid)]
        sec = statistics.median(times[name])
        results[name] = {
            "seconds": sec,
            "seconds_spread": {"min": min(times[name]), "max": max(times[name]), "values": times[name]},
            "tokens_per_s": n * args.gen_length / sec,
            "forward_passes": out["nfe"],
            "positions_fed": out["tokens_fed"],
            "accuracy": score(completions, rows) if score is not None else None,
            "agreement": float((resp == base_resp)[decoded].float().mean()),
        }
    base = results[BASELINE]
    for r in results.values():
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        r["forward_ratio"] = base["forward_passes"] / r["forward_passes"]
        r["fed_ratio"] = base["positions_fed"] / r["positions_fed"]
    print(f"model: {info['model']}" + (f", trained {info['train_steps']} steps" if "train_steps" in info else ""))
    print(f"batch {n} ({args.call_batch or n} rows per call), prompt width {pid.shape[1]}, gen_length {args.gen_length}, block_length {args.block_length}, "
          f"threshold {args.threshold}, temperature {args.temperature}, {args.threads} threads, {args.device}")
    print(f"{'sampler':22s} {'tokens/s':>10s} {'speedup':>8s} {'forwards':>9s} {'fwd ratio':>9s} {'fed ratio':>9s} {'accuracy':>9s} "
          f"{'agreement':>9s}")
    for name, r in results.items():
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        print(f"{name:22s} {r['tokens_per_s']:10.0f} {r['speedup']:7.2f}x {r['forward_passes']:9d} {r['forward_ratio']:8.2f}x "
              f"{r['fed_ratio']:8.2f}x {acc:>9s} {r['agreement']:9.3f}")
    print("speedup: tokens/s vs the baseline; fwd ratio: baseline forwards / forwards; fed ratio: baseline positions fed "
          "through the model / positions fed (machine-independent cost); agreement: share of decoded positions equal "
          "to the baseline's output")
    fast = results["threshold+cache"]
    goal = {"speedup": fast["speedup"], "accuracy_diff": None if base["accuracy"] is None else fast["accuracy"] - base["accuracy"]}
    goal["met"] = goal["speedup"] >= 4.0 and goal["accuracy_diff"] is not None and abs(goal["accuracy_diff"]) <= 0.02
    print(f"goal (issue 7): threshold+cache >= 4x tokens/s of {BASELINE} at accuracy within 2 points: speedup "
          f"{goal['speedup']:.2f}x, accuracy difference "
          + ("-" if goal["accuracy_diff"] is None else f"{100 * goal['accuracy_diff']:+.1f} points")
          + f": {'met' if goal['met'] else 'MISSED'}")
    if args.out:
        import platform

        env = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
               "load_average": os.getloadavg()}
        with open(args.out, "w") as f:
            json.dump({"benchmark": "dllm_samplers", "smoke": args.smoke, "environment": env, "args": vars(args), "info": info,
                       "results": results, "goal": goal}, f, indent=2)


def task_rows(task: str | None, n: int, seed: int, dataset_path: str | None = None):
    """(test rows, scorer) of a task: `builtin_sudoku` (this file's held-out puzzles, e.g. for a model saved with
    `--save-model`), a task name of `mmrl.data.tasks`, or None (built-in Sudoku prompts, no accuracy)."""
    if task is None:
        return sudoku_rows(n, list(sudoku_grids()), seed), None
    if task == "builtin_sudoku":
        return sudoku_rows(n, split_grids(seed)[1], seed + 7), cell_accuracy
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world import register

    register()  # the tiny world's tasks (sudoku4, countdown3) beside the engine's
    from mmrl.rewards import REWARDS

    t = load_task(task, dataset_path, seed=seed)
    rows = t.test[:n]
    reward = REWARDS[t.metric]

    def score(completions, rows):
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
        vals = [v for v in reward([r["prompt"] for r in rows], completions, **columns) if v is not None]
        return sum(vals) / max(len(vals), 1)

    return rows, score


if __name__ == "__main__":
    main()
