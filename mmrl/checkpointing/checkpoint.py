"""Atomic checkpoints: everything needed to resume a run exactly, written to a temporary directory then renamed.

Layout of `<output_dir>/checkpoints/checkpoint-<step>/`:
- `model/`: the policy as `save_pretrained` writes it (weights as safetensors, tokenizer/processor,
  `mmrl_adapter.json`), or only the LoRA adapter; loadable with `mmrl.models.load_policy(family, path)`.
- the same files again at the top of the checkpoint, as hard links (no second copy on disk), so that the checkpoint
  folder itself loads as a TRL checkpoint does: `AutoModelForCausalLM.from_pretrained(".../checkpoint-N")`, or
  peft's adapter files there with the base. Where the file system has no hard links, they are copied.
- `optimizer.pt`, `scheduler.pt`: state dicts (loaded with `weights_only=True`); in a sharded run (FSDP, ZeRO)
  `optimizer_shard_<i>.pt` of every process `i` instead of `optimizer.pt`.
- `buffer.pt`: the rollout buffer in use (tensors and plain Python values only; `weights_only=True`).
- `trainer_state.json`: step, rollout count, data position, config, the metric history's last values, and
  `rank_files` (the process count, whether the optimizer is sharded).
- `rng_state_<i>.pt`: every random generator's state of process `i` (Python, numpy, torch CPU, CUDA;
  `mmrl.checkpointing.rank_state`). The trainer derives its own random streams from (seed, step); these serve user
  code that draws from the global generators. A checkpoint of an older mmrl holds `rng.pt` (torch's CPU state only)
  instead and is resumed with a warning.

A checkpoint directory either exists complete or not at all: it is written as `.tmp-checkpoint-<step>-<pid>` and
renamed; `latest_checkpoint` ignores temporary directories, so a process killed mid-write leaves the previous
checkpoint as the latest. Re-saving an existing step moves the old copy to `.old-checkpoint-<step>-<pid>` for the
instant between two renames; a kill in that instant leaves it as the checkpoint of that step. Old checkpoints are
renamed to `.trash-...` before they are deleted, so a half-deleted directory is never listed. The crash tests kill
the process at each of these places (`mmrl.core.faults`).

Integrity: `manifest.json`, written last, records the size and SHA-256 of every other file of the checkpoint.
Resuming verifies it (`verify_checkpoint`) before anything is loaded; a damaged checkpoint (a flipped byte, a
truncated or missing file, broken JSON) is named, moved aside as `.damaged-checkpoint-<step>-<pid>` (kept for
inspection, never listed, never deleted) and the newest intact one is used instead; with none intact the run stops.
Rotation never deletes the checkpoint it has just written, so the newest verified checkpoint always survives.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from mmrl.core.faults import fault_point
from mmrl.checkpointing.rank_state import RANK_FILES_KEY, Ranks, is_dtensor, optimizer_shard_file, rng_file, write_rank_files

CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
OLD_RE = re.compile(r"^\.old-checkpoint-(\d+)-\d+$")
MANIFEST = "manifest.json"
"""Per-checkpoint list of files with their size and SHA-256, written after every other file."""


class CheckpointDamaged(RuntimeError):
    """A checkpoint file is missing, truncated or does not match its recorded checksum; the message names it."""


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (one per step; a `.old-` copy only stands in for a missing step)."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for p in sorted(root.iterdir()):
        m = CKPT_RE.match(p.name) or OLD_RE.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.json").is_file():
            step = int(m.group(1))
            if step not in found or CKPT_RE.match(p.name):
                found[step] = p
    return [found[s] for s in sorted(found)]


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(output_dir: str | Path, step: int, *, save_model, optimizer, scheduler, buffer: dict | None,
                    state: dict | None, keep: int, ranks: Ranks | None = None, sharded: bool = False) -> Path | None:
    """Write checkpoint `step` atomically and keep the newest `keep` checkpoints. Returns its path (None on the
    processes other than the main one).

    Every process of the run calls it (`ranks`; default: one process). The main process writes the model
    (`save_model(path)`, the adapter's `save_pretrained`), the scheduler, the buffer, `trainer_state.json` (`state`)
    and, unless `sharded`, the optimizer state; every process writes its own RNG states and, if `sharded`, its
    optimizer shard (`mmrl.checkpointing.rank_state`). Then the main process writes the manifest over all of them,
    fsyncs and renames. A failure on any process is known to all (object collectives), the temporary directory is
    removed and every process raises, naming the process that failed; the previous checkpoint stays the latest.
    """
    ranks = ranks or Ranks()
    root = checkpoint_dir(output_dir)
    tmp: Path | None = None
    error: BaseException | None = None
    if ranks.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / f".tmp-checkpoint-{step:06d}-{os.getpid()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            check_free_space(root)
            tmp.mkdir()
        except Exception as e:
            error = e
    shared = ranks.broadcast((str(tmp) if tmp is not None else None, _describe(error)))
    if shared[1] is not None:
        if error is not None:
            raise error
        raise CheckpointWriteFailed(f"checkpoint {step}: the main process could not start it ({shared[1]})")
    tmp = Path(shared[0])
    try:
        if ranks.is_main:
            rank_files = {"world": ranks.world, "optimizer_shards": bool(sharded)}
            _write_checkpoint_files(tmp, step, save_model, None if sharded else optimizer, scheduler, buffer,
                                    {**state, RANK_FILES_KEY: rank_files})
        write_rank_files(tmp, ranks.rank, optimizer if sharded else None)
    except Exception as e:
        error = e
    failed = [(r, msg) for r, msg in enumerate(ranks.gather(_describe(error))) if msg is not None]
    if failed:
        if ranks.is_main:
            free = shutil.disk_usage(root).free
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back; the previous checkpoint stays the latest
            if error is not None and _out_of_space(error, free):
                raise OSError(errno.ENOSPC, f"No space left on device while writing checkpoint {step} to {root} "
                                            f"({free / 2**20:.0f} MiB free; the write failed with {type(error).__name__}: {error}); "
                                            "the previous checkpoint is intact: free space, then resume with resume_from=auto") from error
        if error is not None and ranks.world == 1:
            raise error
        where = "; ".join(f"rank {r}: {msg}" for r, msg in failed)
        raise CheckpointWriteFailed(f"writing checkpoint {step} to {root} failed on {where}; the previous checkpoint is "
                                    "intact: fix the cause, then resume with resume_from=auto") from error
    final = None
    if ranks.is_main:
        try:
            final = _commit_checkpoint(output_dir, root, tmp, step, keep)
        except Exception as e:
            error = e
    outcome = ranks.broadcast(_describe(error))
    if outcome is not None:
        if error is not None:
            raise error
        raise CheckpointWriteFailed(f"checkpoint {step}: the main process could not complete it ({outcome})")
    return final


class CheckpointWriteFailed(RuntimeError):
    """Writing a checkpoint failed on some process (named); the previous checkpoint is intact."""


def _describe(e: BaseException | None) -> str | None:
    return None if e is None else f"{type(e).__name__}: {e}"


def _commit_checkpoint(output_dir, root: Path, tmp: Path, step: int, keep: int) -> Path:
    """The manifest over every process's files, fsync, rename into place, rotation (main process)."""
    final = root / f"checkpoint-{step:06d}"
    write_manifest(tmp)
    fault_point("checkpoint/state", step)
    _fsync_tree(tmp)
    if final.exists():  # re-saving the same step (e.g. final save right after a periodic one)
        old = root / f".old-checkpoint-{step:06d}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point("checkpoint/renamed", step)
    for old in [c for c in list_checkpoints(output_dir)[:-keep] if c.name != final.name]:
        # (a resumed older step can sort before stale newer ones: the checkpoint just written is never rotated out)
        trash = root / f".trash-{old.name.lstrip('.')}"
        old.rename(trash)  # out of the listing at once; a kill during the deletion leaves only trash
        fault_point("checkpoint/rotating", step)
        shutil.rmtree(trash, ignore_errors=True)
    remove_stale(output_dir)
    return final


def _write_checkpoint_files(tmp: Path, step: int, save_model, optimizer, scheduler, buffer, state) -> None:
    """The main process's files (the optimizer state unless it is sharded: `optimizer` None)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint
    try:
        save_model(tmp / "model")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    link_model_files(tmp)
    fault_point("checkpoint/model", step)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    fault_point("checkpoint/optimizer", step)
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    if buffer is not None:
        torch.save(buffer, tmp / "buffer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str))


RUN_STATE_FILES = re.compile(r"^(optimizer\.pt|scheduler\.pt|rng\.pt|buffer\.pt|trainer_state\.json|manifest\.json|"
                             r"rng_state_\d+\.pt|optimizer_shard_\d+\.pt)$")
"""The checkpoint's own files at its top level; a model file of such a name is not linked over them."""


def link_model_files(ckpt: Path) -> None:
    """Hard-link every file of `ckpt/model/` (and its subfolders) into `ckpt` itself, the layout of a TRL /
    transformers checkpoint; a copy where hard links are not supported."""
    src_root = ckpt / "model"
    for src in sorted(src_root.rglob("*")):
        rel = src.relative_to(src_root)
        dst = ckpt / rel
        if src.is_dir() or src.is_symlink() or (len(rel.parts) == 1 and RUN_STATE_FILES.match(rel.name)) or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def _unique_files(root: Path):
    """(path, stat) of the regular files under `root`, each inode's first path only (hard links counted once)."""
    seen = set()
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        st = p.stat()
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            yield p, st


LOW_SPACE_BYTES = 64 * 2**20
"""Free space below which a failed checkpoint write is reported as a full disk (torch's zip writer loses the errno)."""


def _out_of_space(e: BaseException, free: int) -> bool:
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        e = e.__cause__ or e.__context__
    return free < LOW_SPACE_BYTES


def checkpoint_bytes(path: Path) -> int:
    """Total size of a checkpoint's files on disk (a hard-linked model file once)."""
    return sum(st.st_size for _, st in _unique_files(path))


def check_free_space(root: Path) -> None:
    """Refuse to start a checkpoint that cannot fit: the previous one's size is the estimate of the next one's."""
    previous = [p for p in sorted(root.glob("checkpoint-*")) if p.is_dir()]
    if not previous:
        return
    need, free = checkpoint_bytes(previous[-1]), shutil.disk_usage(root).free
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device for checkpoint in {root}: about {need / 2**20:.0f} MiB needed "
                                    f"(the size of {previous[-1].name}), {free / 2**20:.0f} MiB free; the previous checkpoint "
                                    "is intact: free space (or lower save_total_limit), then resume with resume_from=auto")


