"""The process group is destroyed at interpreter exit (`mmrl.training.process_group`)."""
import atexit

import torch.distributed as dist

from mmrl.training.process_group import destroy_at_exit, destroy_process_group_at_exit


def test_destroy_process_group_at_exit_ends_a_gloo_group_and_is_idempotent(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.is_initialized()
        destroy_process_group_at_exit()
        assert not dist.is_initialized()
        destroy_process_group_at_exit()  # nothing left to destroy: no error
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_destroy_at_exit_registers_the_handler_once(monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "register", lambda f: registered.append(f))
    monkeypatch.setattr(atexit, "unregister", lambda f: registered.remove(f) if f in registered else None)
    destroy_at_exit()
    destroy_at_exit()
    assert registered == [destroy_process_group_at_exit]
