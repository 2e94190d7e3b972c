"""Full weights in checkpoints of sharded runs (FSDP, DeepSpeed ZeRO-3): each process holds only a shard, so the
adapter's `save_pretrained` alone would write the main process's shard. `gather_full_state_dict` collects the full
state dict through accelerate's state-dict API (a collective: every process calls it); `write_full_weights`
replaces the weights `save_pretrained` wrote with it (safetensors, the keys of the unwrapped model, which is what
`mmrl.checkpointing.checkpoint.load_model_weights` reads)."""
from __future__ import annotations

from pathlib import Path

import torch


def is_sharded(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def gather_full_state_dict(accelerator, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The full (unsharded) state dict on the main process, None elsewhere and for runs that are not sharded."""
    if not is_sharded(accelerator):
        return None
    state = accelerator.get_state_dict(model, unwrap=True)
    if not accelerator.is_main_process:
        return None
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}


def write_full_weights(model_dir: Path, state: dict[str, torch.Tensor]) -> None:
    """Replace the safetensors weights in `model_dir` by `state` (one `model.safetensors`)."""
    from safetensors.torch import save_file

    for old in [*model_dir.glob("*.safetensors"), *model_dir.glob("*.safetensors.index.json")]:
        old.unlink()
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


def optimizer_is_sharded(accelerator, optimizer) -> bool:
    """Each process holds only a shard of the optimizer state: FSDP, DeepSpeed, or DTensor parameters (FSDP2 applied
    directly); its checkpoint then keeps one optimizer file per process (`mmrl.checkpointing.rank_state`)."""
    from mmrl.checkpointing.rank_state import is_sharded_optimizer

    return is_sharded(accelerator) or is_sharded_optimizer(optimizer)
