"""Samplers for masked-diffusion language models (LLaDA, Dream, Fast-dLLM, random order with exact log-probs).

Every sampler starts from `x = prompt ⊕ gen_length × [MASK]` and fills the masks in; it only needs a logits
function over the whole sequence:

- `logits_fn(x) -> [B, L, V]` (required): logits at every position, already aligned so that position i predicts
  token i (Dream's right shift is undone by the caller, see `models.dllm_backbone`).
- `logits_fn.window(x, start, end=None) -> [B, end - start, V]` (optional): the same logits for positions
  start .. end-1 only (end: L when None; saves the LM head on the prompt and on the suffix after the block).
- `logits_fn.prefill(x, start, end=None)` / `logits_fn.suffix(x, start, end=None)` (optional, Fast-dLLM's prefix
  cache): `prefill` runs a full forward, returns positions start .. end-1 and keeps the keys/values; `suffix` feeds
  only `x[:, start:]` and attends to the keys/values of positions < start kept by the last `prefill`.
- `logits_fn.block(x, start, end)` (optional, Fast-dLLM's dual cache, with `supports_dual_cache`): feeds only
  `x[:, start:end]` and attends to the keys/values of all other positions kept by the last `prefill`.

Shapes: B rows, P prompt width (left padded), L = P + gen_length, V vocabulary, W block width. All samplers run
row-independent arithmetic; randomness comes from `generator`: a `torch.Generator` (one draw for the whole batch)
or `RowStreams` (one stream per row), with which a row's result depends only on its prompt and its seed, not on
the other rows of the batch (up to floating point).

Sources (facts and equations, not code): LLaDA `generate.py` (ML-GSAI/LLaDA, Nie et al. 2025); Dream
`generation_utils.py` (HKUNLP/Dream, Ye et al. 2025); Fast-dLLM `generate.py` (NVlabs/Fast-dLLM, Wu et al.,
arXiv 2505.22618); DMPO's random-order (ROAR) sampler (yuchen-zhu-zyc/DMPO, arXiv 2510.08233).
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from mmrl.models.base import selective_log_softmax

LogitsFn = Callable[[torch.Tensor], torch.Tensor]

REMASKING = ("low_confidence", "random")
SUPPRESSED_LOGIT = -1.0e4
"""Logit given to tokens that must never be produced (the mask token): finite, so that entropies and KLs over a
row stay finite (0 * log 0 would be NaN at -inf), yet exp(-1e4) underflows to exactly 0 probability."""


def suppress_tokens(logits: torch.Tensor, token_ids) -> torch.Tensor:
    """Set `logits[..., token_ids]` to `SUPPRESSED_LOGIT` in place and return the tensor.

    The samplers never produce the mask token: a trained model gives it ~0 probability, an untrained one may
    predict it and would then leave the position masked forever.
    """
    if len(token_ids):
        logits[..., list(token_ids)] = SUPPRESSED_LOGIT
    return logits
DREAM_ORDERS = ("entropy", "maskgit_plus", "topk_margin")


# --------------------------------------------------------------------------------------------- small pieces
def block_schedule(gen_length: int, block_length: int, steps: int | None) -> tuple[int, int]:
    """(num_blocks, steps_per_block) of LLaDA's semi-autoregressive schedule; bad values raise naming them.

    LLaDA `generate`: `gen_length % block_length == 0` and `steps % num_blocks == 0`. `steps=None` means one
    step per block (for samplers that choose their own number of steps).
    """
    for name, v in (("gen_length", gen_length), ("block_length", block_length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if gen_length % block_length:
        raise ValueError(f"gen_length ({gen_length}) must be divisible by block_length ({block_length})")
    num_blocks = gen_length // block_length
    if steps is None:
        return num_blocks, 1
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if steps % num_blocks:
        raise ValueError(
            f"steps ({steps}) must be divisible by the number of blocks gen_length/block_length = {num_blocks}"
        )
    return num_blocks, steps // num_blocks


def num_transfer_tokens(mask_count: torch.Tensor, steps: int) -> torch.Tensor:
    """[B] masked tokens of a block -> [B, steps] tokens to reveal at each step (LLaDA `get_num_transfer_tokens`).

    The count is spread evenly: `count // steps` per step, the first `count % steps` steps one more.
    """
    base = mask_count // steps  # [B]
    rem = mask_count % steps  # [B]
    extra = torch.arange(steps, device=mask_count.device)[None, :] < rem[:, None]  # [B, S]
    return base[:, None] + extra.long()  # [B, S]


class RowStreams:
    """Per-row random streams: row b draws from its own generator seeded with `seeds[b]`.

    A row's random numbers then depend only on its seed and on how many draws it made, not on the other rows
    of the batch (the convention of `models.sampling` for the autoregressive samplers). Generators live on
    `device`, so draws are reproducible per device type.
    """

    def __init__(self, seeds, device: torch.device | str = "cpu"):
        self.seeds = [int(s) for s in torch.as_tensor(seeds).reshape(-1).tolist()]
        self.device = torch.device(device)
        self.gens = [torch.Generator(device=self.device).manual_seed(s) for s in self.seeds]

    @classmethod
    def from_generator(cls, num_rows: int, generator: torch.Generator | None, device="cpu") -> "RowStreams":
        """N row seeds drawn from `generator` (torch's default generator if None)."""
        gen_device = generator.device if generator is not None else "cpu"
        seeds = torch.randint(0, 2**62, (num_rows,), generator=generator, device=gen_device)
        return cls(seeds.cpu(), device)

    def __len__(self) -> int:
        return len(self.seeds)

    def rand(self, shape, dtype=torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[B, ...] U(0, 1); only the rows in `rows` ([B] bool, default all) draw (others get 0.5)."""
        if shape[0] != len(self.gens):
            raise ValueError(f"{len(self.gens)} row streams for a batch of {shape[0]} rows")
        take = [True] * shape[0] if rows is None else rows.tolist()
        out = torch.empty(tuple(shape), device=self.device, dtype=dtype)  # [B, ...]
        for i, (g, t) in enumerate(zip(self.gens, take)):  # each row drawn straight into its slot (no stack copy)
            if t:
                torch.rand(tuple(shape[1:]), generator=g, device=self.device, dtype=dtype, out=out[i])
            else:
                out[i].fill_(0.5)
        return out

    def rand_at(self, shape, where: torch.Tensor, dtype=torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[M, V] = `rand(shape, dtype, rows)[where]` for `where` [B, ...] (bool, the leading dims of `shape`
        [B, ..., V]), without the [B, ..., V] tensor: each drawing row's stream still draws its whole [..., V] block
        (the same numbers, in the same order) into one reused buffer, of which only the positions of `where` are kept."""
        if shape[0] != len(self.gens):
            raise ValueError(f"{len(self.gens)} row streams for a batch of {shape[0]} rows")
        v = shape[-1]
        take = [True] * shape[0] if rows is None else rows.tolist()
        flat = where.reshape(shape[0], -1).to(self.device)  # [B, W]
        counts = flat.sum(-1).tolist()  # [B]
        cols = flat.nonzero()[:, 1]  # [M] positions of the kept rows, row-major as t[where]
        out = torch.empty((len(cols), v), device=self.device, dtype=dtype)  # [M, V]
        buf = torch.empty(tuple(shape[1:]), device=self.device, dtype=dtype)  # [..., V] one row's draw
        o = 0
        for g, t, n in zip(self.gens, take, counts):
            if t:
                torch.rand(tuple(shape[1:]), generator=g, device=self.device, dtype=dtype, out=buf)
                if n:
                    torch.index_select(buf.reshape(-1, v), 0, cols[o:o + n], out=out[o:o + n])
            elif n:
                out[o:o + n].fill_(0.5)
            o += n
        return out


def _uniform(shape, generator, device, dtype=torch.float32, rows: torch.Tensor | None = None) -> torch.Tensor:
    """U(0, 1) of `shape` ([B, ...]): per-row streams, or one batch draw from a generator on its own device."""
    if isinstance(generator, RowStreams):
        return generator.rand(shape, dtype, rows).to(device)
    gen_device = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=gen_device, dtype=dtype).to(device)


def _uniform_at(shape, generator, device, dtype, where: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """[M, V] = `_uniform(shape, ...)[where]`: the same numbers, drawn per row (`RowStreams.rand_at`) without the
    [B, ..., V] tensor, or drawn whole and gathered (one generator: its draw order is the whole tensor's)."""
    if isinstance(generator, RowStreams):
        return generator.rand_at(shape, where, dtype, rows).to(device)
    return _uniform(shape, generator, device, dtype, rows)[where]


GUMBEL_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
"""Precisions of the Gumbel-max draw: float64 (LLaDA's `add_gumbel_noise`, exact sampling) or the model's dtype,
as d1's diffu-GRPO rollouts draw (`add_gumbel_noise(logits, temperature, dtype=model.dtype)`, bfloat16)."""


def _gumbel_pick(logits: torch.Tensor, u: torch.Tensor, temperature: float, noise_dtype: str) -> torch.Tensor:
    """[..., V] logits and their U(0, 1) draw `u` (same shape, dtype of `noise_dtype`; overwritten) -> [...]
    Gumbel-max sample (`gumbel_argmax`); elementwise up to the argmax, so a row's result depends only on that row's
    logits and noise. The steps are those of `argmax(logits / T - log(-log U))` (float64) and of
    `argmax(exp(logits) / (-log U)^T)` (d1's dtype), in place on private copies (no new buffers): the same bits."""
    if noise_dtype != "float64":
        e = logits.to(GUMBEL_DTYPES[noise_dtype], copy=True).exp_()  # [..., V]
        return e.div_(u.log_().neg_().pow_(temperature)).argmax(-1)
    g = u.clamp_(min=1e-300).log_().neg_().log_()  # [..., V] log(-log U)
    scores = logits.to(torch.float64, copy=True)  # [..., V]
    if temperature != 1.0:  # x / 1 is x: the division is skipped, not changed
        scores.div_(temperature)
    return scores.sub_(g).argmax(-1)


def gumbel_argmax(logits: torch.Tensor, temperature: float, generator=None, rows: torch.Tensor | None = None,
                  noise_dtype: str = "float64", where: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] -> [...] a sample of `softmax(logits / temperature)`; the argmax at temperature 0.

    LLaDA `add_gumbel_noise` draws in float64 and takes `argmax(exp(logits) / (-log U)^temperature)`; its log is
    `temperature * (logits / temperature - log(-log U))`, the Gumbel-max trick, computed here in log space
    (same argmax, no overflow of `exp`). `generator`: a `torch.Generator`, `RowStreams` or None; with row streams
    only `rows` ([B] bool) draw.

    `where` ([...] bool, optional): the positions whose sample is used (the masked ones). U is still drawn for every
    position, in the same shape and order, so the random streams advance exactly as without it and the samples at
    `where` are bitwise the same; the Gumbel scores and the argmax are computed on those positions' rows only
    (issue 29: a sampler step unmasks only masked positions); other positions get 0.

    `noise_dtype="bfloat16"` (or "float32") reproduces d1's rollouts (dllm-reasoning/d1 `diffu_grpo_trainer.py`
    `add_gumbel_noise(..., dtype=model.dtype)`): U drawn in that dtype and `exp(logits) / (-log U)^temperature`
    evaluated in it, as written, so rounding ties (argmax takes the first) and the coarse U grid bias the draw
    towards the most likely tokens: lower entropy than `softmax(logits / temperature)`.
    """
    if where is not None and tuple(where.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"where must have the logits' leading shape {tuple(logits.shape[:-1])}, got {tuple(where.shape)}")
    if temperature == 0:
        if where is None:
            return logits.argmax(-1)
        return _scatter_rows(logits[where].argmax(-1), where)
    if noise_dtype not in GUMBEL_DTYPES:
        raise ValueError(f"unknown gumbel noise dtype {noise_dtype!r}; valid: {list(GUMBEL_DTYPES)}")
    dtype = GUMBEL_DTYPES[noise_dtype]
    if where is None:
        return _gumbel_pick(logits, _uniform(logits.shape, generator, logits.device, dtype, rows), temperature, noise_dtype)
    u = _uniform_at(logits.shape, generator, logits.device, dtype, where, rows)  # [M, V]
    return _scatter_rows(_gumbel_pick(logits[where], u, temperature, noise_dtype), where)


def _scatter_rows(values: torch.Tensor, where: torch.Tensor, fill=0) -> torch.Tensor:
    """[M] values of the True positions of `where` [...] (in row-major order, as `t[where]` gathers them) -> [...]
    with `fill` elsewhere."""
    out = torch.full(where.shape, fill, dtype=values.dtype, device=values.device)
    out[where] = values
    return out


def picked_confidence(logits: torch.Tensor, x0: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """[B, W] `softmax(logits)[x0]` (float32) at the positions of `where` [B, W] (bool), -inf elsewhere, from logits
    [B, W, V]: LLaDA's / Fast-dLLM's low-confidence score, computed on the masked positions' rows only (the same
    numbers as the softmax over the whole window: softmax works row by row)."""
    sel = torch.softmax(logits[where].float(), dim=-1).gather(-1, x0[where][:, None]).squeeze(-1)  # [M]
    return _scatter_rows(sel, where, -torch.inf)


def top_k_mask(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[B, W] bool: the `k[b]` most confident positions of row b (per-row `torch.topk`, vectorised).

    Positions at -inf are never chosen as long as `k[b]` does not exceed the row's finite entries.
    """
    out = torch.zeros_like(confidence, dtype=torch.bool)  # [B, W]
    kmax = int(k.max()) if k.numel() else 0
    if kmax <= 0:
        return out
    idx = confidence.topk(kmax, dim=-1).indices  # [B, kmax]
    keep = torch.arange(kmax, device=confidence.device)[None, :] < k[:, None]  # [B, kmax]
    return out.scatter(1, idx, keep)


