"""`TrainConfig` on transformers' `HfArgumentParser` (TRL's parser): the command line, and the typing of every value.

One option per field (`--num_generations 4`, `--num-generations=4`; a boolean alone is true, `--no_progress_bar`
switches a default-true one off; a list takes the words up to the next option), its help from the field's
metadata; TRL's spellings of `mixed_precision` and `resume_from` (`--bf16`, `--fp16`, `--resume_from_checkpoint`,
`--dtype`, `--disable_tqdm`, `mmrl.config.aliases`) are options too; `--config` names the YAML preset.

The same parser types every value, wherever it comes from: a string in a YAML file or a Python dict is read as the
command-line word it would be (argparse's rule for string defaults; TRL's `TrlParser` feeds YAML to the parser the
same way), other values are checked against the field's annotation (an int where a float is annotated widens).
Fields whose annotation `HfArgumentParser` does not take (a mapping, `float | int`) read their word as YAML.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import types
import typing
from typing import Any

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from mmrl.config.errors import ConfigError

NULL_WORDS = ("none", "null")
"""Words that mean None for an optional field (YAML's null, Python's None)."""

BOOL_WORDS = ("yes", "true", "t", "y", "1", "no", "false", "f", "n", "0")
"""The words transformers' `string_to_bool` reads."""


def yaml_word(word: str) -> Any:
    """A command-line word read as a YAML value (`{enable_thinking: false}`, `[1, 2]`, `3`); not YAML: the word."""
    try:
        return yaml.safe_load(word) if word.strip() else word
    except yaml.YAMLError:
        return word


def _optional(tp: type) -> typing.Callable[[str], Any]:
    """`tp`'s own conversion of a word, with the null words meaning None."""

    def convert(word: str) -> Any:
        return None if word.lower() in NULL_WORDS else tp(word)

    convert.__name__ = tp.__name__
    return convert


