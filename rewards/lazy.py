"""Heavy reward models load lazily, once per process per configuration: `mmrl.core.lazy` (one cache for rewards,
GenEval's colour classifier and the open_clip loader of `mmrl.models.open_clip`), under its old import path."""
from mmrl.core.lazy import clear, load_once, loaded_keys

__all__ = ["clear", "load_once", "loaded_keys"]
