"""`mmrl train CONFIG [key=value ...]`.

    mmrl train configs/dmpo_llada_8b_countdown.yaml model_name_or_path=/models/LLaDA-8B-Instruct
    accelerate launch --config_file configs/accelerate/zero2.yaml -m mmrl.cli train configs/... key=value
"""
from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", help="YAML preset (configs/*.yaml); optional when every key is given as an override")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of config fields (see --help-config)")
    parser.add_argument("--help-config", action="store_true", help="list every config field with its default and meaning")
    parser.add_argument("--print-config", action="store_true", help="print the resolved configuration and exit")


def run(args: argparse.Namespace) -> int:
    from mmrl.config import ConfigError, describe_fields, load_config

    if args.help_config:
        print(describe_fields())
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
    from mmrl.trainer import Trainer, TrainingError, TrainingStopped

    try:
        last = Trainer(cfg).train()
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
