"""Rollout speed of `CausalLMAdapter.sample` against transformers' `model.generate` (what TRL's GRPOTrainer calls),
on the same randomly initialised Qwen2 model, prompts and sampling settings, in the same process.

Both produce G completions per prompt with the same temperature / top-p (TRL's defaults 1.0 / 1.0) and a KV cache; `generate` is asked for
nothing more (TRL recomputes log-probs with a separate forward), while `sample` also records the per-token
log-probs and builds the negative condition. The EOS id is one random token of V, so some row is always still
running and both decode exactly `max_new_tokens` steps. Prints the median wall time of each and the ratio generate / sample
(> 1: mmrl is faster). Usage:

    python benchmarks/causal_lm_sampling.py              # hidden 256, 4 layers, vocab 32k, 8 prompts x G=8, 128 tokens
    python benchmarks/causal_lm_sampling.py --smoke      # tiny sizes, seconds
    python benchmarks/causal_lm_sampling.py --device cuda --hidden 896 --layers 24 --vocab 151936
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--temperature", type=float, default=1.0, help="TRL's default")
    ap.add_argument("--top-p", type=float, default=1.0, help="TRL's default; < 1 adds a sort per step to both samplers")
    ap.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.prompts, args.group, args.prompt_len, args.new_tokens, args.repeats = 64, 2, 2000, 4, 4, 16, 16, 2

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmrl.models.causal_lm import CausalLMAdapter
    from mmrl.models.tokenizers import char_tokenizer

    torch.set_num_threads(args.threads if args.device == "cpu" else torch.get_num_threads())
    dtype = getattr(torch, args.dtype)
    tok = char_tokenizer()
    heads = max(1, args.hidden // 64)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(device=args.device, dtype=dtype).eval()
    eos = args.vocab - 1  # rarely drawn (about 1/V per token): both loops run until max_new_tokens
    gen = dict(max_new_tokens=args.new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=0)
    adapter = CausalLMAdapter(model, tok, eos_token_id=eos, pad_token_id=0, **gen)
    g = torch.Generator().manual_seed(0)
    lengths = [args.prompt_len // 2 + (i * 7) % (args.prompt_len // 2 + 1) for i in range(args.prompts)]
    prompt_ids = [torch.randint(5, min(args.vocab, 1000) - 1, (n,), generator=g).tolist() for n in lengths]
    # the adapter takes text; give it strings that the char tokenizer maps back to ids < 102, and feed generate
    # the very same ids
    texts = ["".join(tok.convert_ids_to_tokens([5 + (t % 95) for t in ids])) for ids in prompt_ids]
    enc = [tok(t)["input_ids"] for t in texts]
    from mmrl.models.base import left_pad

    ids, mask = left_pad(enc, 0, args.device)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def run_generate():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask.long(), do_sample=True, num_return_sequences=args.group,
                                 max_new_tokens=args.new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=0, eos_token_id=eos, pad_token_id=0)
        return out.shape[1] - ids.shape[1]

    def run_sample():
        r = adapter.sample(texts, args.group, generator=torch.Generator().manual_seed(1))
        return r.response_ids.shape[1]

    times = {"generate": [], "mmrl_sample": []}
    for name, fn in (("generate", run_generate), ("mmrl_sample", run_sample)):
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("generate", run_generate), ("mmrl_sample", run_sample)):
            sync()
            t0 = time.perf_counter()
            steps = fn()
            sync()
            times[name].append(time.perf_counter() - t0)
            assert steps == args.new_tokens, (name, steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    n = args.prompts * args.group
    print(f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, {args.dtype} on {args.device}; "
          f"{args.prompts} prompts x G={args.group}, prompt len {min(lengths)}-{max(lengths)}, {args.new_tokens} new tokens, "
          f"temperature {args.temperature}, top_p {args.top_p}")
    for k, v in med.items():
        print(f"{k:12s} median {v:.3f} s  ({n * args.new_tokens / v:.0f} tokens/s)")
    print(f"ratio generate / mmrl_sample: {med['generate'] / med['mmrl_sample']:.2f}x")
    if args.out:
        import json
        import platform

        per_round = [g / s for g, s in zip(times["generate"], times["mmrl_sample"])]
        res = {"benchmark": "causal_lm_sampling", "smoke": args.smoke,
               "environment": {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                               "load_average": os.getloadavg()},
               "args": {k: v for k, v in vars(args).items() if k != "out"}, "responses": n, "times_s": times,
               "median_s": med, "tokens_per_s": {k: n * args.new_tokens / v for k, v in med.items()},
               "speed_ratio": med["generate"] / med["mmrl_sample"],
               "speed_ratio_rounds": {"min": min(per_round), "median": statistics.median(per_round), "max": max(per_round)}}
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
