"""The use_vllm glue at vLLM's boundary, run where vLLM is not installed (CI): a stand-in for the few vLLM objects
`models/vllm_engine.py` touches (`LLM(...)`, `LLM.generate`'s token prompts and outputs, `SamplingParams`, the
in-place weight reload) is put where the engine imports `vllm`; the policy is a real tiny transformers model.

Checked: one request per response row with its row's seed and the EOS ids as stop tokens; after an optimizer step
the engine is given the policy's current weights (LoRA merged as peft's own `merge_and_unload` merges them, the
policy's base weights and adapters untouched); the engine's tokens become the rollout (padding, masks, completions,
`terminated`); the rollout's `old_logp` are the policy's log-probs of those tokens; a two-step `Trainer` run syncs the engine before
each generation, the second time with the optimizer step's weights.

The VLM (a real tiny Qwen2.5-VL, `models/tiny_configs.py`): each request carries its prompt's token ids as the
processor expands the image placeholders and the prompt's images as `multi_modal_data` (one image itself, several as
a list, none for a text-only prompt), the vision tokens biased away; the rollout is the engine's tokens; `old_logp`
equal a forward of the model with the pixel inputs (another image of the same size: the same tokens, other
log-probs); after an optimizer step the engine is given the policy's weights under names that vLLM's Qwen2.5-VL
weight mapper sends where it sends the saved checkpoint's. The tests against the real engine are
tests/models/test_vllm_engine.py (they run only where vLLM is importable)."""
from __future__ import annotations

import copy
import importlib.machinery
import sys
import types
from dataclasses import dataclass, field

import numpy as np
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
    logit_bias: dict | None = None


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


# ---------------------------------------------------------------------------------------------- VLM (Qwen2.5-VL)


def noise_image(w, h, seed):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


IMG_A, IMG_B, IMG_C = noise_image(16, 16, 0), noise_image(24, 16, 1), noise_image(32, 24, 2)
VLM_PROMPTS = [
    {"prompt": "What colour?", "images": [IMG_A]},
    {"prompt": [{"role": "user", "content": "Compare the two."}], "images": [IMG_B, IMG_C]},
    "no image here",
]
IMAGE_TOKENS = [4, 6 + 12, 0]  # (w * h) / 64 per image: 4-pixel patches merged 2 x 2

QWEN_VL_MAPPER = {"model.language_model.": "language_model.model.", "model.visual.": "visual.",
                  "lm_head.": "language_model.lm_head.", "model.": "language_model.model."}
"""vLLM's Qwen2-VL / Qwen2.5-VL `hf_to_vllm_mapper` (vllm/model_executor/models/qwen2_5_vl.py): the first prefix that
matches is replaced (transformers >= 4.52 names first, then the original checkpoint's)."""


def vllm_name(name: str) -> str:
    for old, new in QWEN_VL_MAPPER.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def vlm_with_engine(tmp_path):
    from mmrl.config.train_config import TrainConfig
    from mmrl.training.policy_factory import attach_rollout_engine

    policy = adapter_class("vlm").tiny(seed=0)
    d = tmp_path / "vlm"
    policy.save_pretrained(d)
    cfg = TrainConfig(use_vllm=True, family="vlm", model_name_or_path=str(d), torch_dtype="float32", seed=3)
    attach_rollout_engine(policy, cfg)
    llm = policy.rollout_engine.llm
    assert isinstance(llm, StandInLLM) and llm.model == str(d)
    # the tokenizer is loaded (vLLM builds the Qwen-VL processor from it), images only
    assert llm.kwargs == dict(skip_tokenizer_init=False, dtype="float32", seed=3, gpu_memory_utilization=0.3,
                              enforce_eager=True, limit_mm_per_prompt={"video": 0})
    set_token_range(policy.tokenizer)
    return policy, llm, d


def processed_alone(policy, prompt):
    """The processor on one prompt by itself, as TRL tokenizes a VLM prompt: (ids, processor outputs)."""
    from mmrl.models.vlm import multimodal_messages, split_vlm_prompt

    body, images = split_vlm_prompt(prompt)
    text = policy.processor.apply_chat_template(multimodal_messages(body, len(images)), tokenize=False, add_generation_prompt=True)
    out = policy.processor(text=[text], images=images or None, return_tensors="pt")
    return out["input_ids"][0].tolist(), out


@torch.no_grad()
def reference_logp(policy, prompt, response, temperature):
    """[T] log-probs of `response` after `prompt`: one forward of the model on the processor's ids and pixels."""
    ids, out = processed_alone(policy, prompt)
    kwargs = {}
    if "pixel_values" in out:
        mm = torch.cat([out["mm_token_type_ids"], torch.zeros(1, len(response), dtype=out["mm_token_type_ids"].dtype)], 1)
        kwargs = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"], mm_token_type_ids=mm)
    policy.model.model.rope_deltas = None
    logits = policy.model(input_ids=torch.tensor([ids + response]), **kwargs).logits[0].float()  # [L, V]
    logp = torch.log_softmax(logits[len(ids) - 1 : len(ids) - 1 + len(response)] / temperature, -1)  # [T, V]
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)  # [T]