def remove_stale(output_dir: str | Path) -> None:
    """Delete what killed processes left: temporary and trash directories, superseded `.old-` copies."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return
    for stale in [*root.glob(".tmp-checkpoint-*"), *root.glob(".trash-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for old in root.glob(".old-checkpoint-*"):  # stand-ins whose step was saved again
        m = OLD_RE.match(old.name)
        if m and (root / f"checkpoint-{int(m.group(1)):06d}").is_dir():
            shutil.rmtree(old, ignore_errors=True)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(ckpt: Path) -> None:
    """Record the size and SHA-256 of every file under `ckpt` (read back from disk) in `ckpt/manifest.json`."""
    files, digests = {}, {}
    for p in sorted(ckpt.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            st = p.stat()
            key = (st.st_dev, st.st_ino)  # a hard link's content is read once
            if key not in digests:
                digests[key] = file_sha256(p)
            files[p.relative_to(ckpt).as_posix()] = {"bytes": st.st_size, "sha256": digests[key]}
    (ckpt / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1))


def verify_checkpoint(path: str | Path, under: str | None = None) -> bool:
    """Check every file of checkpoint `path` (only those under the folder `under`, e.g. "model", when given) against
    its manifest; raise `CheckpointDamaged` naming the first bad file.

    Returns False for a checkpoint without a manifest (written before manifests existed, or the file was lost:
    nothing to verify against; callers say so), True if verified."""
    path = Path(path)
    if not (path / MANIFEST).is_file():
        return False
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        items = [(str(rel), int(rec["bytes"]), str(rec["sha256"])) for rel, rec in files.items()
                 if under is None or str(rel).startswith(under.rstrip("/") + "/")]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        raise CheckpointDamaged(f"checkpoint {path}: {MANIFEST} is unreadable ({type(e).__name__}: {e})") from e
    digests: dict = {}
    for rel, size, digest in items:
        f = path / rel
        if not f.is_file():
            raise CheckpointDamaged(f"checkpoint {path}: {rel} is missing")
        st = f.stat()
        if st.st_size != size:
            raise CheckpointDamaged(f"checkpoint {path}: {rel} has {st.st_size} bytes, {size} were written (truncated or overwritten)")
        key = (st.st_dev, st.st_ino)  # hard links: one read per inode
        if key not in digests:
            digests[key] = file_sha256(f)
        if digests[key] != digest:
            raise CheckpointDamaged(f"checkpoint {path}: {rel} does not match its SHA-256 checksum (damaged on disk)")
    return True


def _read(path: Path, what: Callable[[Path], Any]) -> Any:
    """`what(path)`, with any failure to read or decode the file reported as `CheckpointDamaged` naming it."""
    try:
        return what(path)
    except FileNotFoundError as e:
        raise CheckpointDamaged(f"checkpoint {path.parent}: {path.name} is missing") from e
    except Exception as e:
        raise CheckpointDamaged(f"checkpoint {path.parent}: {path.name} cannot be read ({type(e).__name__}: {e})") from e


class CheckpointIncompatible(RuntimeError):
    """The checkpoint is intact but cannot resume this run (another process count or sharding); the message says why."""


def load_checkpoint(path: str | Path, rank: int = 0, *, world: int | None = None, sharded: bool | None = None,
                    warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Read a checkpoint's state for process `rank` (weights_only loads); the model is loaded separately from
    `path/model`. A file that cannot be read or decoded raises `CheckpointDamaged` naming it.

    `ck["rng"]` is the process's RNG states (`rank_state.capture_rng`), or `{"torch": ...}` alone for a checkpoint of
    an older mmrl (`warn` says so); `ck["optimizer"]` the full optimizer state, or the process's shard when the
    checkpoint was sharded (`ck["optimizer_sharded"]`). `world` / `sharded` (this run's): a checkpoint written with
    another process count or sharding raises `CheckpointIncompatible`, as does an older mmrl's sharded one (it holds
    the main process's optimizer shard only)."""
    path = Path(path)
    if not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{path} is not a complete mmrl checkpoint (no trainer_state.json)")

    def torch_file(p: Path) -> Any:
        return torch.load(p, weights_only=True)

    out: dict[str, Any] = {"state": _read(path / "trainer_state.json", lambda p: json.loads(p.read_text()))}
    if not isinstance(out["state"], dict) or "step" not in out["state"]:
        raise CheckpointDamaged(f"checkpoint {path}: trainer_state.json holds no training state")
    st = out["state"]
    files = st.get(RANK_FILES_KEY)
    if world is not None and int(st.get("world", 1)) != world:
        raise CheckpointIncompatible(f"checkpoint {path} was written by {st.get('world', 1)} processes; this run has "
                                     f"{world}: resume with the same number of processes")
    if files is None:  # an older mmrl's: rng.pt (torch's CPU state) and optimizer.pt of the main process only
        if sharded:
            raise CheckpointIncompatible(
                f"checkpoint {path} was written by an older mmrl, which saved only the main process's optimizer shard "
                "of a sharded (FSDP / ZeRO) run: it cannot restore the other processes' optimizer state; resume it "
                "without sharding, or start a new run in a new output_dir")
        out["rng"] = {"torch": _read(path / "rng.pt", torch_file)}
        out["optimizer"] = _read(path / "optimizer.pt", torch_file)
        out["optimizer_sharded"] = False
        if warn is not None:
            warn(f"checkpoint {path} was written by an older mmrl: it holds torch's CPU RNG state only, so the Python, "
                 "numpy and CUDA generators are not restored (the trainer's own random streams are, being derived from "
                 "the seed and the step; user code drawing from the global generators will differ)")
    else:
        if sharded is not None and bool(files.get("optimizer_shards")) != bool(sharded):
            have = "per-process optimizer shards (a sharded FSDP / ZeRO run)" if files.get("optimizer_shards") else \
                "a replicated optimizer state"
            raise CheckpointIncompatible(f"checkpoint {path} holds {have}; this run is {'' if sharded else 'not '}sharded: "
                                         "resume with the distributed setup that wrote it")
        out["rng"] = _read(path / rng_file(rank), torch_file)
        out["optimizer_sharded"] = bool(files.get("optimizer_shards"))
        out["optimizer"] = _read(path / (optimizer_shard_file(rank) if out["optimizer_sharded"] else "optimizer.pt"), torch_file)
    out["scheduler"] = _read(path / "scheduler.pt", torch_file)
    out["buffer"] = _read(path / "buffer.pt", torch_file) if (path / "buffer.pt").is_file() else None
    return out