def _members(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _list_item(tp: Any) -> Any:
    """The item type of a list annotation (`list[str]`, `list[float] | None`, `list[str] | str`), else None."""
    for member in _members(tp):
        if typing.get_origin(member) is list:
            return (typing.get_args(member) or (str,))[0]
    return None


def parser_type(tp: Any) -> Any:
    """The annotation `HfArgumentParser` is given for a field annotated `tp`: its own handling for booleans and
    lists, a word conversion (a function) for the rest."""
    members = [m for m in _members(tp) if m is not type(None)]
    if members == [bool]:
        return tp  # HfArgumentParser's flags: `--x`, `--x false`, `--no_x`
    item = _list_item(tp)
    if item is not None:
        return list[word_type(item)]  # nargs="+"
    return word_type(tp)


def word_type(tp: Any) -> typing.Callable[[str], Any]:
    """How one command-line word becomes a value of a field annotated `tp`."""
    members = [m for m in _members(tp) if m is not type(None)]
    optional = len(members) < len(_members(tp))
    if members == [bool]:
        return _optional(string_to_bool) if optional else string_to_bool
    if len(members) == 1 and members[0] in (int, float, str):
        return _optional(members[0]) if optional else members[0]
    return yaml_word  # mappings, `float | int`


class ConfigParser(HfArgumentParser):
    """`HfArgumentParser` over a config dataclass (`TrainConfig`), plus TRL's alias options and `--config`.

    Only what the command line gives reaches the namespace (every default is `argparse.SUPPRESS`): the fields left
    out stay unset, so that the method's defaults fill them (`TrainConfig.__init__`). Errors raise `ConfigError`.
    """

    def __init__(self, dtype: Any, **kwargs: Any):
        super().__init__(dtype, **kwargs)
        self.add_argument("--config", help="YAML preset (configs/*.yaml); also the first word without `--`")
        from mmrl.config.aliases import INVERTED, PRECISION_FLAGS, RENAMED

        for name in [*PRECISION_FLAGS, *INVERTED]:
            self.add_argument(f"--{name}", type=string_to_bool, nargs="?", const=True, help=f"TRL's {name} (mmrl.config.aliases)")
        hints = typing.get_type_hints(dtype)
        for name, field in RENAMED.items():
            self.add_argument(f"--{name}", type=word_type(hints[field]) if name != "resume_from_checkpoint" else yaml_word,
                              help=f"TRL's name of {field}")
        self.flags: set[str] = set()
        """Options that may stand alone (`--bf16`): booleans that take an optional word."""
        for action in self._actions:
            if not isinstance(action, argparse._HelpAction):
                action.default = argparse.SUPPRESS
            if action.nargs == "?" and action.const is True:
                self.flags.update(action.option_strings)

    def _add_dataclass_arguments(self, dtype: Any) -> None:
        """Each public field as `HfArgumentParser` takes it (`_parse_dataclass_field`): `parser_type`'s annotation
        and only the `help` of its metadata (the other keys, `range`, `choices`, ..., are mmrl's rules, checked by
        `check_fields`). The dataclass's own fields are left untouched."""
        hints = typing.get_type_hints(dtype)
        for field in dataclasses.fields(dtype):
            if field.init and not field.name.startswith("_"):
                view = dataclasses.field(default=field.default, default_factory=field.default_factory,
                                         metadata={"help": field.metadata.get("help", "").replace("%", "%%")})  # argparse %-formats help
                view.name, view.type = field.name, parser_type(hints[field.name])
                self._parse_dataclass_field(self, view)

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


@functools.lru_cache(maxsize=4)
def _field_types(dtype: Any) -> dict[str, tuple[Any, typing.Callable[[str], Any]]]:
    """Field -> (its annotation, the conversion of one word: of one list item, for a list field)."""
    return {name: (tp, word_type(_list_item(tp) or tp)) for name, tp in typing.get_type_hints(dtype).items()}


def type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")


def typed(dtype: Any, name: str, value: Any) -> Any:
    """`value` (from YAML, a dict, or the command line) as a value of field `name` of dataclass `dtype`, or
    `ConfigError` naming both."""
    tp, convert = _field_types(dtype)[name]
    try:
        if isinstance(value, str) and value.lower() in NULL_WORDS and type(None) in _members(tp):
            return None
        if _list_item(tp) is not None and isinstance(value, str) and str not in _members(tp):
            value = yaml_word(value) if value.strip().startswith("[") else [v for v in value.split(",") if v.strip()]
        elif _list_item(tp) is not None and isinstance(value, str):  # `list[str] | str`: a comma list or the word
            value = [v for v in value.split(",") if v.strip()]
        elif isinstance(value, str) and str not in _members(tp):
            value = convert(value)  # a word, as the command line reads it
        return _checked(value, tp)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
        if value is None:
            raise ConfigError(f"{name}: None is not allowed (expected {type_name(tp)})") from None
        raise ConfigError(f"{name}={value!r}: expected {type_name(tp)} ({e})") from None


def _checked(value: Any, tp: Any) -> Any:
    """`value` if it is of annotation `tp` (an int for a float widens, a whole float for an int narrows, a list's
    items are checked), else TypeError."""
    for member in _members(tp):
        if member is type(None) and value is None:
            return None
        if member is bool and isinstance(value, bool):
            return value
        if member is int and isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
            return int(value)
        if member is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if member is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if (member is dict or typing.get_origin(member) is dict) and isinstance(value, dict):
            return dict(value)
        if typing.get_origin(member) is list and isinstance(value, (list, tuple)):
            (item,) = typing.get_args(member) or (str,)
            return [_checked(word_type(item)(v) if isinstance(v, str) and item is not str else v, item) for v in value]
    raise TypeError(f"got {type(value).__name__}")


def parse_command_line(argv: list[str], parser: ConfigParser) -> tuple[str | None, dict[str, Any], list[str]]:
    """`mmrl train`'s arguments as (YAML path, values given, the words left over).

    `key=value` words are overrides as in `load_config` (the value read as YAML); the first other word without
    `--` is the YAML preset (as `--config`); everything else is `ConfigParser`'s (a flag followed by a word that is
    not a boolean stands alone). Unknown options are left over.
    """
    overrides, rest = {}, []
    for i, word in enumerate(argv):
        if re.match(r"^[A-Za-z_][\w-]*=", word):
            key, raw = word.split("=", 1)
            overrides[key.replace("-", "_")] = yaml_word(raw) if raw.strip() else ""
            continue
        rest.append(word)
        if word in parser.flags and i + 1 < len(argv) and argv[i + 1].lower() not in BOOL_WORDS:
            rest.append("true")  # a flag alone before the preset's path (`--bf16 x.yaml`), not its value
    ns, left = parser.parse_known_args(rest)
    values = vars(ns)
    path = values.pop("config", None)
    positional = [w for w in left if not w.startswith("-")]
    unknown = [w for w in left if w.startswith("-")]
    if positional and path is None and not unknown:
        path, positional = positional[0], positional[1:]
    return path, {**overrides, **values}, unknown + positional