def vlm_sample(policy, prompts, seeds):
    return policy.sample(prompts, G, seeds=seeds, max_new_tokens=MAX_NEW, temperature=0.7, top_p=0.9, top_k=5)


def test_vlm_requests_carry_expanded_ids_and_images_and_old_logp_use_the_images(stand_in_vllm, tmp_path):
    policy, llm, _ = vlm_with_engine(tmp_path)
    seeds = list(range(20, 20 + len(VLM_PROMPTS) * G))
    r = vlm_sample(policy, VLM_PROMPTS, seeds)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    vision = sorted(policy.tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"))

    (requests,) = llm.requests
    assert len(requests) == len(VLM_PROMPTS) * G
    for i, (prompt, params) in enumerate(requests):
        g = i // G
        ids, _ = processed_alone(policy, VLM_PROMPTS[g])
        assert prompt["prompt_token_ids"] == ids  # the processor's ids, each image's placeholder expanded
        assert ids.count(image_id) == IMAGE_TOKENS[g]
        assert (params.seed, params.max_tokens, params.stop_token_ids, params.detokenize) == (seeds[i], MAX_NEW, [policy.tokenizer.eos_token_id], False)
        assert params.logit_bias == {v: -100.0 for v in vision}  # the vision tokens are never sampled
    # TRL's multi_modal_data: the image itself, a list of several, nothing for a text-only prompt
    assert all(requests[i][0]["multi_modal_data"]["image"] is IMG_A for i in range(G))
    assert all(requests[i][0]["multi_modal_data"]["image"] == [IMG_B, IMG_C] for i in range(G, 2 * G))
    assert all(isinstance(requests[i][0]["multi_modal_data"]["image"], list) for i in range(G, 2 * G))
    assert all("multi_modal_data" not in requests[i][0] for i in range(2 * G, 3 * G))

    # the rollout: the engine's tokens, the policy's prompt ids (the same the engine got), its pixel inputs
    want = [stand_in_tokens(p["prompt_token_ids"], sp, *StandInLLM.token_range) for p, sp in requests]
    assert r.response_ids.shape == (len(want), MAX_NEW)
    for i, w in enumerate(want):
        assert r.response_ids[i, : len(w)].tolist() == w and r.response_mask[i].sum() == len(w)
        assert r.prompt_ids[i][r.prompt_mask[i]].tolist() == requests[i][0]["prompt_token_ids"]
    assert r.extras["terminated"].tolist() == [s % 2 == 0 for s in seeds]
    assert [x is None for x in r.extras["pixel_values"]] == [False] * (2 * G) + [True] * G

    # old_logp: a forward of the model with the images (not the engine's log-probs)
    for i, w in enumerate(want):
        ref = reference_logp(policy, VLM_PROMPTS[i // G], w, 0.7)
        assert torch.allclose(r.old_logp[i, : len(w)], ref, atol=1e-5), i
        assert (r.old_logp[i, len(w):] == 0).all()

    # another image of the same size: the same prompt ids, so the same engine tokens, but other log-probs
    other = [{"prompt": "What colour?", "images": [noise_image(16, 16, 9)]}]
    r1 = vlm_sample(policy, VLM_PROMPTS[:1], seeds[:G])
    r2 = vlm_sample(policy, other, seeds[:G])
    assert llm.requests[-1][0][0]["multi_modal_data"]["image"] is other[0]["images"][0]
    # the same rows scored in a batch of G or of 3G: equal up to float rounding (the matmul blocking follows the batch)
    assert torch.equal(r1.response_ids, r2.response_ids) and torch.allclose(r1.old_logp, r.old_logp[:G], atol=1e-5, rtol=0)
    assert not torch.allclose(r1.old_logp[r1.response_mask], r2.old_logp[r2.response_mask], atol=1e-4)


def test_vlm_weights_follow_the_policy_under_names_vllms_mapper_loads(stand_in_vllm, tmp_path):
    from safetensors import safe_open

    policy, llm, d = vlm_with_engine(tmp_path)
    seeds = list(range(len(VLM_PROMPTS) * G))
    r = vlm_sample(policy, VLM_PROMPTS, seeds)
    first = {n: t.clone() for n, t in policy.model.state_dict().items()}
    (loaded,) = llm.loads
    assert set(loaded) == set(first) and all(torch.equal(loaded[n], first[n]) for n in first)
    # vLLM reads the saved checkpoint at start-up (transformers saves the original names: model.layers.*, visual.*);
    # the synced names (model.language_model.*, model.visual.*) reach the same vLLM parameters through its mapper
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved != set(loaded)
    assert {vllm_name(n) for n in loaded} == {vllm_name(n) for n in saved}
    assert all(vllm_name(n).startswith(("visual.", "language_model.model.", "language_model.lm_head.")) for n in loaded)
    assert any(n.startswith("model.visual.") for n in loaded)  # the vision tower is synced too

    optimizer_step(policy, r)
    vlm_sample(policy, VLM_PROMPTS, seeds)
    assert len(llm.loads) == 2 and llm.prefix_resets == 2
    now = policy.model.state_dict()
    assert all(torch.equal(llm.loads[1][n], now[n]) for n in now)
    moved = {n for n in now if not torch.equal(llm.loads[1][n], first[n])}
    assert any(n.startswith("model.visual.") for n in moved) and any(n.startswith("model.language_model.") for n in moved)


def test_vlm_lora_weights_are_given_merged(stand_in_vllm, tmp_path):
    from peft import LoraConfig, get_peft_model

    policy, llm, _ = vlm_with_engine(tmp_path)
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "qkv"],
                                                           init_lora_weights=False))
    r = vlm_sample(policy, VLM_PROMPTS, list(range(len(VLM_PROMPTS) * G)))
    merged = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    got = llm.loads[-1]
    assert set(got) == set(merged) and all(torch.allclose(got[n], merged[n], atol=1e-6) for n in merged)
    assert not any(getattr(m, "merged", False) for m in policy.model.modules())
    i = 0
    w = r.response_ids[i][r.response_mask[i]].tolist()
    assert torch.allclose(r.old_logp[i, : len(w)], reference_logp(policy, VLM_PROMPTS[0], w, 0.7), atol=1e-5)


