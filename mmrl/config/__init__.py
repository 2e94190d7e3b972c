"""TrainConfig, its presets and aliases, YAML / CLI loading and validation.

`from mmrl.config import TrainConfig, load_config` is the public path; the definitions live in
`mmrl.config.train_config`.
"""
from mmrl.config.errors import ConfigError
from mmrl.config.train_config import METHOD_DEFAULTS, TrainConfig, build_config, describe_fields, field_docs, load_config

__all__ = ["ConfigError", "METHOD_DEFAULTS", "TrainConfig", "build_config", "describe_fields", "field_docs", "load_config"]
