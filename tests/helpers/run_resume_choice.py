"""Two processes (gloo) run `mmrl.checkpointing.resume.resume_run` on one run directory, each loading its own files
(`load_checkpoint(path, rank)`); each writes the checkpoint it restored, or the error that stopped it, to
`<run>/choice-<rank>.txt`.

    torchrun --nproc_per_node 2 tests/helpers/run_resume_choice.py <run_dir>
"""
import sys
from functools import partial
from pathlib import Path

import torch.distributed as dist


class Processes:
    """The part of accelerate's `Accelerator` that `resume_run` uses."""

    def __init__(self):
        self.process_index, self.num_processes = dist.get_rank(), dist.get_world_size()

    def wait_for_everyone(self):
        dist.barrier()


def main() -> None:
    from mmrl.checkpointing.checkpoint import CheckpointDamaged, load_checkpoint
    from mmrl.checkpointing.resume import resume_run

    run = Path(sys.argv[1])
    dist.init_process_group("gloo")
    acc = Processes()
    restored = []
    try:
        resume_run(run, "auto", lambda path, ck: restored.append(path.name), acc, acc.process_index == 0,
                   load=partial(load_checkpoint, rank=acc.process_index))
        out = f"resumed {restored[-1]}"
    except CheckpointDamaged as e:
        out = f"CheckpointDamaged: {e}"
    (run / f"choice-{acc.process_index}.txt").write_text(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
