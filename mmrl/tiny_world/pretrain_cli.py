"""`mmrl pretrain-tiny NAME`: build (pre-train) a tiny-world base model into the cache, or list them.

    mmrl pretrain-tiny --list
    mmrl pretrain-tiny sudoku4            # a minute or two on 2 CPU cores; cached afterwards
    mmrl pretrain-tiny shapes --force     # rebuild
"""
from __future__ import annotations

import argparse
import json
import logging

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the tiny models and whether they are cached")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation after the build")


def run(args: argparse.Namespace) -> int:
    from mmrl.tiny_world.models import TINY_MODELS, describe, ensure_built

    if args.list or not args.name:
        for row in describe():
            logger.info(f"{row['name']:<14} {row['family']:<17} {'cached' if row['cached'] else 'not built':<10} {row['description']}")
        return 0
    if args.name not in TINY_MODELS:
        logger.error(f"mmrl pretrain-tiny: unknown model {args.name!r}; valid: {sorted(TINY_MODELS)}")
        return 2
    path = ensure_built(args.name, force=args.force)
    info = json.loads((path / "tiny_spec.json").read_text())
    logger.info(f"{args.name}: {path} (built in {info['seconds']:.0f} s)")
    if not args.no_eval:
        from mmrl.tiny_world.models import held_out_accuracy

        acc = held_out_accuracy(args.name)
        logger.info(f"held-out {acc.pop('metric')}: " + "  ".join(f"{k} {v:.3f}" for k, v in acc.items()))
    return 0
