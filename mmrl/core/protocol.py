"""The policy protocol every model family implements, and the batch dataclasses that flow through the loop.

The trainer and the algorithms talk to a model only through these methods (docs/design.md, "The protocol"):

- `sample(prompts, group_size, **generation) -> Rollout`: G responses per prompt, rollout-time log-probs,
  decoded payload (text or PIL images).
- `logprob(rollout, ...) -> TokenScores`: teacher-forced per-token scores of the sampled response tokens under
  the positive prompt or the negative condition, with optional per-token distribution statistics against the
  reference model (or the negative condition) computed in chunks in the same pass. Masked-diffusion adapters
  return the d1 mean-field or the ELBO estimate.
- `forward_noise(rollout, num_copies, generator, *, min_rate) -> NoisedBatch` and `denoise_logprob(noised) -> [R, N, T]`:
  the masked copies WDCE trains on and their log-probs (autoregressive adapters: the clean sequence, R = 1, so
  WDCE becomes weighted NLL).

Shapes: N responses (prompts x G, groups contiguous), P prompt tokens (left padded), T response tokens (right
padded), V vocabulary, R masked copies.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

import torch

from mmrl.core.constants import DEFAULT_NEGATIVE_INSTRUCTION  # noqa: F401  (re-exported for the adapters)

Condition = Literal["positive", "negative"]


def _index(value: Any, idx: torch.Tensor) -> Any:
    """Select rows `idx` of a per-response field: tensors and lists of length N are indexed, the rest kept.

    Tuples are metadata, never sliced (e.g. `extras["grid"] = (h, w)`, which a 2-row batch could not tell
    apart from per-response data)."""
    if isinstance(value, torch.Tensor):
        return value[idx.to(value.device)] if value.dim() > 0 else value
    if isinstance(value, list):
        return [value[i] for i in idx.tolist()]
    if isinstance(value, dict):
        return {k: _index(v, idx) for k, v in value.items()}
    return value


@dataclass
class Rollout:
    """G sampled responses for each of a batch of prompts, as returned by `Policy.sample`.

    Row `g*G + j` is response j of prompt g. All tensors live on the policy's device.
    """

    prompt_ids: torch.Tensor
    """[N, P] long: prompt token ids, left padded (each prompt repeated G times)."""
    prompt_mask: torch.Tensor
    """[N, P] bool: real prompt tokens (False on left padding)."""
    response_ids: torch.Tensor
    """[N, T] long: sampled response tokens (text tokens, image-codebook ids, or a diffusion LM's generated span),
    right padded."""
    response_mask: torch.Tensor
    """[N, T] bool: valid response tokens, up to and including the first EOS (TRL's completion mask); all image
    tokens are valid."""
    group_size: int
    """G: responses per prompt."""
    prompts: list
    """[N] the prompts as given to `sample` (strings, chat messages or dicts with images), repeated G times; passed
    to the reward functions."""
    completions: list
    """[N] decoded responses: strings for text models, PIL images for image models."""
    old_logp: torch.Tensor | None = None
    """[N, T] float: per-token log-probs recorded while sampling (the behaviour policy); None if the sampler has
    no exact per-token probabilities (e.g. low-confidence remasking of a masked-diffusion model)."""
    neg_prompt_ids: torch.Tensor | None = None
    """[N, P'] long: the negative condition for GCPO (CFG null prompt for images; prompt plus wrong-answer
    instruction for text), left padded. Built by the adapter when it is asked for."""
    neg_prompt_mask: torch.Tensor | None = None
    """[N, P'] bool: real tokens of `neg_prompt_ids`."""
    extras: dict = field(default_factory=dict)
    """Family-specific per-response payload (e.g. VLM pixel inputs, the image-token grid `(h, w)`, the sampler's
    unmasking order). Tensors and lists with a leading N dimension are sliced by `select`; tuples are kept as
    metadata. Every adapter sets `terminated` ([N] bool): the response ended by itself (an EOS; masked diffusion:
    an EOS inside the generated span; always True for images), as opposed to being cut at the length limit."""

    @property
    def num_responses(self) -> int:
        return self.response_ids.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_responses // self.group_size

    def select(self, idx: torch.Tensor | Sequence[int] | slice) -> "Rollout":
        """The rollout restricted to responses `idx` (a micro-batch); `group_size` is kept as metadata."""
        if isinstance(idx, slice):
            idx = torch.arange(self.num_responses)[idx]
        idx = torch.as_tensor(idx, dtype=torch.long)
        data = {}
        for f in fields(self):
            v = getattr(self, f.name)
            data[f.name] = v if f.name == "group_size" else _index(v, idx)
        return Rollout(**data)

    def to(self, device: torch.device | str) -> "Rollout":
        def move(v):
            if isinstance(v, torch.Tensor):
                return v.to(device)
            if isinstance(v, dict):
                return {k: move(x) for k, x in v.items()}
            return v

        return replace(self, **{f.name: move(getattr(self, f.name)) for f in fields(self) if f.name != "group_size"})


@dataclass
class TokenScores:
    """Per-token scores of a rollout's response tokens, returned by `Policy.logprob`."""

    logp: torch.Tensor
    """[N, T] log-prob (or its estimate) of each sampled response token; 0 on padding. Carries the gradient
    unless computed under `no_grad`."""
    stats: dict[str, torch.Tensor] = field(default_factory=dict)
    """Requested per-token distribution statistics, each [N, T] float32, detached (names in
    `mmrl.algorithms.STATS`: `h2`, `entropy`, `kl`, `ref_entropy`), computed in chunks."""
    other_logp: torch.Tensor | None = None
    """[N, T] log-probs of the same tokens under the model/condition the statistics were taken against
    (reference model or negative condition), detached; None when no statistics were requested."""


@dataclass
class NoisedBatch:
    """The R noised copies of each response that WDCE trains on (`Policy.forward_noise`)."""

    input_ids: torch.Tensor
    """[R*N, P+T] long: prompt plus noised response (masked-diffusion models replace masked response positions by
    the mask token; autoregressive models keep the clean sequence). Copy r of response i is row `r*N + i`."""
    attention_mask: torch.Tensor
    """[R*N, P+T] bool."""
    noise_mask: torch.Tensor
    """[R, N, T] bool: response positions whose clean token is predicted (the masked ones; for AR models all valid
    response tokens)."""
    n_masked: torch.Tensor
    """[R, N] float: the normaliser of each copy's CE sum in WDCE (number of masked tokens, clamped >= 1; ones for
    AR models so that WDCE is the sequence NLL)."""
    rates: torch.Tensor
    """[R, N] float: the mask rate of each copy (1 for AR models)."""
    num_copies: int
    """R."""
    prompt_len: int
    """P: width of the prompt part of `input_ids`."""
    extras: dict = field(default_factory=dict)
    """Family-specific inputs the denoising forward needs besides the ids (e.g. VLM pixel inputs per response, the
    sampling temperature); per-response tensors and lists have a leading N dimension."""


@runtime_checkable
class Policy(Protocol):
    """What the trainer needs from a model family (implemented by the adapters in `mmrl.models`)."""

    family: str
    """Family name: "causal_lm", "vlm", "janus", "masked_diffusion" or "masked_image"."""
    model: torch.nn.Module
    """The trainable model (possibly wrapped by accelerate / peft)."""
    vocab_size: int
    """Size of the response vocabulary V (text vocabulary or image codebook)."""

    def sample(self, prompts: list, group_size: int, *, generator: torch.Generator | None = None, **generation: Any) -> Rollout:
        """Generate `group_size` responses per prompt; prompts are repeated G times in the rollout."""
        ...

    def logprob(
        self,
        rollout: Rollout,
        *,
        condition: Condition = "positive",
        use_reference: bool = False,
        stats: tuple[str, ...] = (),
        stats_against: Literal["reference", "negative"] = "reference",
        **estimator: Any,
    ) -> TokenScores:
        """Teacher-forced per-token log-probs [N, T] of `rollout.response_ids`.

        Args:
            condition: "positive" (the prompt) or "negative" (GCPO's negative condition).
            use_reference: score with the frozen reference model (a separate copy or the adapter-disabled base).
            stats: per-token statistics of the scoring distribution against `stats_against` (the reference model
                under the same condition, or this model under the negative condition).
            estimator: family-specific options, e.g. masked diffusion's `estimator="mean_field" | "elbo"`,
                `mask_seed`, `num_copies`.
        """
        ...

    def forward_noise(self, rollout: Rollout, num_copies: int, generator: torch.Generator | None = None, *,
                      min_rate: float | None = None) -> NoisedBatch:
        """Noised copies of the rollout for WDCE (identity with R = 1 for autoregressive models, which ignore
        `min_rate`, the lower end of the masked-diffusion mask rate)."""
        ...

    def denoise_logprob(self, noised: NoisedBatch, *, use_reference: bool = False) -> torch.Tensor:
        """[R, N, T] log p(clean token | noised input) at `noised.noise_mask` positions, 0 elsewhere."""
        ...
