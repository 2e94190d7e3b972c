"""What each process of a run keeps in a checkpoint by itself: every random number generator's state, and its shard of
the optimizer state when the optimizer is sharded (FSDP, DeepSpeed ZeRO). This is what accelerate's `save_state` /
`load_state` keep per process (`random_states_<i>.pkl`, per-rank optimizer files); mmrl writes it itself so that it
is read back with `weights_only=True` (accelerate pickles the RNG states) and covered by the checkpoint's manifest.

Files, one per process `i` (`mmrl/checkpointing/checkpoint.py` writes them into the checkpoint's temporary directory
before the manifest, so the corruption checks cover them):
- `rng_state_<i>.pt`: the states of Python's `random`, numpy's global `np.random`, torch's CPU generator and, when CUDA
  is present, every CUDA device's generator (`capture_rng` / `restore_rng`). The trainer derives its own random
  streams from (seed, what, index) (`mmrl.core.seeds`), but user code (a reward that calls `random.random()`, a
  model with dropout) draws from these global generators, and each process's are its own.
- `optimizer_shard_<i>.pt` (sharded runs only): this process's `optimizer.state_dict()`, DTensors (FSDP2) stored as
  their local shards (`local_optimizer_state`) and made DTensors again like the parameters they belong to when loaded
  (`load_optimizer_shard`). A replicated optimizer (one process, DDP) is saved once, by the main process, as
  `optimizer.pt`.

`Ranks` holds the two object collectives a checkpoint write needs so that every process learns of a failure on any
of them (instead of waiting at a barrier for a process that has given up).
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import torch

RNG_FILE = "rng_state_{rank}.pt"
"""Per-process RNG states (HF Trainer's name `rng_state_<i>.pth`, as a weights-only torch file)."""
OPTIMIZER_SHARD_FILE = "optimizer_shard_{rank}.pt"
"""Per-process optimizer state of a sharded run."""
RANK_FILES_KEY = "rank_files"
"""Key in `trainer_state.json` recording that the checkpoint holds per-process files (absent: an older mmrl's)."""


def rng_file(rank: int) -> str:
    return RNG_FILE.format(rank=rank)


def optimizer_shard_file(rank: int) -> str:
    return OPTIMIZER_SHARD_FILE.format(rank=rank)


class Ranks:
    """This process's rank, the number of processes, and the object collectives of `torch.distributed` (no-ops for
    one process). With NCCL, the current CUDA device must be this process's (accelerate sets it)."""

    def __init__(self, rank: int = 0, world: int = 1):
        self.rank, self.world = int(rank), int(world)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """`obj` of rank 0, on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


# ================================================================================================ random generators

def capture_rng() -> dict[str, Any]:
    """This process's generator states as tensors and plain values (loadable with `weights_only=True`)."""
    version, mt, gauss_next = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {
        "python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64), "gauss_next": gauss_next},
        "numpy": {"kind": str(kind), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: dict[str, Any], warn: Callable[[str], None]) -> None:
    """Put back what `capture_rng` took. A CUDA state saved with another device count is not restored (`warn`)."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    nps = state["numpy"]
    np.random.set_state((nps["kind"], nps["key"].numpy().astype(np.uint32), int(nps["pos"]), int(nps["has_gauss"]),
                         float(nps["cached_gaussian"])))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            warn(f"the checkpoint's CUDA RNG states are for {len(cuda)} devices, this process sees "
                 f"{torch.cuda.device_count()}: CUDA generators not restored")


# ================================================================================================= optimizer shards

def is_dtensor(t: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(t, DTensor)


def optimizer_params(optimizer) -> list[torch.nn.Parameter]:
    """The parameters in `state_dict()` index order (an accelerate `AcceleratedOptimizer` is unwrapped)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return [p for group in inner.param_groups for p in group["params"]]


def is_sharded_optimizer(optimizer) -> bool:
    """True when the parameters are DTensors (FSDP2): each process holds only its shard of the optimizer state."""
    return any(is_dtensor(p) for p in optimizer_params(optimizer))


def _to_local(obj: Any) -> Any:
    if is_dtensor(obj):
        return obj.to_local().detach().clone()
    if isinstance(obj, dict):
        return {k: _to_local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_local(v) for v in obj)
    return obj


def local_optimizer_state(optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` with every DTensor replaced by this process's local shard (plain tensors). (An
    optimizer whose state dict has another layout, e.g. DeepSpeed's ZeRO optimizers, is kept as it is: each process's
    own partition.)"""
    return _to_local(optimizer.state_dict())


def load_optimizer_shard(optimizer, shard: dict[str, Any], name: str) -> None:
    """Load this process's `shard` (`local_optimizer_state`) into `optimizer`: state tensors of DTensor parameters
    become DTensors with the parameter's mesh and placements again. `name` (the file) is named if the shard does not
    fit this run's sharding (another process count or wrapping)."""
    if not (isinstance(shard, dict) and isinstance(shard.get("state"), dict) and "param_groups" in shard):
        optimizer.load_state_dict(shard)  # another layout (DeepSpeed): the optimizer's own per-process loader
        return
    params = optimizer_params(optimizer)
    state = {}
    for idx, per in shard["state"].items():
        if not 0 <= int(idx) < len(params):
            raise ValueError(f"{name}: optimizer state for parameter {idx}, this run's optimizer has {len(params)}")
        p = params[int(idx)]
        local = p.to_local() if is_dtensor(p) else p
        out = {}
        for k, v in per.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape != local.shape:
                raise ValueError(f"{name}: {k} of parameter {idx} has shape {tuple(v.shape)}, this process's shard of the "
                                 f"parameter {tuple(local.shape)} (written with another sharding or process count)")
            if is_dtensor(p) and isinstance(v, torch.Tensor) and v.dim() > 0:
                from torch.distributed.tensor import DTensor

                v = DTensor.from_local(v.to(local.device), p.device_mesh, p.placements, run_check=False,
                                       shape=p.shape, stride=p.stride())
            out[k] = v
        state[idx] = out
    optimizer.load_state_dict({"state": state, "param_groups": shard["param_groups"]})


def write_rank_files(tmp, rank: int, optimizer=None) -> None:
    """This process's files into the checkpoint's temporary directory `tmp`: its RNG states, and its optimizer shard
    when `optimizer` is given (sharded runs)."""
    torch.save(capture_rng(), tmp / rng_file(rank))
    if optimizer is not None:
        torch.save(local_optimizer_state(optimizer), tmp / optimizer_shard_file(rank))
