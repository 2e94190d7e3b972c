"""The configuration's error type, in its own module so that `mmrl.config` and its helpers (`mmrl.config_aliases`)
can both raise it without importing each other."""
from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value; the message names the field, the value and what is allowed."""
