"""Speed of mmrl's Janus CFG sampler vs transformers' `generate(generation_mode="image")`, same model and batch.

Both sample the same number of images (prompts x G) from the same tiny `JanusForConditionalGeneration` with the
same guidance scale and temperature, measured in the same process, median over repeats after one warm-up each.
mmrl's time is the whole `JanusAdapter.sample` call (prompt building, CFG sampling with per-token log-probs, the
null-condition prompts, decoding to PIL images); transformers' is `generate` alone (ids only, no log-probs).
Goal (issue 3): mmrl tokens/s >= 0.9 x transformers tokens/s.

    python benchmarks/janus_sampling.py                    # 12x12 grid, 4 prompts x G=4, hidden 64
    python benchmarks/janus_sampling.py --smoke            # seconds
    python benchmarks/janus_sampling.py --device cuda --grid 24 --hidden 256 --out bench_results/janus.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROMPTS = ["a red square", "two blue circles above a green triangle", "a yellow circle left of a purple square",
           "three orange triangles", "a white circle", "a black square below a red circle", "a pink triangle",
           "two green squares"]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device: str, repeats: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, finishes in seconds")
    parser.add_argument("--grid", type=int, default=12, help="image tokens per side (T = grid^2)")
    parser.add_argument("--codebook", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--cfg-scale", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.grid, args.hidden, args.prompts, args.group_size, args.repeats = 6, 32, 2, 2, 3

    import torch

    from mmrl.models.janus import JanusAdapter

    torch.set_num_threads(args.threads)
    adapter = JanusAdapter.tiny(seed=0, grid=(args.grid, args.grid), codebook_size=args.codebook,
                                hidden_size=args.hidden, num_layers=args.layers, cfg_scale=args.cfg_scale)
    model = adapter.unwrapped_core.to(device=args.device, dtype=getattr(torch, args.dtype))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    g = args.group_size
    n, t = len(prompts) * g, adapter.ids.num_image_tokens

    from mmrl.models.base import left_pad

    ids, mask = left_pad([adapter.prompt_token_ids(p) for p in prompts], adapter.ids.pad, args.device)

    def run_transformers():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask.long(), generation_mode="image", do_sample=True,
                                 num_return_sequences=g, guidance_scale=args.cfg_scale, temperature=1.0)
        assert out.shape == (n, t), out.shape

    gen = torch.Generator(device=args.device).manual_seed(0)

    def run_mmrl():
        r = adapter.sample(prompts, g, generator=gen, temperature=1.0)
        assert r.response_ids.shape == (n, t)

    # interleave the two so that load from other processes hits both alike
    hf_times, mm_times = [], []
    for _ in range(args.repeats):
        hf_times += _timed(run_transformers, args.device, 1)
        mm_times += _timed(run_mmrl, args.device, 1)
    hf, mm = statistics.median(hf_times), statistics.median(mm_times)
    per_round = [h / m for h, m in zip(hf_times, mm_times)]
    import platform

    result = {
        "benchmark": "janus_sampling", "smoke": args.smoke,
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                        "load_average": os.getloadavg()},
        "transformers_times_s": hf_times, "mmrl_times_s": mm_times,
        "speed_ratio_rounds": {"min": min(per_round), "median": statistics.median(per_round), "max": max(per_round)},
        "device": args.device, "dtype": args.dtype, "grid": args.grid, "image_tokens": t, "codebook": args.codebook,
        "hidden": args.hidden, "layers": args.layers, "images": n, "cfg_scale": args.cfg_scale,
        "repeats": args.repeats, "threads": args.threads,
        "transformers_s": hf, "mmrl_s": mm,
        "transformers_tokens_per_s": n * t / hf, "mmrl_tokens_per_s": n * t / mm,
        "transformers_images_per_s": n / hf, "mmrl_images_per_s": n / mm,
        "speed_ratio": hf / mm,
        "goal": ">= 0.9",
        "goal_met": hf / mm >= 0.9,
    }
    print(f"Janus CFG sampling, {n} images x {t} tokens, hidden {args.hidden}, {args.layers} layers, "
          f"{args.device} {args.dtype}, median of {args.repeats}")
    print(f"  transformers generate: {result['transformers_tokens_per_s']:10.1f} tokens/s "
          f"{result['transformers_images_per_s']:8.2f} images/s")
    print(f"  mmrl sample:           {result['mmrl_tokens_per_s']:10.1f} tokens/s "
          f"{result['mmrl_images_per_s']:8.2f} images/s  (with log-probs and decoding)")
    print(f"  speed ratio mmrl / transformers: {result['speed_ratio']:.3f} [rounds {min(per_round):.3f}-{max(per_round):.3f}] "
          f"(goal >= 0.9: {'met' if result['goal_met'] else 'MISSED'})")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
