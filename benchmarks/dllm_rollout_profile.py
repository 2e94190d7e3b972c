"""Issue 29: where a masked-diffusion rollout's time goes, and what running the LM head on the current block only
saves. The model and rollout of `benchmarks/method_costs.py`'s masked_diffusion family (bidirectional Llama, vocab
32000, 16 responses x 64 tokens, d1's training sampler: low-confidence, 2 tokens per step, blocks of 32, prefix cache).

Per rollout it reports forwards per generated token, positions fed through the layers per generated token, positions
put through the LM head per generated token (with the head on the block only, and as it was before: on every position
from the block's start to the end of the sequence), and the process CPU time of `policy.sample` with the head on the
block only against the head on the whole window (interleaved A, B, B, A; CPU time because the wall time of a shared
machine is mostly other jobs' time).

    python benchmarks/dllm_rollout_profile.py --threads 1 --out dllm_rollout_profile.json  (then into benchmarks/results/)
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_PROMPTS, environment, paired_ratio, set_threads, summarize, write_json  # noqa: E402


def main(argv=None) -> int:
    import method_costs as mc

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    own, rest = ap.parse_known_args(argv)
    args = mc.parse_args(rest)
    set_threads(args.threads, args.device)
    import torch

    from mmrl.models.dllm_backbone import BackboneLogits

    sz = mc.sizes(args, "masked_diffusion")
    policy = mc.build_policy("masked_diffusion", sz)
    G = sz["group"]
    prompts = BENCH_PROMPTS[: max(1, sz["responses"] // G)]
    opts = dict(gen_length=sz["tokens"], block_length=sz["block"], steps=sz["tokens"] // 2, cache="prefix", temperature=1.0)
    head_calls: list[int] = []
    original = BackboneLogits._forward

    def counting(self, x, start, keep, use_cache=False, end=None):  # LM-head positions of each forward
        out = original(self, x, start, keep, use_cache=use_cache, end=end)
        head_calls.append(out.shape[0] * out.shape[1])
        return out

    def run(block_only: bool) -> tuple[float, dict]:
        head_calls.clear()
        saved = {}
        if not block_only:  # the head on every position from the block's start (the code before issue 29)
            for name in ("window", "prefill", "suffix"):
                fn = getattr(BackboneLogits, name)
                saved[name] = fn
                setattr(BackboneLogits, name, (lambda f: lambda self, x, start, end=None: f(self, x, start))(fn))
        BackboneLogits._forward = counting
        try:
            c0 = time.process_time()
            with torch.no_grad():
                ro = policy.sample(list(prompts), G, seeds=list(range(len(prompts) * G)), **opts)
            cpu = time.process_time() - c0
        finally:
            BackboneLogits._forward = original
            for name, fn in saved.items():
                setattr(BackboneLogits, name, fn)
        tokens = ro.response_ids.numel()
        nfe = int(ro.extras["nfe"])
        return cpu, {"forwards_per_token": nfe / (tokens / ro.response_ids.shape[0]), "head_positions_per_token": sum(head_calls) / tokens,
                     "ids": ro.response_ids}

    cpu = {"block": [], "window": []}
    profile = {}
    for r in range(own.repeats + 1):
        for mode in (("block", "window") if r % 2 == 0 else ("window", "block")):
            t, p = run(mode == "block")
            if r:
                cpu[mode].append(t)
            profile[mode] = p
    same = bool(torch.equal(profile["block"].pop("ids"), profile["window"].pop("ids")))
    fn = policy.backbone_logits(torch.ones(1, 8, dtype=torch.bool), sz["tokens"])
    res = {"benchmark": "dllm_rollout_profile", "environment": environment(args.device), "sizes": sz, "options": opts,
           "params": mc.n_params(policy.unwrapped), "profile": profile, "cpu_block": summarize(cpu["block"]),
           "cpu_window": summarize(cpu["window"]), "speedup": paired_ratio(cpu["window"], cpu["block"]),
           "same_outputs": same, "supports_cache": fn.supports_cache}
    write_json(own.out, res)
    s = res["speedup"]
    print(f"rollout of {sz['responses']} x {sz['tokens']} tokens, {res['params'] / 1e6:.1f}M parameters: forwards per generated "
          f"token {profile['block']['forwards_per_token']:.2f}; LM-head positions per generated token "
          f"{profile['window']['head_positions_per_token']:.1f} -> {profile['block']['head_positions_per_token']:.1f}; CPU s "
          f"{res['cpu_window']['median']:.2f} -> {res['cpu_block']['median']:.2f} ({s['ratio']:.2f}x [{s['round_min']:.2f}-"
          f"{s['round_max']:.2f}]); same tokens: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
