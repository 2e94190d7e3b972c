"""The use_vllm glue at vLLM's boundary, run where vLLM is not installed (CI): a stand-in for the few vLLM objects
`models/vllm_engine.py` touches (`LLM(...)`, `LLM.generate`'s token prompts and outputs, `SamplingParams`, the
in-place weight reload) is put where the engine imports `vllm`; the policy is a real tiny transformers model.

Checked: one request per response row with its row's seed and the EOS ids as stop tokens; after an optimizer step
the engine is given the policy's current weights (LoRA merged as peft's own `merge_and_unload` merges them, the
policy's base weights and adapters untouched); the engine's tokens become the rollout (padding, masks, completions,
`terminated`); the rollout's `old_logp` are the policy's log-probs of those tokens; a two-step `Trainer` run syncs the engine before
each generation, the second time with the optimizer step's weights. The tests against the real
engine are tests/models/test_vllm_engine.py (they run only where vLLM is importable)."""
from __future__ import annotations

import copy
import importlib.machinery
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from mmrl.models import adapter_class

PROMPTS = ["say a 1", "say b"]
G = 3
MAX_NEW = 6


@dataclass
class StandInSamplingParams:
    """vLLM's `SamplingParams` fields the engine sets (an unknown keyword fails, as it does in vLLM)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop_token_ids: list = field(default_factory=list)
    seed: int | None = None
    detokenize: bool = True


def stand_in_tokens(prompt_ids: list[int], params: StandInSamplingParams, low: int, high: int) -> list[int]:
    """A response that depends only on (prompt, seed), as a seeded vLLM request does: an even seed stops early on
    the first stop id (vLLM keeps a stop token in `token_ids`); an odd seed runs to max_tokens without one."""
    g = torch.Generator().manual_seed(int(params.seed) % 2**40 * 1000 + sum(prompt_ids))  # row seeds are 63-bit
    if params.seed % 2 == 0:
        k = 1 + int(params.seed // 2) % (params.max_tokens - 1)
        return torch.randint(low, high, (k - 1,), generator=g).tolist() + [params.stop_token_ids[0]]
    return torch.randint(low, high, (params.max_tokens,), generator=g).tolist()


class StandInLLM:
    """vLLM's `LLM` as the engine uses it; records its construction, requests and the weights it is given."""

    token_range = (0, 1)

    def __init__(self, model: str, **kwargs):
        self.model, self.kwargs = model, kwargs
        self.requests: list[list[tuple[dict, StandInSamplingParams]]] = []
        self.loads: list[dict[str, torch.Tensor]] = []
        self.prefix_resets = 0

    def generate(self, prompts, params, use_tqdm=True):
        assert isinstance(params, list) and len(params) == len(prompts)
        self.requests.append(list(zip(prompts, params)))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(
            token_ids=tuple(stand_in_tokens(p["prompt_token_ids"], sp, *self.token_range)))]) for p, sp in zip(prompts, params)]

    def collective_rpc(self, method, kwargs):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        self.loads.append({n: t.detach().clone() for n, t in kwargs["weights_iterator"]})

    def reset_prefix_cache(self):
        self.prefix_resets += 1


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """`vllm` and `vllm.inputs` as importable stand-ins (with module specs, so `find_spec` sees them)."""
    vllm = types.ModuleType("vllm")
    vllm.__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    vllm.LLM, vllm.SamplingParams = StandInLLM, StandInSamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.__spec__ = importlib.machinery.ModuleSpec("vllm.inputs", None)
    inputs.TokensPrompt = lambda **kw: dict(kw)  # a TypedDict in vLLM: a plain dict
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return vllm


