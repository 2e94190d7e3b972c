"""Reward functions given by import path, as TRL's command line accepts them (`--reward_funcs my_pkg.rewards.fn`).

    reward_funcs=[my_pkg.rewards.correctness]       a dotted path: module `my_pkg.rewards`, attribute `correctness`
    reward_funcs=[path/to/file.py:correctness]      a Python file and the function's name in it

A name registered in `mmrl.rewards.REWARDS` always means the registered reward; anything else that contains a `.`
or a `:` is an import path. The user's own code is imported (as `python -c "import my_pkg"` would); nothing produced
by a model is ever imported or evaluated.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable


class RewardImportError(ImportError):
    """A reward import path that does not import, or that names something that is not callable."""


def is_import_path(spec: str) -> bool:
    """Whether a reward name is an import path (`pkg.module.fn` or `file.py:fn`) rather than a registry name."""
    return isinstance(spec, str) and (":" in spec or "." in spec)


def reward_name(spec: str) -> str:
    """The name a reward given by `spec` is logged under: the function's name (`rewards/<name>/mean`, as TRL)."""
    from mmrl.rewards.reward_model import is_reward_model_dir

    if is_reward_model_dir(spec):
        return Path(spec).expanduser().resolve().name  # TRL: the last part of the model's name_or_path
    if not is_import_path(spec):
        return spec
    return spec.rsplit(":", 1)[1] if ":" in spec else spec.rsplit(".", 1)[1]


def import_reward(spec: str) -> Callable:
    """The callable named by `spec`; raises `RewardImportError` naming the path and why it did not import."""
    if ":" in spec:
        file, _, attr = spec.rpartition(":")
        path = Path(file).expanduser()
        if not path.is_file():
            raise RewardImportError(f"reward {spec!r}: file {str(path)!r} not found (form: path/to/file.py:function)")
        mod_name = f"mmrl_user_reward_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(mod_name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise RewardImportError(f"reward {spec!r}: {str(path)!r} is not an importable Python file")
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                raise RewardImportError(f"reward {spec!r}: importing {str(path)!r} raised {type(e).__name__}: {e}") from e
            sys.modules[mod_name] = module
    else:
        mod_path, _, attr = spec.rpartition(".")
        if not mod_path or not attr:
            raise RewardImportError(f"reward {spec!r} is not an import path of the form package.module.function")
        try:
            module = importlib.import_module(mod_path)
        except Exception as e:
            raise RewardImportError(f"reward {spec!r}: module {mod_path!r} does not import ({type(e).__name__}: {e}); "
                                    "is it installed or on PYTHONPATH?") from e
    if not attr or not hasattr(module, attr):
        where = file if ":" in spec else mod_path
        raise RewardImportError(f"reward {spec!r}: {where!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardImportError(f"reward {spec!r} is a {type(fn).__name__}, not a callable reward function")
    return fn
