"""Issue 29: Fast-dLLM's prefix and dual KV caches on a LLaDA checkpoint loaded into the native class
(`models/dllm_native.py`): tokens/s of cached against uncached decoding, measured in this process, interleaved.

A scaled-down LLaDA configuration (LLaDA-8B's architecture and vocabulary: Llama blocks, RMSNorm, SwiGLU, RoPE
theta 500000, 126464 tokens; fewer and narrower layers) with random weights is written in LLaDA's checkpoint layout
(config.json with `model_type: llada`, `model.transformer.*` tensor names, safetensors), loaded back with
`MaskedDiffusionAdapter`'s native path (no remote code), and decoded with LLaDA's low-confidence sampler (one token
per step, semi-AR blocks: LLaDA's evaluation setting) and Fast-dLLM's threshold sampler, each uncached, over the prefix
cache and over the dual cache. Times are process CPU time on a CPU (wall time on a GPU). Agreement: the fraction of generated tokens equal to the uncached sampler's (the caches
are approximate inside a block: bidirectional attention would update the kept keys / values; a random model's near-
uniform logits make this the worst case).

    python benchmarks/llada_cache.py --threads 1 --out benchmarks/results/llada_cache.json
    python benchmarks/llada_cache.py --smoke --out /tmp/llada_cache.json
    python benchmarks/llada_cache.py --device cuda --hidden 2048 --layers 16 --gen-length 256 --block-length 32

Goal (issue 29): cached >= 2x the uncached tokens/s on a compute-bound size.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import environment, paired_ratio, print_table, set_threads, summarize, sync, write_json  # noqa: E402

LLADA_8B = {"model_type": "llada", "architectures": ["LLaDAModelLM"], "activation_type": "silu", "block_type": "llama",
            "rope": True, "rope_theta": 500000.0, "layer_norm_type": "rms", "rms_norm_eps": 1e-5, "weight_tying": False,
            "include_bias": False, "include_qkv_bias": False, "vocab_size": 126464, "embedding_size": 126464,
            "mask_token_id": 126336, "eos_token_id": 126081, "pad_token_id": 126081, "max_sequence_length": 4096}
"""The fields of GSAI-ML/LLaDA-8B-Instruct's config.json this benchmark keeps (d_model 4096, 32 layers, 32 heads,
mlp_hidden_size 12288 there; scaled down by --hidden / --layers here)."""

GOAL = 2.0

SAMPLERS = {
    "low_conf": {"sampler": "low_confidence", "cache": None},
    "low_conf+prefix": {"sampler": "low_confidence", "cache": "prefix"},
    "low_conf+dual": {"sampler": "low_confidence", "cache": "dual"},
    "threshold": {"sampler": "threshold", "cache": None},
    "threshold+prefix": {"sampler": "threshold", "cache": "prefix"},
    "threshold+dual": {"sampler": "threshold", "cache": "dual"},
}
"""name -> generation options; each cached one is compared with the uncached one of its sampler."""


def llada_checkpoint(out: Path, hidden: int, layers: int, seed: int) -> dict[str, Any]:
    """Write a random scaled-down LLaDA checkpoint in LLaDA's own layout; returns its config.json dict."""
    import re

    import torch
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    from mmrl.models.dllm_native import LLADA_KEY_MAPPING, llada_llama_config

    heads = max(1, hidden // 128)
    raw = {**LLADA_8B, "d_model": hidden, "n_heads": heads, "n_kv_heads": heads, "n_layers": layers,
           "mlp_hidden_size": 3 * hidden}
    config, why = llada_llama_config(raw)
    assert config is not None, why
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    top = {"model.embed_tokens.weight": "model.transformer.wte.weight", "model.norm.weight": "model.transformer.ln_f.weight",
           "lm_head.weight": "model.transformer.ff_out.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm", "self_attn.q_proj": "q_proj",
             "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
             "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}

    def llada_name(name: str) -> str:  # Llama name -> LLaDA's (the inverse of LLADA_KEY_MAPPING)
        if name in top:
            return top[name]
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", name)
        return f"model.transformer.blocks.{m.group(1)}.{layer[m.group(2)]}.weight"

    inverse = {k: llada_name(k) for k in model.state_dict()}
    assert all(re.sub(p, r, v) == k for k, v in inverse.items() for p, r in LLADA_KEY_MAPPING.items() if re.match(p, v))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(raw))
    save_file({inverse[k]: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=16)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.prompt_length, args.gen_length, args.block_length, args.repeats = 128, 1, 8, 8, 4, 1
    import time

    import torch

    from mmrl.models.dllm_backbone import BackboneLogits
    from mmrl.models.dllm_native import load_native
    from mmrl.models.dllm_samplers import generate_low_confidence, generate_threshold

    set_threads(args.threads, args.device)
    with tempfile.TemporaryDirectory() as tmp:
        raw = llada_checkpoint(Path(tmp) / "llada", args.hidden, args.layers, args.seed)
        model, why = load_native(Path(tmp) / "llada")
    assert model is not None, why
    model.to(args.device)
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(0, 126000, (args.batch, args.prompt_length), generator=g).to(args.device)
    mask_id = raw["mask_token_id"]

    def decode(opts: dict) -> tuple[torch.Tensor, int, int]:
        fn = BackboneLogits(model, None, kind="native", shift=False, suppress_ids=(mask_id,))
        common = dict(gen_length=args.gen_length, block_length=args.block_length, mask_id=mask_id, temperature=0.0,
                      cache=opts["cache"])
        with torch.no_grad():
            if opts["sampler"] == "low_confidence":
                ids = generate_low_confidence(fn, prompts, steps=args.gen_length, **common)
            else:
                ids = generate_threshold(fn, prompts, threshold=args.threshold, **common)
        return ids[:, args.prompt_length:], fn.nfe, fn.tokens_fed

    # CPU: process CPU time (one torch thread; a shared machine's wall time is mostly other jobs'), GPU: wall time
    clock = time.process_time if args.device == "cpu" else time.perf_counter
    times: dict[str, list[float]] = {n: [] for n in SAMPLERS}
    outputs, nfe, fed = {}, {}, {}
    for r in range(args.repeats + 1):  # the first round warms up
        order = list(SAMPLERS)[r % len(SAMPLERS):] + list(SAMPLERS)[: r % len(SAMPLERS)]
        for name in order:
            sync(args.device)
            t0 = clock()
            ids, n_fwd, n_fed = decode(SAMPLERS[name])
            sync(args.device)
            if r:
                times[name].append(clock() - t0)
            outputs[name], nfe[name], fed[name] = ids.cpu(), n_fwd, n_fed
    tokens = args.batch * args.gen_length
    res: dict[str, Any] = {}
    for name, opts in SAMPLERS.items():
        base = "low_conf" if opts["sampler"] == "low_confidence" else "threshold"
        ratio = paired_ratio(times[base], times[name])  # uncached time / this time = the tokens/s speed-up
        res[name] = {"options": opts, "time": summarize(times[name]), "tokens_per_s": tokens / summarize(times[name])["median"],
                     "speedup": ratio, "nfe": nfe[name], "tokens_fed": fed[name],
                     "agreement": float((outputs[name] == outputs[base]).float().mean()), "baseline": base,
                     "goal": GOAL if opts["cache"] else None}
    result = {"benchmark": "llada_cache", "smoke": args.smoke, "clock": "process CPU time" if args.device == "cpu" else "wall", "environment": environment(args.device), "params": params,
              "config": {k: raw[k] for k in ("d_model", "n_layers", "n_heads", "mlp_hidden_size", "vocab_size")},
              "batch": args.batch, "prompt_length": args.prompt_length, "gen_length": args.gen_length,
              "block_length": args.block_length, "repeats": args.repeats, "samplers": res}
    write_json(args.out, result)
    print(f"LLaDA-architecture model, {params / 1e6:.1f}M parameters (d_model {args.hidden}, {args.layers} layers, vocab "
          f"126464), loaded natively from a LLaDA-layout checkpoint; {args.batch} x {args.gen_length} tokens, prompt "
          f"{args.prompt_length}, blocks of {args.block_length}, greedy")
    rows = [{"sampler": n, "tps": f"{e['tokens_per_s']:.1f}",
             "speedup": f"{e['speedup']['ratio']:.2f}x [{e['speedup']['round_min']:.2f}-{e['speedup']['round_max']:.2f}]",
             "nfe": e["nfe"], "fed": e["tokens_fed"], "agree": f"{100 * e['agreement']:.1f}%"} for n, e in res.items()]
    print_table(rows, [("sampler", "sampler"), ("tps", "tokens/s"), ("speedup", "vs uncached [paired]"), ("nfe", "forwards"),
                       ("fed", "positions fed"), ("agree", "tokens = uncached")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
