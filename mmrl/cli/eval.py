"""`mmrl eval`: accuracy of a checkpoint on a task's test split, with DMPO's (default) or d1's evaluation protocol.

    mmrl eval --model runs/x/checkpoints/checkpoint-000100 --task countdown
    mmrl eval --model runs/x/checkpoints/checkpoint-000100 --task countdown --protocol d1
    mmrl eval --model /models/Qwen2.5-7B-Instruct --family causal_lm --task gsm8k --metric gsm8k_accuracy

The family is read from the checkpoint (`mmrl_adapter.json`, which every mmrl checkpoint holds, or the run
configuration of a `checkpoint-<step>` directory); `--family` is needed only for models mmrl did not save.

`--protocol dmpo|d1` reproduces that paper's evaluation (`mmrl.training.evaluate`): the authors' evaluation instructions,
`<reasoning>` pre-filled after the chat template, greedy low-confidence decoding in blocks of 32, Sudoku on the 256
seeded puzzles; steps = length (DMPO) or length / 2 (d1). `--protocol none` decodes the task's own test prompts, all rows, with steps = length.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", default=None, help="model family: causal_lm, vlm, janus, masked_diffusion (default: read from the checkpoint)")
    parser.add_argument("--model", required=True, help="local checkpoint directory (<run>/checkpoints/checkpoint-000100 or its model/ folder) or tiny-world:NAME")
    parser.add_argument("--metric", default=None, help="the reward whose mean is the accuracy (default: the task's metric)")
    parser.add_argument("--task", required=True, help="task name (gsm8k, math500, countdown, sudoku, sudoku4, countdown3, ...)")
    parser.add_argument("--dataset-path", default=None, help="local data for the task")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N test rows")
    parser.add_argument("--gen-length", type=int, default=256, help="generation length (d1: 128, 256 or 512)")
    parser.add_argument("--block-length", type=int, default=32, help="masked diffusion block length (d1: 32)")
    parser.add_argument("--protocol", default="dmpo", choices=["dmpo", "d1", "none"],
                        help="evaluation protocol: dmpo (steps = length), d1 (steps = length / 2), both with <reasoning> "
                             "pre-filled and 256 seeded Sudoku rows; none: the task's test prompts as they are")
    parser.add_argument("--steps", type=int, default=None, help="masked diffusion steps (default: the protocol's)")
    parser.add_argument("--sampler", default=None, help="masked diffusion sampler (default low_confidence)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--trust-remote-code", action="store_true", help="allow checkpoints with their own modeling code")
    parser.add_argument("--out", default=None, help="write the result (with per-sample scores) as JSON here")
    parser.add_argument("--n-samples", type=int, default=4, help="GenEval tasks: images sampled per prompt (4, as the "
                        "official protocol); the printout and --out give per-task accuracy and the overall mean over tasks")


def checkpoint_family(path: Path) -> tuple[Path, str | None]:
    """(model directory, family) of a model directory or a trainer checkpoint `checkpoint-<step>` (whose model sits
    in `model/`): the family from `mmrl_adapter.json`, else from the run configuration in `trainer_state.json`."""
    model_dir = path / "model" if (path / "model").is_dir() and (path / "trainer_state.json").is_file() else path
    meta = model_dir / "mmrl_adapter.json"
    if meta.is_file():
        family = json.loads(meta.read_text()).get("family")
        if family:
            return model_dir, family
    state = path / "trainer_state.json"
    if state.is_file():
        return model_dir, json.loads(state.read_text()).get("config", {}).get("family")
    return model_dir, None


def _verify_model(path: Path, model_dir: Path) -> str | None:
    """The model files of an mmrl checkpoint checked against its manifest before loading: a message naming the
    damaged file, or None. A checkpoint without a manifest is loaded with a warning (nothing to check against); a
    model directory mmrl did not save has no manifest and is loaded as it is."""
    from mmrl.checkpointing.checkpoint import CheckpointDamaged, verify_checkpoint

    root = model_dir.parent if model_dir.name == "model" and (model_dir.parent / "trainer_state.json").is_file() else None
    if root is None:
        return None
    try:
        verified = verify_checkpoint(root, under="model")
    except CheckpointDamaged as e:
        return f"{e}; refusing to evaluate it (restore the file, or evaluate another checkpoint)"
    if not verified:
        print(f"mmrl eval: warning: {root} has no manifest.json, so its weights cannot be verified", file=sys.stderr)
    return None


def run(args: argparse.Namespace) -> int:
    from mmrl.data.tasks import load_task
    from mmrl.training.evaluate import dmpo_generation, evaluate, protocol_generation, protocol_rows, write_result
    from mmrl.models import load_policy

    task = load_task(args.task, args.dataset_path)
    metric = args.metric or task.metric
    from mmrl.rewards import REWARDS

    if metric not in REWARDS:
        print(f"mmrl eval: unknown --metric {metric!r}; valid: {sorted(REWARDS)}", file=sys.stderr)
        return 2
    rows = (task.test or task.train) if args.protocol == "none" else protocol_rows(task)  # jsonl without eval_split: every row
    if not task.test and args.protocol == "none":
        print(f"mmrl eval: task {task.name!r} has no test split here; evaluating its {len(task.train)} training rows")
    rows = rows[: args.limit] if args.limit else rows
    from mmrl.training.policy_factory import model_source

    source = model_source(args.model)
    if source is not None:
        policy = source(args.model.split(":", 1)[1], family=args.family)
    else:
        model_dir, family = checkpoint_family(Path(args.model))
        family = args.family or family
        if family is None:
            print(f"mmrl eval: {args.model} holds no mmrl_adapter.json naming its family; pass --family "
                  "(causal_lm, vlm, janus or masked_diffusion)", file=sys.stderr)
            return 2
        problem = _verify_model(Path(args.model), model_dir)
        if problem is not None:
            print(f"mmrl eval: {problem}", file=sys.stderr)
            return 2
        policy = load_policy(family, str(model_dir), trust_remote_code=args.trust_remote_code)
    if args.protocol == "none":
        gen = dmpo_generation(policy.family, args.gen_length, args.block_length, args.steps)
    else:
        gen = protocol_generation(args.protocol, policy.family, args.gen_length, args.block_length, args.steps)
    if args.sampler:
        gen["sampler"] = args.sampler
    gen = {k: v for k, v in gen.items() if k in getattr(policy, "generation_defaults", gen)}
    if is_geneval(rows, metric):
        if args.n_samples < 1:
            print(f"mmrl eval: --n-samples must be >= 1, got {args.n_samples}", file=sys.stderr)
            return 2
        return _geneval_eval(policy, rows, metric, task.name, args)
    result = evaluate(policy, rows, metric, task=task.name, batch_size=args.batch_size, **gen)
    print(f"{task.name}: {metric} accuracy {result.accuracy:.4f} on {result.n} rows ({result.seconds:.1f} s)")
    if args.out:
        write_result(result, args.out)
    return 0


def is_geneval(rows, metric: str) -> bool:
    """Whether a task is scored the GenEval way: a geneval reward over rows that carry GenEval metadata."""
    return metric.startswith("geneval") and bool(rows) and isinstance(rows[0].get("metadata"), dict) and "tag" in rows[0]["metadata"]


def _geneval_eval(policy, rows, metric: str, task_name: str, args) -> int:
    """GenEval's protocol: `--n-samples` images per prompt (sampled as the model's defaults, every image from its
    own seed), scored by `metric`; prints and writes the official summary (per-task accuracy over images, overall =
    the mean over tasks, `mmrl.geneval.summary`), with every image's score."""
    from mmrl.training.evaluate import evaluate
    from mmrl.geneval.summary import format_summary, summarize

    n = int(args.n_samples)
    repeated = [r for r in rows for _ in range(n)]
    result = evaluate(policy, repeated, metric, task=task_name, batch_size=args.batch_size)
    records = [{"metadata": r["metadata"], "tag": r["metadata"]["tag"], "correct": bool(s >= 1.0), "prompt": r["prompt"]}
               for r, s in zip(repeated, result.scores)]
    summary = summarize(records)
    print(format_summary(summary))
    print(f"{task_name}: GenEval overall {summary['overall']:.4f} (mean over {len(summary['tasks'])} tasks; "
          f"{len(rows)} prompts x {n} images, {result.seconds:.1f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps({"task": task_name, "metric": metric, "n_samples": n, "summary": summary,
                                              "images": [{"prompt": r["prompt"], "tag": r["tag"], "score": float(s)}
                                                         for r, s in zip(records, result.scores)]}, indent=2))
    return 0
