"""B6: wall time of the README's main command (the Quickstart's first command), as a user runs it.

The command is read from the first fenced code block of the README's "Quickstart" section (its first line that is
not a comment), unless `--command` gives one. It runs as a new user runs it: in a fresh `git clone` of the
repository's committed HEAD in a temporary directory (the clone is not timed; the README's command creates the venv
and installs from there), with an empty `MMRL_CACHE` in the same directory (so the base is built, not found),
`OMP_WAIT_POLICY=PASSIVE` and `HF_HUB_OFFLINE=1`; nothing lands in the repository. The JSON records the wall time,
the CPU time and peak resident set of the command's processes, and its exit code. Goal (issue 7): <= 10 minutes on 2
CPU cores. `--smoke` times `mmrl --version` through the same path instead (seconds, CI).

    python benchmarks/quickstart_time.py --out bench_results/quickstart.json
    python benchmarks/quickstart_time.py --command "mmrl quickstart --steps 5"
    python benchmarks/quickstart_time.py --smoke
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, environment, write_json  # noqa: E402

GOAL_SECONDS = 600.0


def readme_main_command(readme: Path) -> str | None:
    """The first command of the first code block under the README's Quickstart heading (None if there is none)."""
    text = readme.read_text()
    m = re.search(r"^#+\s*Quickstart\s*$(.*?)(?=^#+\s|\Z)", text, flags=re.M | re.S)
    if not m:
        return None
    block = re.search(r"```[a-z]*\n(.*?)```", m.group(1), flags=re.S)
    if not block:
        return None
    for line in block.group(1).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    return None


def fresh_clone(root: Path, into: Path) -> Path:
    """`into/repo`: a clone of `root`'s committed HEAD (what a new user has after `git clone`; uncommitted edits are
    not in it)."""
    repo = into / "repo"
    subprocess.run(["git", "clone", "--quiet", str(root), str(repo)], check=True, capture_output=True, text=True)
    return repo


def time_command(command: str, timeout: float, cwd: str, extra_env: dict[str, str] | None = None) -> dict:
    """Run `command` through bash in `cwd`; wall time, CPU time and peak RSS of its processes."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1", **(extra_env or {}))
    bindir = str(Path(sys.executable).parent)  # the `mmrl` entry point of this environment first
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        out = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        code, tail = out.returncode, (out.stdout + out.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        code, tail = None, f"timed out after {timeout} s\n" + ((e.stdout or b"")[-2000:].decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout or ""))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wall_seconds": wall,
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        # the largest resident set of any finished descendant (KiB on Linux); this process stays small (no torch) so
        # the copy a fork makes of it before exec does not count
        "peak_rss_bytes": after.ru_maxrss * 1024,
        "exit_code": code,
        "output_tail": tail,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="time `mmrl --version` through the same path (seconds)")
    ap.add_argument("--command", default=None, help="the command to time (default: the README's main command)")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    readme_cmd = readme_main_command(Path(args.readme))
    command = "mmrl --version" if args.smoke else (args.command or readme_cmd)
    result = {"benchmark": "quickstart_time", "smoke": args.smoke, "environment": environment("cpu", libraries=False),
              "readme_command": readme_cmd, "command": command, "goal": f"wall time <= {GOAL_SECONDS:.0f} s"}
    if not command:
        result.update(status="unavailable", goal_met=None,
                      reason="the README's Quickstart has no command yet (and no --command was given)")
        print(f"B6: {result['reason']}")
        write_json(args.out, result)
        return 0
    with tempfile.TemporaryDirectory(prefix="mmrl_quickstart_") as tmp:
        if args.smoke:  # the harness only: no clone, no build
            res = time_command(command, args.timeout, tmp)
        else:
            cache = Path(tmp) / "mmrl_cache"  # empty: the user's first run builds the base
            res = time_command(command, args.timeout, str(fresh_clone(ROOT, Path(tmp))), {"MMRL_CACHE": str(cache)})
            result["where"] = "a fresh git clone of HEAD, empty MMRL_CACHE"
    result.update(res)
    result["status"] = "ok" if res["exit_code"] == 0 else "failed"
    # the smoke command is not the README's: it tests this harness, not the goal
    result["goal_met"] = None if args.smoke else res["exit_code"] == 0 and res["wall_seconds"] <= GOAL_SECONDS
    print(f"B6: `{command}` took {res['wall_seconds']:.1f} s wall, {res['cpu_seconds']:.1f} s CPU, peak RSS "
          f"{res['peak_rss_bytes'] / 2**20:.0f} MiB, exit code {res['exit_code']}; goal <= {GOAL_SECONDS:.0f} s: "
          f"{ {True: 'met', False: 'MISSED'}.get(result['goal_met'], 'not applicable (smoke)') }")
    if res["exit_code"] != 0:
        print(res["output_tail"])
    write_json(args.out, result)
    return 0 if res["exit_code"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
