"""Run every benchmark (each in its own process), collect their JSON in one directory, and summarise.

| name | issue 7 | what |
|---|---|---|
| method_costs | B1, B2 | Trainer step time (rollout / buffer / update) and peak memory per method, ratios to GRPO |
| dllm_samplers | B3 | masked-diffusion samplers on the tiny Sudoku model, 64 prompts per batch: tokens/s, forwards, accuracy |
| dllm_samplers_single | B3 | the same, one prompt per sampler call (the setting of Fast-dLLM's throughput figures) |
| trl_comparison | B4 | seconds per GRPO optimizer step, mmrl against TRL's GRPOTrainer |
| janus_sampling | B5 | the Janus adapter's CFG sampler against transformers' `generate(generation_mode="image")` |
| amused_sampling | 18 | the masked_image (aMUSEd) sampler against diffusers' `AmusedPipeline` |
| quickstart_time | B6 | wall time of the README's main command |
| causal_lm_sampling | rollouts | the causal-LM sampler against `model.generate` |
| hellinger_memory | DGPO | peak memory of the chunked Hellinger / entropy statistics |
| diagnostics_overhead | 29 | Trainer step time with the `diag/` diagnostics on against off (CPU time on a CPU) |

    python benchmarks/run_all.py --smoke --jobs 2 --out /tmp/bench  # seconds each, two at a time (CI)
    python benchmarks/run_all.py --out bench_results --lock /tmp/mmrl_cpu.lock   # full size, ~30-40 min on 2 cores
    flock /tmp/core1.lock taskset -c 1 python benchmarks/run_all.py --threads 1 --out benchmarks/results --only janus_sampling
    python benchmarks/run_all.py --gpu --out bench_results/gpu      # one GPU (benchmarks/gpu.sh)
    python benchmarks/report.py --results bench_results             # README "Performance" section from the JSON

`--lock FILE` takes an exclusive `flock` on FILE around each benchmark, so timing-sensitive jobs on a shared machine
that use the same lock never overlap with one (and can run between two). Each benchmark's output goes to
`<out>/<name>.log`; `<out>/summary.json` lists what ran, its exit code and wall time (a later run into the same
directory adds to it, so the benchmarks can be run one at a time). `--threads N` runs every benchmark with N torch
threads (`--threads` of the scripts and `OMP_NUM_THREADS`): the committed CPU results in `benchmarks/results/` are
1-thread numbers, pinned to one core of a shared 2-core machine.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import ROOT, write_json  # noqa: E402

BENCHMARKS: dict[str, dict] = {
    "method_costs": {"script": "method_costs.py", "issue": "B1, B2", "smoke": ["--smoke"], "full": ["--repeats", "3"],
                     "gpu": ["--hidden", "896", "--layers", "24", "--vocab", "151936", "--tokens", "128", "--dllm-hidden", "896",
                             "--dllm-layers", "8", "--dllm-tokens", "64", "--repeats", "2"]},
    "trl_comparison": {"script": "trl_comparison.py", "issue": "B4", "smoke": ["--smoke"], "full": ["--blocks", "2", "--repeats", "1"],
                       "gpu": ["--hidden", "896", "--layers", "24", "--vocab", "151936", "--tokens", "128", "--blocks", "1",
                               "--repeats", "2"]},
    "dllm_samplers": {"script": "dllm_samplers.py", "issue": "B3", "smoke": ["--smoke", "--threads", "1"], "full": [],
                      "gpu": ["--batch", "256", "--hidden", "128", "--layers", "4", "--train-seconds", "60"]},
    "dllm_samplers_single": {"script": "dllm_samplers.py", "issue": "B3", "smoke": ["--smoke", "--threads", "1", "--call-batch", "4"],
                             "full": ["--call-batch", "1", "--repeats", "3"], "gpu": ["--call-batch", "1", "--repeats", "3"]},
    "janus_sampling": {"script": "janus_sampling.py", "issue": "B5", "smoke": ["--smoke"], "full": ["--grid", "16", "--hidden", "128"],
                       "gpu": ["--grid", "24", "--hidden", "512", "--layers", "8", "--codebook", "1024", "--prompts", "8"]},
    "amused_sampling": {"script": "amused_sampling.py", "issue": "18", "smoke": ["--smoke"], "full": [],
                        "gpu": ["--grid", "16", "--hidden", "512", "--layers", "8", "--codebook", "8192", "--steps", "12",
                                "--prompts", "8", "--group-size", "4"]},
    "quickstart_time": {"script": "quickstart_time.py", "issue": "B6", "smoke": ["--smoke"], "full": [], "gpu": [], "cpu_only": True,
                        "no_threads": True},
    "causal_lm_sampling": {"script": "causal_lm_sampling.py", "issue": "rollouts", "smoke": ["--smoke"],
                           "full": ["--prompts", "2", "--group", "8", "--new-tokens", "256", "--hidden", "512"],
                           "gpu": ["--hidden", "896", "--layers", "24", "--vocab", "151936", "--prompts", "8", "--new-tokens", "256"]},
    "diagnostics_overhead": {"script": "diagnostics_overhead.py", "issue": "29", "smoke": ["--smoke"],
                             "full": ["--repeats", "4", "--tokens", "128"],
                             "gpu": ["--hidden", "896", "--layers", "24", "--vocab", "151936", "--tokens", "128",
                                     "--dllm-hidden", "896", "--dllm-layers", "8", "--repeats", "2"]},
    "hellinger_memory": {"script": "hellinger_memory.py", "issue": "DGPO statistics", "smoke": ["--smoke"], "full": [], "gpu": [],
                         "no_threads": True},
}
"""name -> script, the issue item, and the extra arguments of each size."""


def tiny_world_sudoku_available() -> bool:
    """Whether the tiny world's Sudoku base model can be loaded (then B3 measures it, not its own quick model)."""
    try:
        from mmrl.tiny_world.models import load_base_policy  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def exclusive(lock: str | None):
    """An exclusive flock on `lock` (waits until it is free); nothing when None."""
    if not lock:
        yield
        return
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def command(name: str, size: str, out: Path, device: str, threads: int | None = None, extra: list[str] | None = None) -> list[str]:
    spec = BENCHMARKS[name]
    args = [sys.executable, str(HERE / spec["script"]), *spec[size], *(extra or []), "--out", str(out / f"{name}.json")]
    if threads and not spec.get("no_threads"):
        args = [a for i, a in enumerate(args) if a != "--threads" and (i == 0 or args[i - 1] != "--threads")]
        args += ["--threads", str(threads)]
    if name.startswith("dllm_samplers") and size != "smoke":
        args += ["--tiny-world", "sudoku4"] if tiny_world_sudoku_available() else ["--train-seconds", "90"]
    if device != "cpu" and not spec.get("cpu_only"):
        args += ["--device", device]
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="every benchmark at its --smoke size")
    ap.add_argument("--gpu", action="store_true", help="sizes for one GPU (device cuda)")
    ap.add_argument("--out", default=str(ROOT / "bench_results"), help="directory for the JSON and logs")
    ap.add_argument("--only", default="", help="comma-separated benchmark names (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated benchmark names to leave out")
    ap.add_argument("--lock", default=None, help="flock this file around each benchmark (shared machines)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of every benchmark (default: each script's own)")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=ARGS",
                    help="more arguments for one benchmark, after its size's (repeatable), e.g. "
                         "'method_costs=--methods dgpo,grpo_beta0.04 --no-memory'")
    ap.add_argument("--jobs", type=int, default=1,
                    help="benchmarks run at once (only with --smoke: timings taken side by side are not comparable)")
    args = ap.parse_args(argv)
    if args.jobs < 1 or (args.jobs > 1 and not args.smoke):
        raise SystemExit(f"--jobs {args.jobs}: expected 1, or more than 1 together with --smoke (full-size timings "
                         "run one benchmark at a time)")
    extra: dict[str, list[str]] = {}
    for item in args.extra:
        name, sep, rest = item.partition("=")
        if not sep or name not in BENCHMARKS:
            raise SystemExit(f"--extra {item!r}: expected NAME=ARGS with NAME one of {sorted(BENCHMARKS)}")
        extra.setdefault(name, []).extend(shlex.split(rest))
    size = "smoke" if args.smoke else "gpu" if args.gpu else "full"
    device = "cuda" if args.gpu else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only + [n for n in args.skip.split(",") if n] if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; valid: {sorted(BENCHMARKS)}")
    names = [n for n in BENCHMARKS if (not only or n in only) and n not in args.skip.split(",")]
    env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    summary = {"size": size, "device": device, "threads": args.threads, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "benchmarks": {}}
    previous = out / "summary.json"
    if previous.exists():  # runs into the same directory add up (one benchmark at a time on a shared machine)
        try:
            old = json.loads(previous.read_text())
        except ValueError:
            old = {}
        if old.get("size") == size and old.get("device") == device:
            summary["benchmarks"] = {n: b for n, b in old.get("benchmarks", {}).items() if n not in names}
    failed = []
    written = threading.Lock()  # --jobs > 1: the summary is rewritten by whichever benchmark ends

    def run_one(name: str) -> None:
        cmd = command(name, size, out, device, args.threads, extra.get(name))
        print(f"== {name} ({BENCHMARKS[name]['issue']}): {' '.join(cmd[1:])}", flush=True)
        with exclusive(args.lock):
            load_start = os.getloadavg()  # the machine's load: timings on a shared machine are read as ratios
            t0 = time.perf_counter()
            with open(out / f"{name}.log", "w") as log:
                try:
                    code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=args.timeout).returncode
                except subprocess.TimeoutExpired:
                    code = None
            seconds = time.perf_counter() - t0
            load_end = os.getloadavg()
        status = "ok" if code == 0 else "timeout" if code is None else "failed"
        json_path = out / f"{name}.json"
        with written:
            if status != "ok":
                failed.append(name)
            summary["benchmarks"][name] = {"issue": BENCHMARKS[name]["issue"], "command": cmd[1:], "exit_code": code,
                                           "status": status, "seconds": seconds,
                                           "json": json_path.name if json_path.exists() else None,
                                           "threads": args.threads, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                                           "loadavg_start": list(load_start), "loadavg_end": list(load_end)}
            print(f"   {name}: {status} in {seconds:.0f} s" + ("" if status == "ok" else f" (see {out / (name + '.log')})"),
                  flush=True)
            write_json(out / "summary.json", summary)

    if args.jobs == 1:
        for name in names:
            run_one(name)
    else:  # smoke runs only: concurrent benchmarks time each other
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(run_one, names))
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(out / "summary.json", summary)
    print(json.dumps({n: s["status"] for n, s in summary["benchmarks"].items()}))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