def policy_with_engine(tmp_path, *, lora: bool):
    from mmrl.config.train_config import TrainConfig
    from mmrl.training.policy_factory import attach_rollout_engine

    policy = adapter_class("causal_lm").tiny(seed=0)
    d = tmp_path / "base"
    policy.save_pretrained(d)
    if lora:
        from peft import LoraConfig, get_peft_model

        policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                               init_lora_weights=False))
    cfg = TrainConfig(use_vllm=True, model_name_or_path=str(d), torch_dtype="float32", vllm_gpu_memory_utilization=0.4,
                      vllm_max_model_length=128, seed=7)
    attach_rollout_engine(policy, cfg)
    llm = policy.rollout_engine.llm
    assert isinstance(llm, StandInLLM)
    assert llm.model == str(d)
    assert llm.kwargs == dict(skip_tokenizer_init=True, dtype="float32", seed=7, gpu_memory_utilization=0.4,
                              enforce_eager=True, max_model_len=128)
    set_token_range(policy.tokenizer)
    return policy, llm


def set_token_range(tok) -> None:
    """The stand-in answers with ordinary (non-special) token ids of `tok`."""
    specials = set(tok.all_special_ids)
    ordinary = [i for i in range(len(tok)) if i not in specials]
    assert ordinary == list(range(ordinary[0], ordinary[-1] + 1))  # the char tokenizer: specials first, then chars
    StandInLLM.token_range = (ordinary[0], ordinary[-1] + 1)


def sample(policy, seeds, **kw):
    return policy.sample(PROMPTS, G, seeds=seeds, max_new_tokens=MAX_NEW, temperature=0.7, top_p=0.9, top_k=5, **kw)


