"""The `mmrl` command. Each subcommand lives in its own module, imported only when it is used.

A subcommand module defines `configure(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int | None`; one that parses its own arguments (train: transformers'
`HfArgumentParser` over the config, `mmrl.config.parser`) defines `main(argv: list[str]) -> int` instead of `run`.

Library modules report through `logging` (`logging.getLogger(__name__)` under the `mmrl` logger); the command is
where a handler is configured (`configure_logging`): messages below WARNING to stdout, warnings and errors to
stderr, each as the bare message, so the command's progress output reads as before.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    # name: (module, one-line help)
    "train": ("mmrl.cli.train", "train a policy with an RL method from a YAML preset and key=value overrides"),
    "eval": ("mmrl.cli.eval", "accuracy of a checkpoint on a task's test split (--protocol dmpo|d1)"),
    "quickstart": ("mmrl.tiny_world.quickstart", "the main job on a laptop CPU: GCPO on a tiny text-to-image model (shapes world), held-out GenEval before/after; --world sudoku: DMPO on tiny Sudoku"),
    "replicate": ("mmrl.tiny_world.replicate", "a paper's comparison at toy scale on the tiny world, over seeds (table and curves)"),
    "pretrain-tiny": ("mmrl.tiny_world.pretrain_cli", "build (pre-train) a tiny-world base model into the cache, or --list them"),
    "geneval": ("mmrl.cli.geneval", "GenEval: write prompts, generate images, evaluate them, summarize results"),
}


class _ConsoleHandler(logging.Handler):
    """The bare message to the process's current stdout or stderr (looked up at each record, so that a caller
    that redirects `sys.stdout`, such as pytest's capture, gets the output)."""

    def __init__(self, stream: str, below: int | None = None):
        super().__init__()
        self.stream_name, self.below = stream, below

    def filter(self, record: logging.LogRecord) -> bool:
        return self.below is None or record.levelno < self.below

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = getattr(sys, self.stream_name)
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own convention: report, never raise
            self.handleError(record)


def configure_logging(level: int = logging.INFO) -> None:
    """Show the `mmrl` loggers' messages as the command's output (idempotent: handlers are added once)."""
    logger = logging.getLogger("mmrl")
    logger.setLevel(level)
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        logger.addHandler(_ConsoleHandler("stdout", below=logging.WARNING))
        out = _ConsoleHandler("stderr")
        out.setLevel(logging.WARNING)
        logger.addHandler(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl", description="Reinforcement learning for generative models.")
    parser.add_argument("--version", action="version", version=f"mmrl {__import__('mmrl').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    configure_logging()
    import mmrl.tiny_world

    # the command is the application: it adds the tiny world's tasks, rewards and base models (built on first use)
    mmrl.tiny_world.register(build_missing=True)
    if argv and argv[0] in SUBCOMMANDS:
        own_parser = getattr(importlib.import_module(SUBCOMMANDS[argv[0]][0]), "main", None)
        if own_parser is not None:  # the subcommand parses its own arguments (train: TRL's parser)
            return int(own_parser(argv[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    code = importlib.import_module(args._module).run(args)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
