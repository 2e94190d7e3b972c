"""A model's pre-training AdamW state, kept for RL (issue 24 item 5, docs/RESULTS.md "Keeping the pre-training
optimizer state").

A tiny-world base build (`mmrl.tiny_world.models.ensure_built`) writes its final AdamW state next to the weights, as
`OPTIMIZER_FILE` (safetensors, never pickle): for every trainable parameter, by its name in the model,
`<name>.exp_avg`, `<name>.exp_avg_sq` (the parameter's shape) and `<name>.step` (shape [1], float32). The file is not
part of the base's identity: `weights_digest` leaves it out, so a build's digest (REFERENCE_BUILDS) is the same with
or without it. A training run with `init_optimizer_from_base` starts its AdamW from these moments
(`init_adamw_from`), so its first steps are scaled by the pre-training second moments instead of moving every weight
by about lr.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # torch is imported where it is used (the file name is read without it)
    import torch

OPTIMIZER_FILE = "optimizer_state.safetensors"
"""The file name of a base's pre-training AdamW state, next to its `model.safetensors`."""


MOMENTS = ("exp_avg", "exp_avg_sq", "step")
"""The per-parameter AdamW state kept (torch.optim.AdamW's names)."""


def named_trainable(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every trainable parameter, in `model.parameters()` order (shared ones once)."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def adamw_state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The AdamW state of `optimizer` over `model`'s parameters as flat tensors by parameter name (`<name>.<moment>`);
    a parameter the optimizer has not stepped yet has no state and is left out."""
    import torch

    out: dict[str, torch.Tensor] = {}
    for name, p in named_trainable(model):
        st = optimizer.state.get(p)
        if not st:
            continue
        out[f"{name}.exp_avg"] = st["exp_avg"].detach().float().cpu().contiguous()
        out[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].detach().float().cpu().contiguous()
        out[f"{name}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1).cpu()
    return out


def save_adamw_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | Path) -> Path:
    """Write `adamw_state_tensors` as `<folder>/OPTIMIZER_FILE` (safetensors); returns the file."""
    from safetensors.torch import save_file

    path = Path(folder) / OPTIMIZER_FILE
    save_file(adamw_state_tensors(model, optimizer), str(path), metadata={"format": "mmrl-adamw-state", "moments": ",".join(MOMENTS)})
    return path


def load_adamw_state(path: str | Path) -> dict[str, dict[str, torch.Tensor]]:
    """{parameter name: {"exp_avg", "exp_avg_sq", "step"}} read from an `OPTIMIZER_FILE` (safetensors)."""
    from safetensors.torch import load_file

    flat = load_file(str(path))
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, _, moment = key.rpartition(".")
        if moment not in MOMENTS:
            raise ValueError(f"{path}: unknown entry {key!r} (each key is <parameter name>.<one of {MOMENTS}>)")
        out.setdefault(name, {})[moment] = t
    if bad := [n for n, st in out.items() if set(st) != set(MOMENTS)]:
        raise ValueError(f"{path}: parameter {bad[0]!r} lacks part of its state (has {sorted(out[bad[0]])}, needs {list(MOMENTS)})")
    return out


def init_adamw_from(optimizer: torch.optim.Optimizer, named: Iterable[tuple[str, torch.nn.Parameter]],
                    state: dict[str, dict[str, torch.Tensor]], source: str = "the optimizer file") -> int:
    """In place: give every parameter of `named` the saved AdamW moments of the parameter of the same name in
    `state` (`load_adamw_state`), as torch.optim.AdamW keeps them (`step` a float32 scalar tensor), so the next
    `optimizer.step()` continues the saved run's AdamW. Names must match both ways and shapes must agree (a
    ValueError naming the first mismatch otherwise). Returns the number of parameters initialised."""
    import torch

    named = list(named)
    own = {n for n, _ in named}
    if missing := [n for n in own if n not in state]:
        raise ValueError(f"{source} has no AdamW state for parameter {missing[0]!r} ({len(missing)} of {len(own)} missing): "
                         "it was saved for another model")
    if extra := [n for n in state if n not in own]:
        raise ValueError(f"{source} has AdamW state for {extra[0]!r}, which this model has no trainable parameter of "
                         f"({len(extra)} such): it was saved for another model")
    for name, p in named:
        st = state[name]
        for m in ("exp_avg", "exp_avg_sq"):
            if tuple(st[m].shape) != tuple(p.shape):
                raise ValueError(f"{source}: {name}.{m} has shape {tuple(st[m].shape)}, the parameter {tuple(p.shape)}")
        optimizer.state[p] = {"step": st["step"].reshape(()).to(torch.float32).clone(),
                              "exp_avg": st["exp_avg"].to(device=p.device, dtype=p.dtype).clone(),
                              "exp_avg_sq": st["exp_avg_sq"].to(device=p.device, dtype=p.dtype).clone()}
    return len(named)


def pretraining_optimizer_file(source: str) -> Path:
    """The `OPTIMIZER_FILE` of a model source: a `PREFIX:NAME` source's registered lookup
    (`mmrl.core.registry.OPTIMIZER_STATES`; the tiny world's names the command that rebuilds a base without it) or
    `<folder>/OPTIMIZER_FILE` of a local model folder. FileNotFoundError, one line, when there is none."""
    from mmrl.core.registry import OPTIMIZER_STATES

    prefix, sep, name = str(source).partition(":")
    if sep and prefix in OPTIMIZER_STATES:
        return OPTIMIZER_STATES[prefix](name)
    path = Path(source).expanduser() / OPTIMIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"init_optimizer_from_base: {source} has no {OPTIMIZER_FILE} (no pre-training optimizer "
                                "state was saved with this model; the tiny-world bases of `mmrl pretrain-tiny` keep theirs)")
    return path
