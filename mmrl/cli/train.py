"""`mmrl train CONFIG [key=value ...]`, also in TRL's spelling `mmrl train --config CONFIG --key value ...`.

    mmrl train configs/dmpo_llada_8b_countdown.yaml model_name_or_path=/models/LLaDA-8B-Instruct
    mmrl train --config configs/tiny_dmpo_sudoku4.yaml --max_steps 2 --bf16 --reward_funcs my_pkg.rewards.fn
    accelerate launch --config_file configs/accelerate/zero2.yaml -m mmrl.cli train configs/... key=value

`--key value`, `--key=value` and `key=value` mean the same; a boolean flag alone (`--gradient_checkpointing`) means
true; a list takes the values up to the next option (`--reward_funcs a b`); `--config` names the YAML preset.
"""
from __future__ import annotations

import argparse
import json
import sys


OWN_FLAGS = ("-h", "--help", "--help-config", "--help_config", "--print-config", "--print_config")
"""Options of `mmrl train` itself; every other `--name` is a configuration key."""


def normalize_argv(args: list[str]) -> list[str]:
    """TRL-style arguments (`--config X`, `--key value`, `--key=value`, `--flag`) as `[X] key=value ...`."""
    import typing

    from mmrl.config.train_config import TrainConfig
    from mmrl.config.aliases import PRECISION_FLAGS

    hints = typing.get_type_hints(TrainConfig)

    def kind(key: str) -> str:
        tp = hints.get(key)
        if tp is bool or key in PRECISION_FLAGS:
            return "bool"
        if typing.get_origin(tp) is list or list in typing.get_args(tp) or any(typing.get_origin(a) is list for a in typing.get_args(tp)):
            return "list"
        return "one"

    config, out, own = None, [], []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a in OWN_FLAGS or not a.startswith("--"):
            (own if a in OWN_FLAGS else out).append(a)
            continue
        key, eq, value = a[2:].partition("=")
        key = key.replace("-", "_")
        if not eq:
            values = []
            while i < len(args) and not args[i].startswith("--") and "=" not in args[i] and (kind(key) == "list" or not values):
                if kind(key) == "bool" and args[i].lower() not in ("true", "false", "yes", "no", "1", "0", "on", "off"):
                    break
                values.append(args[i])
                i += 1
            if not values and (kind(key) == "bool" or key not in hints):
                values = ["true"]  # a flag alone; an unknown key then gets the unknown / unsupported-key error
            if not values:
                raise SystemExit(f"mmrl train: --{key} needs a value")
            value = ",".join(values) if kind(key) == "list" and len(values) > 1 else values[0]
        if key == "config":
            config = value
        else:
            out.append(f"{key}={value}")
    return ([config] if config is not None else []) + out + own


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); optional when every key is given as an override")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of config fields (see --help-config)")
    parser.add_argument("--help-config", action="store_true", help="list every config field with its default and meaning")
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")


def run(args: argparse.Namespace) -> int:
    from mmrl.config.train_config import ConfigError, describe_fields, load_config

    if args.help_config:
        from mmrl.config.aliases import PRECISION_FLAGS, RENAMED

        print(describe_fields())
        print("TRL spellings also accepted: " + ", ".join([*(f"{k} (= {v})" for k, v in RENAMED.items()),
                                                          *(f"{k} (= mixed_precision: {v})" for k, v in PRECISION_FLAGS.items())]))
        return 0
    path, overrides = args.config, list(args.overrides)
    if path is not None and "=" in path and not path.endswith((".yaml", ".yml")):
        overrides.insert(0, path)  # `mmrl train key=value ...` without a file
        path = None
    try:
        cfg = load_config(path, overrides)
    except ConfigError as e:
        print(f"mmrl train: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps(cfg.to_dict(), indent=2, default=str))
        return 0
    from mmrl.data.loading import DatasetError
    from mmrl.training.policy_factory import AttentionError, ModelSourceError
    from mmrl.rewards.imports import RewardImportError
    from mmrl.training.trainer import Trainer, TrainingError, TrainingStopped

    try:
        trainer = Trainer(cfg)
    except (DatasetError, ModelSourceError, RewardImportError, AttentionError, FileNotFoundError) as e:  # start-up: one line, no traceback
        print(f"mmrl train: {e}", file=sys.stderr)
        return 2
    try:
        last = trainer.train()
    except TrainingError as e:
        print(f"mmrl train: {e}", file=sys.stderr)
        return 1
    except TrainingStopped as e:  # SIGTERM / Ctrl-C: the checkpoint of the last step is written
        print(f"mmrl train: {e}", file=sys.stderr)
        return 128 + e.signum  # the shell's convention for "ended by signal N"
    keys = ("reward", "loss", "grad_norm", "completions/mean_length")
    print("final step: " + ", ".join(f"{k}={last[k]:.4g}" for k in keys if k in last))
    print(f"run directory: {cfg.output_dir}")
    return 0