def _window(logits_fn, x: torch.Tensor, start: int, end: int | None = None) -> torch.Tensor:
    """[B, end - start, V] logits of positions start .. end-1 (end: L when None), through `logits_fn.window` when it
    exists (which may run the LM head on those positions only)."""
    window = getattr(logits_fn, "window", None)
    if window is not None:
        return window(x, start, end)
    return logits_fn(x)[:, start:end]


CACHE_MODES = (None, "prefix", "dual")


def supports_prefix_cache(logits_fn) -> bool:
    """Whether `logits_fn` offers Fast-dLLM's prefix cache (`prefill` and `suffix`) and says it can use it."""
    return (
        callable(getattr(logits_fn, "prefill", None))
        and callable(getattr(logits_fn, "suffix", None))
        and bool(getattr(logits_fn, "supports_cache", True))
    )


class _BlockLogits:
    """Logits of the current block [B, W, V], from a full forward or over Fast-dLLM's block-wise KV cache.

    `cache="prefix"` (PrefixCache): the first step of each block is a full forward that keeps the keys/values; later
    steps feed the block and the masked suffix after it, over the kept prefix. `cache="dual"` (DualCache): later
    steps feed only the block, over the kept prefix and the kept suffix. The cache is refreshed at every block, so
    it is approximate inside a block (bidirectional attention would update the kept entries).
    """

    def __init__(self, logits_fn, cache: str | None, mask_id: int):
        if cache is True:
            cache = "prefix"
        if cache not in CACHE_MODES:
            raise ValueError(f"unknown cache mode {cache!r}; valid: {list(CACHE_MODES)}")
        self.fn = logits_fn
        self.mask_id = mask_id
        self.mode = cache if cache and supports_prefix_cache(logits_fn) else None
        if cache and self.mode is None:
            kind = getattr(logits_fn, "kind", "this")
            warnings.warn(f"the {kind} backbone offers no KV cache (LLaDA's and Dream's own modeling code have none): "
                          f"decoding without it, every step a full forward over the prompt and the whole generated span",
                          stacklevel=3)
        has_dual = callable(getattr(logits_fn, "block", None)) and getattr(logits_fn, "supports_dual_cache", False)
        if self.mode == "dual" and not has_dual:
            warnings.warn("this backbone offers no dual cache; using the prefix cache", stacklevel=3)
            self.mode = "prefix"

    def __call__(self, x: torch.Tensor, start: int, end: int, first_step: bool) -> torch.Tensor:
        # logits of the block only (not of the suffix after it): the LM head skips the positions no step reads
        if self.mode is None:
            out = _window(self.fn, x, start, end)
        elif first_step:
            out = self.fn.prefill(x, start, end)
        elif self.mode == "dual":
            out = self.fn.block(x, start, end)
        else:
            out = self.fn.suffix(x, start, end)
        return suppress_tokens(out[:, : end - start], (self.mask_id,))  # [B, W, V]


