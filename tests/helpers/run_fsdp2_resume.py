"""A few FSDP2 (`torch.distributed.fsdp.fully_shard`) training steps over gloo on CPU, checkpointed with mmrl's
checkpoint writer (per-rank optimizer shards and RNG states), stopped, and resumed in fresh processes; each process
then writes its final local parameters, optimizer shard and next random draws to `<out>/final-<rank>.pt`.

    torchrun --nproc_per_node 2 tests/helpers/run_fsdp2_resume.py <out> <stop_at> <save_at|0> <resume: 0|1>

With `MMRL_FSDP_DEVICE=cuda` (one GPU per process, NCCL) the data are drawn on the GPU, so the CUDA generators'
states are checked too (`benchmarks/sharded_resume_check.py`).

accelerate runs FSDP only on accelerators (on CPU it falls back to DDP), so the sharded checkpoint is exercised here
with FSDP2 applied directly; the trainer uses the same functions (`optimizer_is_sharded` decides)."""
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import numpy as np  # noqa: E402
from clean_exit import leave  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TOTAL_STEPS = 4


def main() -> None:
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    from mmrl.checkpointing.checkpoint import (latest_checkpoint, load_checkpoint, load_model_weights, save_checkpoint,
                                               verify_checkpoint)
    from mmrl.checkpointing.rank_state import (Ranks, is_sharded_optimizer, load_optimizer_shard, local_optimizer_state,
                                               restore_rng)

    torch.set_num_threads(1)
    out, stop_at, save_at, resume = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
    device = os.environ.get("MMRL_FSDP_DEVICE", "cpu")
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))  # 5 rows: uneven shards
    model.to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / (TOTAL_STEPS + 1))
    assert is_sharded_optimizer(opt)
    random.seed(100 + rank)
    np.random.seed(200 + rank)
    torch.manual_seed(300 + rank)  # (all devices' generators)
    step = 0
    if resume:
        ck_path = latest_checkpoint(out)
        assert verify_checkpoint(ck_path)
        ck = load_checkpoint(ck_path, rank, world=world, sharded=True)
        load_model_weights(model, ck_path / "model")  # the full weights, sliced into this process's shard
        load_optimizer_shard(opt, ck["optimizer"], "optimizer shard")
        sched.load_state_dict(ck["scheduler"])
        restore_rng(ck["rng"], warn=print)
        step = ck["state"]["step"]
    while step < stop_at:
        # the data come from every global generator of this process
        x = torch.randn(4, 6, device=device) * (1.0 + random.random()) + float(np.random.rand())
        model(x).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == save_at:
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

            def save_model(p: Path) -> None:
                p.mkdir()
                save_file({k: v.contiguous() for k, v in full.items()}, str(p / "model.safetensors"))

            save_checkpoint(out, step, save_model=save_model, optimizer=opt, scheduler=sched, buffer=None,
                            state={"step": step, "world": world} if rank == 0 else None, keep=2,
                            ranks=Ranks(rank, world), sharded=True)
    params = {n: p.to_local().detach().cpu().clone() for n, p in model.named_parameters()}
    draws = torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(())),
                          float(torch.rand((), device=device))], dtype=torch.float64)
    optimizer = {"state": {i: {k: v.cpu() for k, v in s.items()} for i, s in local_optimizer_state(opt)["state"].items()}}
    torch.save({"params": params, "optimizer": optimizer, "draws": draws}, out / f"final-{rank}.pt")


if __name__ == "__main__":
    main()
    leave()
