"""`mmrl eval`: accuracy of a checkpoint on a task's test split, with DMPO's (default) or d1's evaluation protocol.

    mmrl eval --family masked_diffusion --model runs/x/checkpoints/checkpoint-000100/model --task countdown --protocol d1

`--protocol dmpo|d1` reproduces that paper's evaluation (`mmrl.evaluate`): the authors' evaluation instructions,
`<reasoning>` pre-filled after the chat template, greedy low-confidence decoding in blocks of 32, Sudoku on the 256
seeded puzzles; steps = length (DMPO) or length / 2 (d1). `--protocol none` decodes the task's own test prompts, all rows, with steps = length.
"""
from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", required=True, help="model family: causal_lm, vlm, janus, masked_diffusion")
    parser.add_argument("--model", required=True, help="local checkpoint directory (e.g. <run>/checkpoints/checkpoint-000100/model) or tiny-world:NAME")
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


def run(args: argparse.Namespace) -> int:
    from mmrl.data.tasks import load_task
    from mmrl.evaluate import dmpo_generation, evaluate, protocol_generation, protocol_rows, write_result
    from mmrl.models import load_policy

    task = load_task(args.task, args.dataset_path)
    rows = task.test if args.protocol == "none" else protocol_rows(task)
    rows = rows[: args.limit] if args.limit else rows
    from mmrl.policy_factory import model_source

    source = model_source(args.model)
    if source is not None:
        policy = source(args.model.split(":", 1)[1], family=args.family)
    else:
        policy = load_policy(args.family, args.model, trust_remote_code=args.trust_remote_code)
    if args.protocol == "none":
        gen = dmpo_generation(args.family, args.gen_length, args.block_length, args.steps)
    else:
        gen = protocol_generation(args.protocol, args.family, args.gen_length, args.block_length, args.steps)
    if args.sampler:
        gen["sampler"] = args.sampler
    gen = {k: v for k, v in gen.items() if k in getattr(policy, "generation_defaults", gen)}
    result = evaluate(policy, rows, task.metric, task=task.name, batch_size=args.batch_size, **gen)
    print(f"{task.name}: {task.metric} accuracy {result.accuracy:.4f} on {result.n} rows ({result.seconds:.1f} s)")
    if args.out:
        write_result(result, args.out)
    return 0