def _init_canvas(prompt_ids: torch.Tensor, gen_length: int, mask_id: int, init: torch.Tensor | None = None) -> torch.Tensor:
    """[B, P] prompt -> [B, P + gen_length] with the generated span all masks, or `init` [B, gen_length] (infilling:
    positions holding a token other than `mask_id` are given and never resampled)."""
    if prompt_ids.dim() != 2:
        raise ValueError(f"prompt_ids must be [B, P], got shape {tuple(prompt_ids.shape)}")
    if init is None:
        span = torch.full((prompt_ids.shape[0], gen_length), mask_id, dtype=prompt_ids.dtype, device=prompt_ids.device)
    else:
        if tuple(init.shape) != (prompt_ids.shape[0], gen_length):
            raise ValueError(f"init must be [B, gen_length] = [{prompt_ids.shape[0]}, {gen_length}], got {tuple(init.shape)}")
        span = init.to(device=prompt_ids.device, dtype=prompt_ids.dtype)
    return torch.cat([prompt_ids, span], dim=1)  # [B, L]


def _check_temperature(temperature: float) -> None:
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")


# --------------------------------------------------------------------------------------------- LLaDA
@torch.no_grad()
def generate_low_confidence(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    steps: int,
    mask_id: int,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    generator=None,
    cache: str | None = None,
    init: torch.Tensor | None = None,
    gumbel_dtype: str = "float64",
) -> torch.Tensor:
    """LLaDA's semi-autoregressive sampler -> ids [B, P + gen_length].

    LLaDA `generate` (Nie et al. 2025, App. B): the generated span is cut into blocks of `block_length`, decoded
    left to right with `steps / num_blocks` steps each; a block's masked count is spread evenly over its steps
    (`num_transfer_tokens`). Each step predicts x0 = Gumbel-max sample of the logits (argmax at temperature 0),
    scores every masked position of the current block by `softmax(logits)[x0]` (`"low_confidence"`) or by
    U(0, 1) (`"random"`); positions outside the current block and already decoded ones get -inf; the top-k
    positions take their x0. `cache="prefix"` / `"dual"` runs the steps after the first of each block over Fast-dLLM's
    prefix / dual KV cache (DMPO's default training sampler: two tokens per step over the prefix cache).
    `gumbel_dtype`: the precision of the Gumbel-max draw (`gumbel_argmax`; "bfloat16" = d1's rollouts).
    """
    if remasking not in REMASKING:
        raise ValueError(f"unknown remasking {remasking!r}; valid: {list(REMASKING)}")
    _check_temperature(temperature)
    num_blocks, spb = block_schedule(gen_length, block_length, steps)
    x = _init_canvas(prompt_ids, gen_length, mask_id, init)  # [B, L]
    p = prompt_ids.shape[1]
    block_logits = _BlockLogits(logits_fn, cache, mask_id)
    for b in range(num_blocks):
        s, e = p + b * block_length, p + (b + 1) * block_length
        k_sched = num_transfer_tokens((x[:, s:e] == mask_id).sum(-1), spb)  # [B, spb]
        for i in range(spb):
            masked = x[:, s:e] == mask_id  # [B, W]
            logits = block_logits(x, s, e, first_step=i == 0)  # [B, W, V]
            # x0 and its confidence only at the masked positions (the only ones a step can unmask)
            x0 = gumbel_argmax(logits, temperature, generator, noise_dtype=gumbel_dtype, where=masked)  # [B, W]
            if remasking == "low_confidence":
                conf = picked_confidence(logits, x0, masked)  # [B, W], -inf where not masked
            else:
                conf = _uniform(masked.shape, generator, x.device)  # [B, W]
                conf = torch.where(masked, conf, torch.full_like(conf, -torch.inf))  # [B, W]
            pick = top_k_mask(conf, k_sched[:, i])  # [B, W]
            x[:, s:e] = torch.where(pick, x0, x[:, s:e])
    return x


