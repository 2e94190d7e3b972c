"""Speed of mmrl's masked_image (aMUSEd) sampler vs diffusers' `AmusedPipeline`, same model, prompts and steps.

Both sample the same images (prompts x G) from the same tiny random aMUSEd (`UVit2DModel` + `VQModel` + CLIP), with
the same guidance scale and number of steps, measured in the same process, interleaved, median over repeats after
a warm-up each. mmrl's time is the whole `MaskedImageAdapter.sample` call (per-row generators, the reveal order and
per-step log-probs, the negative-prompt ids, VQ decoding to PIL images); the pipeline's is `__call__` with
`output_type="pil"` for the same number of images (its batch-wide generator, no log-probs).

    python benchmarks/amused_sampling.py                    # 8x8 tokens, 4 prompts x G=4, hidden 64
    python benchmarks/amused_sampling.py --smoke            # seconds
    python benchmarks/amused_sampling.py --device cuda --grid 16 --hidden 512 --layers 8 --codebook 8192 --steps 12
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PROMPTS = ["a red square", "two blue circles", "a yellow circle", "three orange triangles"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, finishes in seconds")
    parser.add_argument("--grid", type=int, default=8, help="image tokens per side (T = grid^2)")
    parser.add_argument("--codebook", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--cfg-scale", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.grid, args.hidden, args.layers, args.steps, args.prompts, args.group_size, args.repeats = 4, 32, 1, 4, 2, 2, 2

    import torch
    from diffusers import AmusedPipeline

    from mmrl.models.masked_image import MaskedImageAdapter, tiny_amused_components

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    words = sorted({w for p in PROMPTS for w in p.split()})
    parts = tiny_amused_components(seed=0, words=words, grid=args.grid, codebook_size=args.codebook, hidden_size=args.hidden,
                                   num_hidden_layers=args.layers, model_max_length=16)
    for k in ("transformer", "vqvae", "text_encoder"):
        parts[k].to(args.device)
    pipe = AmusedPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    policy = MaskedImageAdapter(parts["transformer"], parts["vqvae"], parts["text_encoder"], parts["tokenizer"],
                                mask_token_id=parts["scheduler"].config.mask_token_id, num_steps=args.steps,
                                cfg_scale=args.cfg_scale)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    g = args.group_size
    n, t = len(prompts) * g, args.grid ** 2

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        start = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - start

    def run_pipeline():
        out = pipe(prompts, num_inference_steps=args.steps, guidance_scale=args.cfg_scale, num_images_per_prompt=g,
                   generator=torch.Generator().manual_seed(0))
        assert len(out.images) == n

    def run_mmrl():
        r = policy.sample(prompts, g, generator=torch.Generator().manual_seed(0))
        assert r.response_ids.shape == (n, t)

    run_pipeline(), run_mmrl()  # warm-up
    pipe_times, mm_times = [], []
    for _ in range(args.repeats):
        pipe_times.append(timed(run_pipeline))
        mm_times.append(timed(run_mmrl))
    hp, mm = statistics.median(pipe_times), statistics.median(mm_times)
    import platform

    result = {
        "benchmark": "amused_sampling", "smoke": args.smoke,
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count()},
        "pipeline_times_s": pipe_times, "mmrl_times_s": mm_times, "device": args.device, "grid": args.grid,
        "image_tokens": t, "codebook": args.codebook, "hidden": args.hidden, "layers": args.layers, "steps": args.steps,
        "images": n, "cfg_scale": args.cfg_scale, "repeats": args.repeats, "threads": args.threads,
        "pipeline_s": hp, "mmrl_s": mm, "pipeline_images_per_s": n / hp, "mmrl_images_per_s": n / mm, "speed_ratio": hp / mm,
    }
    print(f"aMUSEd sampling, {n} images x {t} tokens, {args.steps} steps, hidden {args.hidden}, {args.layers} layers, "
          f"{args.device}, median of {args.repeats}")
    print(f"  diffusers AmusedPipeline: {result['pipeline_images_per_s']:8.2f} images/s")
    print(f"  mmrl sample:              {result['mmrl_images_per_s']:8.2f} images/s  (per-row generators, log-probs, order)")
    print(f"  speed ratio mmrl / pipeline: {result['speed_ratio']:.3f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