def test_requests_rollout_and_old_logp_at_the_engine_boundary(stand_in_vllm, tmp_path):
    policy, llm = policy_with_engine(tmp_path, lora=False)
    seeds = [10, 11, 12, 13, 14, 15]
    r = sample(policy, seeds)
    eos = policy.generation_defaults["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else list(eos)
    pad = policy.tokenizer.pad_token_id

    # one request per response row (row g*G + j answers prompt g), seeded with its row's seed
    (requests,) = llm.requests
    assert len(requests) == len(PROMPTS) * G
    prompt_ids = [policy.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    for i, (prompt, params) in enumerate(requests):
        assert prompt["prompt_token_ids"][-len(prompt_ids[i // G]):] == prompt_ids[i // G]
        assert prompt["prompt_token_ids"] == requests[(i // G) * G][0]["prompt_token_ids"]  # the group's one prompt
        assert (params.seed, params.n, params.max_tokens, params.detokenize) == (seeds[i], 1, MAX_NEW, False)
        assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.9, 5)
        assert params.stop_token_ids == eos
    assert requests[0][0]["prompt_token_ids"] != requests[G][0]["prompt_token_ids"]

    # the engine's tokens become the rollout: right padded, masked through the first EOS, decoded without it
    want = [stand_in_tokens(p["prompt_token_ids"], sp, *StandInLLM.token_range) for p, sp in requests]
    assert [len(w) for w in want] == [1, 6, 2, 6, 3, 6]  # even seeds 10 / 12 / 14 stop at lengths 1 / 2 / 3
    assert r.response_ids.shape == (6, MAX_NEW)
    for i, w in enumerate(want):
        assert r.response_ids[i, : len(w)].tolist() == w
        assert (r.response_ids[i, len(w):] == pad).all()
        assert r.response_mask[i].tolist() == [t < len(w) for t in range(MAX_NEW)]
        text = w[:-1] if w[-1] in eos else w
        assert r.completions[i] == policy.tokenizer.decode(text, skip_special_tokens=True)
    assert r.extras["terminated"].tolist() == [True, False, True, False, True, False]
    assert r.prompts == [p for p in PROMPTS for _ in range(G)]

    # old log-probs: the policy's own, of these tokens (not the engine's), zero outside the mask
    with torch.no_grad():
        ref = policy.logprob(r).logp.float()
    assert torch.allclose(r.old_logp, ref.masked_fill(~r.response_mask, 0.0), atol=1e-6)
    assert (r.old_logp[r.response_mask] < 0).all() and (r.old_logp[~r.response_mask] == 0).all()

    # same seeds, same requests and responses; other seeds, other responses
    again = sample(policy, seeds)
    assert torch.equal(again.response_ids, r.response_ids) and torch.equal(again.old_logp, r.old_logp)
    assert not torch.equal(sample(policy, [s + 100 for s in seeds]).response_ids, r.response_ids)


def optimizer_step(policy, rollout):
    params = [p for p in policy.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    policy.model.train()
    loss = -(policy.logprob(rollout).logp * rollout.response_mask).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    policy.model.eval()


def test_weights_follow_the_policy_after_each_optimizer_step(stand_in_vllm, tmp_path):
    policy, llm = policy_with_engine(tmp_path, lora=False)
    seeds = list(range(6))
    r = sample(policy, seeds)
    first = {n: t.clone() for n, t in policy.model.state_dict().items()}
    assert set(llm.loads[0]) == set(first) and all(torch.equal(llm.loads[0][n], first[n]) for n in first)
    optimizer_step(policy, r)
    sample(policy, seeds)
    assert len(llm.loads) == 2 and llm.prefix_resets == 2  # a sync (and a fresh prefix cache) per generation
    now = policy.model.state_dict()
    assert all(torch.equal(llm.loads[1][n], now[n]) for n in now)
    assert any(not torch.equal(llm.loads[1][n], first[n]) for n in now)  # the step moved the weights the engine got


def test_lora_weights_are_given_merged_and_the_policy_is_untouched(stand_in_vllm, tmp_path):
    policy, llm = policy_with_engine(tmp_path, lora=True)
    seeds = list(range(6))
    r = sample(policy, seeds)
    optimizer_step(policy, r)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    r2 = sample(policy, seeds)
    # the reference merge: peft's merge_and_unload on a copy, under the base checkpoint's names
    merged = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    got = llm.loads[-1]
    assert set(got) == set(merged)
    assert all(torch.allclose(got[n], merged[n], atol=1e-6) for n in merged)
    lora_targets = [n for n in merged if n.endswith("q_proj.weight")]
    assert lora_targets and all(not torch.equal(got[n], policy.model.get_base_model().state_dict()[n.replace("q_proj.", "q_proj.base_layer.")])
                                for n in lora_targets)  # the adapters' delta is in what the engine got
    # the policy itself: base weights and adapters unchanged, adapters not left merged
    assert all(torch.equal(p.detach(), before[n]) for n, p in policy.model.named_parameters())
    assert not any(getattr(m, "merged", False) for m in policy.model.modules())
    with torch.no_grad():
        ref = policy.logprob(r2).logp.float()
    assert torch.allclose(r2.old_logp, ref.masked_fill(~r2.response_mask, 0.0), atol=1e-6)


def test_training_syncs_the_engine_before_each_generation(stand_in_vllm, tmp_path):
    import datasets

    from mmrl import TrainConfig, Trainer

    base = adapter_class("causal_lm").tiny(seed=0)
    base.save_pretrained(tmp_path / "base")
    set_token_range(base.tokenizer)
    args = TrainConfig(max_steps=2, num_generations=4, per_device_train_batch_size=8, max_completion_length=MAX_NEW,
                       learning_rate=3e-2, output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0,
                       report_to=["jsonl"], use_vllm=True)
    t = Trainer(str(tmp_path / "base"), [lambda completions, **kw: [float(len(c)) for c in completions]], args=args,
                train_dataset=datasets.Dataset.from_list([{"prompt": f"say a {i}"} for i in range(16)]))
    llm = t.policy.rollout_engine.llm
    t.train()
    assert len(llm.requests) == len(llm.loads) == 2 and all(len(r) == 8 for r in llm.requests)  # a sync per generation
    initial = base.model.state_dict()
    assert all(torch.equal(llm.loads[0][n], initial[n]) for n in initial)  # step 1 samples with the initial weights
    assert any(not torch.equal(llm.loads[1][n], initial[n]) for n in initial)  # step 2 with the optimizer step's
    t.policy.sample(["say b"], 2, seeds=[1, 2], max_new_tokens=MAX_NEW)
    trained = t.policy.unwrapped.state_dict()
    assert all(torch.equal(llm.loads[-1][n], trained[n]) for n in trained)