def quarantine(path: Path) -> Path:
    """Move a damaged checkpoint out of the listing (kept as `.damaged-<name>-<pid>` for inspection)."""
    dest = path.parent / f".damaged-{path.name.lstrip('.')}-{os.getpid()}"
    path.rename(dest)
    return dest


def resume_newest_intact(candidates: list[Path], restore: Callable[[Path, dict], None],
                         warn: Callable[[str], None], load: Callable[[Path], dict] | None = None) -> tuple[Path, list[Path]]:
    """Verify and load (`load`, default `load_checkpoint`) the newest of `candidates` (oldest first) that is intact,
    passing it to `restore(path, ck)`.

    A damaged one (`CheckpointDamaged`, from the manifest check or from reading a file, `restore` included) is
    reported through `warn` and the next older one is tried. Returns (the checkpoint used, the damaged ones); raises
    `CheckpointDamaged` listing every problem if none is intact. Other errors of `restore` (settings that do not
    match) propagate at once."""
    damaged: list[Path] = []
    problems: list[str] = []
    for path in reversed(candidates):
        try:
            if not verify_checkpoint(path):
                warn(f"checkpoint {path} has no {MANIFEST} (written by an older mmrl, or the file was lost): its files "
                     "are checked only by loading them, so damage inside a tensor cannot be detected")
            restore(path, (load or load_checkpoint)(path))
            return path, damaged
        except CheckpointDamaged as e:
            damaged.append(path)
            problems.append(str(e))
            warn(f"{e}; {'trying the previous checkpoint' if path != candidates[0] else 'no older checkpoint left'}")
    raise CheckpointDamaged("no intact checkpoint to resume from: " + "; ".join(problems) +
                            ". Restore the files, resume from another copy with resume_from=<checkpoint dir>, or start "
                            "a new run in a new output_dir")


def load_model_weights(model: torch.nn.Module, model_dir: str | Path) -> None:
    """Load the weights saved in `model_dir` (full model safetensors, sharded or not, or a peft adapter) into `model`."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    if (model_dir / "adapter_model.safetensors").is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, _read(model_dir / "adapter_model.safetensors", load_file))
        return
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(_read(f, load_file))
    params = model.state_dict(keep_vars=True)
    if any(is_dtensor(v) for v in params.values()):
        # FSDP2: the full weights (read by every process) are sliced into each process's shard
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        missing, unexpected = set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        missing, unexpected = model.load_state_dict(state, strict=False)
    # tied weights (e.g. lm_head = embeddings) are saved once; a missing key is fine if it is the same tensor as a loaded one
    loaded_ids = {id(params[k]) for k in state if k in params}
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params and not is_dtensor(params[k])}

    def tied(k: str) -> bool:
        return id(params[k]) in loaded_ids or (not is_dtensor(params[k]) and params[k].data_ptr() in loaded_ptrs)

    missing = [k for k in missing if not tied(k)]
    if unexpected or missing:
        raise RuntimeError(f"checkpoint weights in {model_dir} do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
