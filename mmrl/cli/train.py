"""`mmrl train CONFIG [key=value ...]`, also in TRL's spelling `mmrl train --config CONFIG --key value ...`.

    mmrl train configs/dmpo_llada_8b_countdown.yaml model_name_or_path=/models/LLaDA-8B-Instruct
    mmrl train --config configs/tiny_dmpo_sudoku4.yaml --max_steps 2 --bf16 --reward_funcs my_pkg.rewards.fn
    accelerate launch --config_file configs/accelerate/zero2.yaml -m mmrl.cli train configs/... key=value

`--key value`, `--key=value` and `key=value` mean the same; a boolean flag alone (`--gradient_checkpointing`) means
true, `--no_progress_bar` turns a default-true one off; a list takes the values up to the next option
(`--reward_funcs a b`); `--config` names the YAML preset. The options are transformers' `HfArgumentParser` over
`TrainConfig` (TRL's parser, `mmrl.config.parser`), so `mmrl train --help` lists every field with its help.
"""
from __future__ import annotations

import argparse
import json
import sys


def build_parser():
    """transformers' `HfArgumentParser` over `TrainConfig` (`mmrl.config.parser.ConfigParser`) and the command's own
    options."""
    from mmrl.config.parser import ConfigParser
    from mmrl.config.train_config import TrainConfig

    parser = ConfigParser(TrainConfig, prog="mmrl train", description=__doc__.split("\n\n")[0],
                          usage="mmrl train [CONFIG] [key=value ...] [--key value ...]")
    parser.add_argument("--help-config", "--help_config", action="store_true",
                        help="list every config field with its default and meaning")
    parser.add_argument("--print-config", "--print_config", action="store_true", help="print the resolved configuration and exit")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of errors that are otherwise printed as "
                                                              "one line")
    return parser


def parse(argv: list[str]) -> tuple[str | None, dict, argparse.Namespace]:
    """The YAML path, the values given and the command's own options; `ConfigError` for a word that is neither."""
    from mmrl.config.parser import parse_command_line
    from mmrl.config.train_config import ConfigError, unknown_key_error

    path, values, left = parse_command_line(argv, build_parser())
    own = argparse.Namespace(help_config=values.pop("help_config", False), print_config=values.pop("print_config", False),
                             debug=values.pop("debug", False))
    for word in left:
        if word.startswith("-"):
            raise unknown_key_error(word.lstrip("-").split("=", 1)[0].replace("-", "_"))
        raise ConfigError(f"unexpected argument {word!r}: give one YAML preset, then key=value or --key value")
    return path, values, own


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="[CONFIG] [key=value ...] [--key value ...]; see mmrl train --help")


def main(argv: list[str]) -> int:
    """`mmrl train ...`: parses its own arguments (`build_parser`), then runs."""
    from mmrl.config.train_config import ConfigError

    try:
        path, values, own = parse(argv)
    except ConfigError as e:
        print(f"mmrl train: {e}", file=sys.stderr)
        return 2
    return run(argparse.Namespace(config=path, values=values, help_config=own.help_config, print_config=own.print_config,
                                  debug=own.debug))


def _one_line(e: BaseException, debug: bool, code: int) -> int:
    """Print `e` as `mmrl train: <message>` (re-raised with its traceback under --debug); the exit code."""
    if debug:
        raise e
    print(f"mmrl train: {e}" + ("" if "\n" in str(e) else " (--debug shows the traceback)"), file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from mmrl.config.train_config import ConfigError, describe_fields, load_config

    if args.help_config:
        from mmrl.config.aliases import PRECISION_FLAGS, RENAMED

        print(describe_fields())
        print("TRL spellings also accepted: " + ", ".join([*(f"{k} (= {v})" for k, v in RENAMED.items()),
                                                          *(f"{k} (= mixed_precision: {v})" for k, v in PRECISION_FLAGS.items())]))
        return 0
    debug = getattr(args, "debug", False)
    try:
        cfg = load_config(args.config, args.values)
    except ConfigError as e:
        return _one_line(e, debug, 2)
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, default=str))
        return 0
    from mmrl.checkpointing.checkpoint import CheckpointDamaged
    from mmrl.checkpointing.run_lock import RunLocked
    from mmrl.data.loading import DatasetError
    from mmrl.rewards.combine import RewardError
    from mmrl.training.policy_factory import AttentionError, ModelSourceError
    from mmrl.rewards.imports import RewardImportError
    from mmrl.training.trainer import Trainer, TrainingError, TrainingStopped
    from mmrl.training.trl_api import ModelFamilyError

    # errors the user can fix: one line each (the traceback under --debug); anything else keeps its traceback
    startup = (ConfigError, DatasetError, ModelSourceError, RewardImportError, AttentionError, FileNotFoundError, RunLocked,
               CheckpointDamaged, RewardError, TrainingError, ModelFamilyError, ValueError)
    training = (TrainingError, ConfigError, CheckpointDamaged, RewardError, RunLocked, OSError)
    try:
        trainer = Trainer(cfg)
    except startup as e:
        return _one_line(e, debug, 2)
    try:
        last = trainer.train()
    except TrainingStopped as e:  # SIGTERM / Ctrl-C: the checkpoint of the last step is written
        print(f"mmrl train: {e}", file=sys.stderr)
        return 128 + e.signum  # the shell's convention for "ended by signal N"
    except training as e:
        return _one_line(e, debug, 1)
    keys = ("reward", "loss", "grad_norm", "completions/mean_length")
    print("final step: " + ", ".join(f"{k}={last[k]:.4g}" for k in keys if k in last))
    print(f"run directory: {cfg.output_dir}")
    return 0
