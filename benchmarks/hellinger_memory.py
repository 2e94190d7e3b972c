"""Peak extra memory of `hellinger_entropy`: chunked (default) vs one chunk (unchunked), on bf16 logits.

Issue goal: on [16, 512, 32000] bf16 logits the chunked computation's peak extra memory stays below 25% of one
float32 copy of the logits (16*512*32000*4 B = 1.05 GB), and it equals the unchunked result.

Each variant runs in a fresh subprocess. On CPU the peak is the highest resident size seen by a thread that
reads /proc/self/statm every 0.2 ms during the call, minus the resident size before it (the inputs already
allocated); on CUDA it is `max_memory_allocated` minus the inputs. Usage:

    python benchmarks/hellinger_memory.py            # full size
    python benchmarks/hellinger_memory.py --smoke    # [2, 64, 4096], seconds
    python benchmarks/hellinger_memory.py --device cuda --out bench_results/hellinger.json
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _make_logits(shape, device, seed):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.empty(shape, dtype=torch.bfloat16, device=device)
    for i in range(shape[0]):  # fill row by row: no float32 temporary of the whole tensor
        x[i] = (3 * torch.randn(shape[1:], generator=g)).to(device=device, dtype=torch.bfloat16)
    return x


def child(variant: str, shape: tuple[int, int, int], device: str) -> dict:
    import torch

    from mmrl.algorithms import hellinger_entropy

    torch.set_num_threads(2)
    p = _make_logits(shape, device, 0)
    q = _make_logits(shape, device, 1)
    q.add_(p)  # correlated reference, in place
    chunk = None if variant == "chunked" else shape[0] * shape[1]
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss_bytes()
        high = [base]
        done = threading.Event()

        def poll():
            while not done.is_set():
                high[0] = max(high[0], _rss_bytes())
                time.sleep(0.0002)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
    t0 = time.perf_counter()
    h2, ent = hellinger_entropy(p, q, chunk_size=chunk)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        done.set()
        watcher.join()
        peak = high[0] - base
    seconds = time.perf_counter() - t0
    return {"variant": variant, "peak_extra_bytes": max(peak, 0), "seconds": seconds,
            "h2_sum": float(h2.double().sum()), "entropy_sum": float(ent.double().sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shape, seconds")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = (2, 64, 4096) if args.smoke else (16, 512, 32000)
    if args.child:
        print(json.dumps(child(args.child, shape, args.device)))
        return
    results = {}
    for variant in ("chunked", "unchunked"):
        cmd = [sys.executable, __file__, "--child", variant, "--device", args.device] + (["--smoke"] if args.smoke else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    fp32_copy = shape[0] * shape[1] * shape[2] * 4
    ch, un = results["chunked"], results["unchunked"]
    same = abs(ch["h2_sum"] - un["h2_sum"]) <= 1e-6 * max(1.0, abs(un["h2_sum"])) and abs(ch["entropy_sum"] - un["entropy_sum"]) <= 1e-6 * max(1.0, abs(un["entropy_sum"]))
    print(f"hellinger_entropy on {list(shape)} bf16 logits ({args.device}); one float32 copy = {fp32_copy / 2**20:.0f} MiB")
    print(f"{'variant':<10} {'peak extra MiB':>15} {'/ fp32 copy':>12} {'seconds':>8}")
    for v in (ch, un):
        print(f"{v['variant']:<10} {v['peak_extra_bytes'] / 2**20:>15.1f} {v['peak_extra_bytes'] / fp32_copy:>12.3f} {v['seconds']:>8.2f}")
    ratio = ch["peak_extra_bytes"] / fp32_copy
    verdict = "smoke size: fixed overheads dominate, the goal is for the full size" if args.smoke else ("OK" if ratio < 0.25 else "MISSED")
    print(f"chunked peak / fp32 copy = {ratio:.3f} (goal < 0.25): {verdict}; "
          f"chunked == unchunked sums: {same}; chunked / unchunked peak = {ch['peak_extra_bytes'] / max(1, un['peak_extra_bytes']):.3f}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"shape": shape, "device": args.device, "fp32_copy_bytes": fp32_copy, "results": results,
                       "chunked_over_fp32_copy": ratio, "same_result": same}, f, indent=2)


if __name__ == "__main__":
    main()
