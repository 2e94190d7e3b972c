"""Issue 23, "the base is not reproducible": a tiny base is the same model whatever thread count the caller runs with,
its weights digest is recorded, and a rebuild that differs from the reference build is named."""
import json
import logging

import torch

from mmrl.checkpointing.optimizer_state import OPTIMIZER_FILE
from mmrl.tiny_world import models


def _build(tmp_path, monkeypatch, sub: str, threads: int):
    monkeypatch.setenv("MMRL_CACHE", str(tmp_path / sub))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        path = models.ensure_built("countdown3-ar", progress=False, steps=4)
        assert torch.get_num_threads() == threads  # the caller's setting is given back
    finally:
        torch.set_num_threads(before)
    return path


def test_a_build_does_not_depend_on_the_callers_thread_count(tmp_path, monkeypatch):
    one = _build(tmp_path, monkeypatch, "one", 1)
    two = _build(tmp_path, monkeypatch, "two", 2)
    digest = models.weights_digest(one)
    assert digest == models.weights_digest(two)
    assert json.loads((one / "tiny_spec.json").read_text())["weights_sha256"] == digest
    # the digest is of the weights: a changed tensor file changes it
    f = next(p for p in one.rglob("*.safetensors") if p.name != OPTIMIZER_FILE)  # (the optimizer state is not hashed)
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert models.weights_digest(one) != digest


def test_a_rebuild_unlike_the_reference_build_is_named(monkeypatch, caplog):
    version = models._torch_version()
    monkeypatch.setitem(models.REFERENCE_BUILDS, ("shapes", version), "a" * 64)
    with caplog.at_level(logging.WARNING, logger=models.logger.name):
        models._compare_with_reference("shapes", "a" * 64)
        assert not caplog.records
        models._compare_with_reference("shapes", "b" * 64)
    assert "shapes" in caplog.text and "bbbbbbbbbbbb" in caplog.text and "aaaaaaaaaaaa" in caplog.text


def test_every_reference_build_names_a_current_base():
    """A recipe change gives the base a new cache key; its old reference digest would then check nothing."""
    current = {models.model_dir(name).name for name in models.TINY_MODELS}
    stale = sorted(key for key, _ in models.REFERENCE_BUILDS if key not in current)
    assert not stale, f"reference digests of bases no longer built: {stale}"
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in models.REFERENCE_BUILDS.values())
