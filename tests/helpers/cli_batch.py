"""Run several `mmrl` command lines in ONE fresh Python process (one interpreter and torch import instead of one
per command): each command goes through `mmrl.cli.main` as the console script calls it, with its own captured
stdout / stderr and exit code. For the error-message tests, where the process start-up would otherwise dominate.

    python cli_batch.py CASES.json  ->  prints one JSON list of {"code", "stdout", "stderr"}
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path


def run_cli_batch(cases: list[list[str]], cwd: Path, timeout: int = 300) -> list[dict]:
    """[{"code": int, "stdout": str, "stderr": str}] for each argv in `cases`, run in order in one child process."""
    spec = Path(cwd) / "_cli_batch_cases.json"
    spec.write_text(json.dumps([[str(a) for a in argv] for argv in cases]))
    proc = subprocess.run([sys.executable, __file__, str(spec)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    if proc.returncode != 0:
        raise AssertionError(f"the batch runner itself failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def _main(spec: str) -> None:
    from mmrl.cli import main

    results, real_stdout = [], sys.stdout
    for argv in json.loads(Path(spec).read_text()):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's errors, as the console script would exit
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # what a user would see as a traceback
                traceback.print_exc()
                code = 1
        results.append({"code": int(code or 0), "stdout": out.getvalue(), "stderr": err.getvalue()})
    real_stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    _main(sys.argv[1])
