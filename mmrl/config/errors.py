"""The configuration's error type, in its own module so that `mmrl.config.train_config` and its helpers (`mmrl.config.aliases`)
can both raise it without importing each other."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value; the message names the field, the value and what is allowed."""