# --------------------------------------------------------------------------------------------- Dream
def top_p_filter(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """[..., V] logits with everything outside the nucleus of mass `top_p` set to -inf (the top token is kept)."""
    if top_p is None or top_p >= 1.0:
        return logits
    if not 0.0 < top_p:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [..., V]
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)  # [..., V]
    drop_sorted = cum > top_p
    drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # [..., V]
    return logits.masked_fill(drop, -torch.inf)


def dream_confidence(
    logits: torch.Tensor,
    alg: str,
    *,
    temperature: float = 0.0,
    top_p: float | None = None,
    generator=None,
    where: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence [...], x0 [...]) of Dream's ordering rules on logits [..., V].

    Dream `sample_tokens` (HKUNLP/Dream `generation_utils.py`): logits divided by the temperature, nucleus
    filtered, `probs = softmax`; x0 = a sample (temperature > 0) or the argmax; confidence of `"maskgit_plus"`
    = probs[x0], `"topk_margin"` = top1 - top2 probability, `"entropy"` = sum p log p (the negative entropy, so
    higher = more confident).

    `where` ([...] bool, optional): compute only at those positions (confidence -inf and x0 0 elsewhere); the noise
    is still drawn for every position, so the results at `where` are the same as without it.
    """
    if alg not in DREAM_ORDERS:
        raise ValueError(f"unknown Dream order {alg!r}; valid: {list(DREAM_ORDERS)}")
    u = None
    if where is not None:
        if tuple(where.shape) != tuple(logits.shape[:-1]):
            raise ValueError(f"where must have the logits' leading shape {tuple(logits.shape[:-1])}, got {tuple(where.shape)}")
        if temperature > 0:  # the whole window's noise, in the shape and order of the unrestricted draw
            u = _uniform_at(logits.shape, generator, logits.device, torch.float64, where)  # [M, V]
        conf, x0 = _dream_confidence_rows(logits[where], alg, temperature, top_p, generator, u)  # [M], [M]
        return _scatter_rows(conf, where, -torch.inf), _scatter_rows(x0, where)
    return _dream_confidence_rows(logits, alg, temperature, top_p, generator, None)


def _dream_confidence_rows(logits, alg, temperature, top_p, generator, u):
    """`dream_confidence` on logits [..., V]; `u` [..., V]: the float64 noise already drawn (None: draw it here)."""
    scaled = logits.float() / temperature if temperature > 0 else logits.float()  # [..., V]
    scaled = top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled, dim=-1)  # [..., V]
    if temperature > 0:
        if u is None:
            x0 = gumbel_argmax(scaled, 1.0, generator)  # [...]
        else:
            x0 = _gumbel_pick(scaled, u, 1.0, "float64")  # [...]
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)  # [...]
    else:
        conf, x0 = probs.max(-1)  # [...]
    if alg == "topk_margin":
        top2 = probs.topk(2, dim=-1).values  # [..., 2]
        conf = top2[..., 0] - top2[..., 1]
    elif alg == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)  # [...] negative entropy
    return conf, x0


@torch.no_grad()
def generate_dream(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    *,
    gen_length: int,
    steps: int,
    mask_id: int,
    alg: str = "entropy",
    block_length: int | None = None,
    temperature: float = 0.0,
    top_p: float | None = None,
    eps: float = 1e-3,
    generator=None,
    cache: str | None = None,
    init: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dream's confidence-ordered sampler (`alg` = entropy / maskgit_plus / topk_margin) -> ids [B, P + gen_length].

    Dream `_sample`: timesteps `linspace(1, eps, steps + 1)`; at step i (t, s consecutive timesteps) a row with
    n masked tokens reveals `int(n * (1 - s / t))` of them (all remaining at the last step), the most confident
    by `dream_confidence`. The stock sampler is one block over the whole span (`block_length=None`); a smaller
    `block_length` runs the same rule block by block (steps divided evenly, as Dream's blockwise variant does).
    Dream's `alg_temp` (sampling the order) is not offered: positions are always taken top-k.
    """
    _check_temperature(temperature)
    block_length = gen_length if block_length is None else block_length
    num_blocks, spb = block_schedule(gen_length, block_length, steps)
    x = _init_canvas(prompt_ids, gen_length, mask_id, init)  # [B, L]
    p = prompt_ids.shape[1]
    timesteps = torch.linspace(1, eps, spb + 1, device=x.device)  # [spb + 1]
    block_logits = _BlockLogits(logits_fn, cache, mask_id)
    for b in range(num_blocks):
        s, e = p + b * block_length, p + (b + 1) * block_length
        for i in range(spb):
            masked = x[:, s:e] == mask_id  # [B, W]
            logits = block_logits(x, s, e, first_step=i == 0)  # [B, W, V]
            conf, x0 = dream_confidence(logits, alg, temperature=temperature, top_p=top_p, generator=generator,
                                        where=masked)  # [B, W], [B, W]: only at the masked positions
            n_mask = masked.sum(-1)  # [B]
            if i < spb - 1:
                k = (n_mask.float() * (1 - timesteps[i + 1] / timesteps[i])).long()  # [B] int() truncation
            else:
                k = n_mask
            conf = torch.where(masked, conf, torch.full_like(conf, -torch.inf))  # [B, W]
            pick = top_k_mask(conf, k)  # [B, W]
            x[:, s:e] = torch.where(pick, x0, x[:, s:e])
    return x