def test_vlm_engine_refuses_a_sampled_vision_token(stand_in_vllm, tmp_path):
    policy, llm, _ = vlm_with_engine(tmp_path)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    StandInLLM.token_range = (image_id, image_id + 1)  # an engine that ignores the bias
    with pytest.raises(RuntimeError, match=rf"sampled suppressed token ids \[{image_id}\]"):
        vlm_sample(policy, VLM_PROMPTS[:1], list(range(G)))


def test_vlm_training_syncs_the_engine_and_sends_each_rows_image(stand_in_vllm, tmp_path):
    from mmrl import TrainConfig, Trainer

    base = adapter_class("vlm").tiny(seed=0)
    base.save_pretrained(tmp_path / "base")
    set_token_range(base.tokenizer)
    images = [noise_image(16, 16, 100 + i) for i in range(8)]
    args = TrainConfig(family="vlm", max_steps=2, num_generations=4, per_device_train_batch_size=8,
                       max_completion_length=MAX_NEW, learning_rate=3e-2, output_dir=str(tmp_path / "run"),
                       progress_bar=False, save_steps=0, report_to=["jsonl"], use_vllm=True)
    t = Trainer(str(tmp_path / "base"), [lambda completions, **kw: [float(len(c)) for c in completions]], args=args,
                train_dataset=[{"prompt": {"prompt": f"say a {i}", "images": [im]}} for i, im in enumerate(images)])
    llm = t.policy.rollout_engine.llm
    t.train()
    assert len(llm.requests) == len(llm.loads) == 2 and all(len(r) == 8 for r in llm.requests)
    image_id = base.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for prompt, _ in (req for reqs in llm.requests for req in reqs):  # each request carries its row's image
        row = int(base.tokenizer.decode(prompt["prompt_token_ids"], skip_special_tokens=True).split("say a ")[1][0])
        assert np.array_equal(np.asarray(prompt["multi_modal_data"]["image"]), np.asarray(images[row]))
        assert prompt["prompt_token_ids"].count(image_id) == 4
    initial = base.model.state_dict()
    assert all(torch.equal(llm.loads[0][n], initial[n]) for n in initial)
    assert any(not torch.equal(llm.loads[1][n], initial[n]) for n in initial)  # step 2 samples with step 1's weights


def test_vlm_trl_image_column_reaches_the_engine(stand_in_vllm, tmp_path):
    """TRL's VLM dataset form: a `datasets.Dataset` with a string prompt and an `image` column (an Image feature)."""
    import datasets

    from mmrl import TrainConfig, Trainer

    base = adapter_class("vlm").tiny(seed=0)
    base.save_pretrained(tmp_path / "base")
    set_token_range(base.tokenizer)
    images = [noise_image(16, 16, 200 + i) for i in range(4)]
    seen = []
    args = TrainConfig(max_steps=1, num_generations=4, per_device_train_batch_size=8, max_completion_length=MAX_NEW,
                       output_dir=str(tmp_path / "run"), progress_bar=False, save_steps=0, report_to=["jsonl"], use_vllm=True)
    t = Trainer(str(tmp_path / "base"), [lambda completions, image, **kw: seen.extend(image) or [0.0] * len(completions)],
                args=args, train_dataset=datasets.Dataset.from_list([{"prompt": f"say a {i}", "image": im} for i, im in enumerate(images)]))
    assert t.cfg.family == "vlm"  # from the model directory
    llm = t.policy.rollout_engine.llm
    t.train()
    (requests,) = llm.requests
    image_id = base.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for prompt, _ in requests:
        row = int(base.tokenizer.decode(prompt["prompt_token_ids"], skip_special_tokens=True).split("say a ")[1][0])
        assert np.array_equal(np.asarray(prompt["multi_modal_data"]["image"]), np.asarray(images[row]))
        assert prompt["prompt_token_ids"].count(image_id) == 4
    assert len(seen) == 8 and all(np.asarray(im).shape == (16, 16, 3) for im in seen)  # the column reaches the reward too