# --------------------------------------------------------------------------------------------- Fast-dLLM
@torch.no_grad()
def generate_threshold(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    threshold: float = 0.9,
    temperature: float = 0.0,
    cache: str | None = None,
    generator=None,
    init: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fast-dLLM's confidence-aware parallel decoding -> ids [B, P + gen_length].

    Fast-dLLM `get_transfer_index` with a threshold (Wu et al., arXiv 2505.22618, Sec. 3.3): inside the current
    block, each step reveals the most confident masked token plus every other masked token whose confidence
    `softmax(logits)[x0]` is >= `threshold` (default 0.9, the authors' scripts); a block ends when it has no mask
    left, so the number of forwards adapts to the model's confidence (at most `block_length` per block). With
    `cache="prefix"` the first step of each block is a full forward that keeps the keys/values, and later steps feed
    only the block and the masked suffix (Fast-dLLM PrefixCache); `cache="dual"` feeds only the block (DualCache).
    Rows that finish a block early wait (their extra steps change nothing).
    """
    _check_temperature(temperature)
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    num_blocks, _ = block_schedule(gen_length, block_length, None)
    x = _init_canvas(prompt_ids, gen_length, mask_id, init)  # [B, L]
    p = prompt_ids.shape[1]
    block_logits = _BlockLogits(logits_fn, cache, mask_id)
    for b in range(num_blocks):
        s, e = p + b * block_length, p + (b + 1) * block_length
        for it in range(block_length + 1):
            masked = x[:, s:e] == mask_id  # [B, W]
            active = masked.any(-1)  # [B]
            if not bool(active.any()):
                break
            if it == block_length:  # every step reveals >= 1 token per unfinished row, so this cannot happen
                raise RuntimeError("threshold decoding made no progress")
            logits = block_logits(x, s, e, first_step=it == 0)  # [B, W, V]
            # finished rows draw nothing; x0 and its confidence only at the masked positions
            x0 = gumbel_argmax(logits, temperature, generator, rows=active, where=masked)  # [B, W]
            conf = picked_confidence(logits, x0, masked)  # [B, W], -inf where not masked
            top1 = top_k_mask(conf, active.long())  # [B, W]
            pick = top1 | (masked & (conf >= threshold))  # [B, W]
            x[:, s:e] = torch.where(pick, x0, x[:, s:e])
    return x


# --------------------------------------------------------------------------------------------- random order
@torch.no_grad()
def generate_random_order(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    *,
    gen_length: int,
    block_length: int,
    mask_id: int,
    steps: int | None = None,
    temperature: float = 0.0,
    generator=None,
    init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random-order sampler with exact per-token log-probs -> (ids [B, P+T], logp [B, T], order [B, T]).

    DMPO's ROAR sampler (arXiv 2510.08233, Sec. 3 and `dmpo_trainer.py`): inside each block (left to right) the
    positions are revealed in a uniformly random order, one per forward by default (`steps = gen_length`); with
    fewer steps each step reveals the next `num_transfer_tokens` positions of the order. A revealed token is
    sampled from `softmax(logits / temperature)` (the argmax at temperature 0), and its log-prob under that
    distribution is recorded (at temperature 0, under `softmax(logits)`), so `sum_t logp` is the exact
    log-probability of the sampled tokens given the order, `log p(o | q; sigma)`.

    `order[b, t]` is the global step (0-based, across blocks) at which response position t was revealed (-1 for a
    position given by `init`);
    re-running the model on the partially revealed inputs of each step reproduces `logp`
    (`models.dllm_estimators.exact_logprob`).
    """
    _check_temperature(temperature)
    steps = gen_length if steps is None else steps
    num_blocks, spb = block_schedule(gen_length, block_length, steps)
    x = _init_canvas(prompt_ids, gen_length, mask_id, init)  # [B, L]
    bsz, p = prompt_ids.shape
    dev = x.device
    logp = torch.zeros(bsz, gen_length, dtype=torch.float32, device=dev)  # [B, T]
    order = torch.zeros(bsz, gen_length, dtype=torch.long, device=dev)  # [B, T]
    score_temperature = temperature if temperature > 0 else 1.0
    k = num_transfer_tokens(torch.tensor([block_length], device=dev), spb)[0]  # [spb]
    bounds = k.cumsum(0)  # [spb]
    for b in range(num_blocks):
        s, e = p + b * block_length, p + (b + 1) * block_length
        rank = _uniform((bsz, block_length), generator, dev).argsort(-1).argsort(-1)  # [B, W] random permutation
        step_of = torch.searchsorted(bounds, rank, right=True)  # [B, W] local step of each position
        free = x[:, s:e] == mask_id  # [B, W] given (infilled) positions are never revealed
        order[:, s - p : e - p] = torch.where(free, step_of + b * spb, torch.full_like(step_of, -1))
        for i in range(spb):
            reveal = (step_of == i) & free  # [B, W]
            if not bool(reveal.any()):
                continue
            logits = suppress_tokens(_window(logits_fn, x, s, e), (mask_id,))  # [B, W, V]
            # the draw and the log-prob only at the positions this step reveals (the noise still drawn for all)
            x0 = gumbel_argmax(logits, temperature, generator, where=reveal)  # [B, W]
            lp = selective_log_softmax(logits[reveal], x0[reveal], temperature=score_temperature)  # [M]
            x[:, s:e] = torch.where(reveal, x0, x[:, s:e])
            logp[:, s - p : e - p][reveal] = lp
    return x, logp, order


# --------------------------------------------------------------------------------------------- easy first, re-masking
@torch.no_grad()
def generate_easy_first(
    logits_fn: LogitsFn,
    prompt_ids: torch.Tensor,
    *,
    gen_length: int,
    mask_id: int,
    steps: int | None = None,
    temperature: float = 0.0,
    generator=None,
    init: torch.Tensor | None = None,
) -> torch.Tensor:
    """Easy-first top-k decoding with re-masking -> ids [B, P + gen_length], over the whole span (one block).

    MGDM's decoding (Ye et al., ICLR 2025, arXiv 2410.14157, "easy-first TopK decoding", after RDM's reparameterised
    sampler, Zheng et al. 2023, arXiv 2302.05737): after step i of `steps` the `n_i` most confident positions hold
    a token and all others are masked, `n_i` growing linearly to the whole span (`num_transfer_tokens`, cumulated).
    Each step proposes x0 (Gumbel-max at `temperature`, argmax at 0) with confidence `softmax(logits)[x0]` at every
    masked position; the positions already decoded keep their token and the confidence they were decoded with, and
    compete with the proposals, so an earlier, less confident choice is re-masked when newer proposals are surer
    (the difference from `generate_low_confidence`, which never revisits a decoded token). Deviation: a decoded
    token is not re-predicted (the model is trained only on masked positions); MGDM's stochastic top-k (Gumbel
    noise on the confidences) is not used. Positions given by `init` are always kept and never counted.
    """
    _check_temperature(temperature)
    steps = gen_length if steps is None else int(steps)
    if steps < 1 or steps > gen_length:
        raise ValueError(f"easy-first decoding needs 1 <= steps <= gen_length={gen_length}, got steps={steps}")
    x = _init_canvas(prompt_ids, gen_length, mask_id, init)  # [B, L]
    p = prompt_ids.shape[1]
    given = x[:, p:] != mask_id  # [B, T]
    keep_n = num_transfer_tokens((~given).sum(-1), steps).cumsum(-1)  # [B, S] decoded positions after each step
    score = torch.full(given.shape, -torch.inf, device=x.device)  # [B, T] confidence of the decoded positions
    for i in range(steps):
        span = x[:, p:]  # [B, T]
        masked = span == mask_id  # [B, T]
        logits = suppress_tokens(_window(logits_fn, x, p), (mask_id,))  # [B, T, V]
        x0 = gumbel_argmax(logits, temperature, generator, where=masked)  # [B, T] only masked positions used
        conf = picked_confidence(logits, x0, masked)  # [B, T], -inf where not masked
        cand = torch.where(masked, x0, span)  # [B, T]
        cand_score = torch.where(masked, conf, score)  # [B, T]
        cand_score = torch.where(given, torch.full_like(cand_score, -torch.inf), cand_score)
        keep = top_k_mask(cand_score, keep_n[:, i]) | given  # [B, T]
        x[:, p:] = torch.where(keep, cand, torch.full_like(cand, mask_id))
        score = torch.where(keep & ~given, cand_score, torch.full_like(score, -torch.inf))
    return x
