"""The authors' variants that a paper preset can select by name (issue 26), each against hand-computed numbers:
the GenEval training suite apart from the evaluation prompts, Flow-GRPO's exact GenEval reward, STAGE's
similarity masks and KL mask, GCPO's T2I KL mask, the advantage epsilon and d1's bf16 Gumbel sampling."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl.data.shapes import Scene, SceneObject, scene_for_metadata
from mmrl.geneval.prompts import generate_suite, official_metadata, prompt_key, training_suite
from mmrl.rewards import REWARDS, RewardSet

ROOT = Path(__file__).resolve().parents[1]
EVAL_PROMPTS = {prompt_key(m["prompt"]) for m in official_metadata()}


def close(t: torch.Tensor, expected, rtol: float = 1e-6) -> bool:
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=1e-7)

# ------------------------------------------------------------------------------ GenEval training prompts


def test_training_suite_is_disjoint_from_the_553_and_follows_the_official_rules():
    suite = training_suite()
    assert len(EVAL_PROMPTS) == 553
    assert not {prompt_key(r["prompt"]) for r in suite} & EVAL_PROMPTS
    assert len({r["prompt"] for r in suite}) == len(suite) == 3543
    # every record is one of the official generator's records of a training seed, unchanged
    generated = {json.dumps(r, sort_keys=True) for s in range(10) for r in generate_suite(s)}
    assert all(json.dumps(r, sort_keys=True) in generated for r in suite)
    # all 80 single-object prompts are evaluation prompts, so none can be a training prompt
    assert not [r for r in suite if r["tag"] == "single_object"]
    with pytest.raises(ValueError, match="seed 43"):
        training_suite(seeds=(1, 43))


def test_geneval_task_trains_apart_from_its_test_prompts_and_refuses_them(tmp_path):
    from mmrl.data.loading import DatasetError
    from mmrl.data.tasks import load_task

    task = load_task("geneval")
    assert len(task.test) == 553 and {prompt_key(r["prompt"]) for r in task.test} == EVAL_PROMPTS
    assert not {prompt_key(r["prompt"]) for r in task.train} & EVAL_PROMPTS and len(task.train) == 3543
    leaky = tmp_path / "train.jsonl"
    records = training_suite()[:5] + [official_metadata()[7]]
    leaky.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(DatasetError, match="holds 1 of the 553 GenEval evaluation prompts.*geneval_train_on_eval_prompts"):
        load_task("geneval", str(leaky))
    knowingly = load_task("geneval", str(leaky), geneval_train_on_eval_prompts=True)
    assert len(knowingly.train) == 6 and knowingly.info["train_eval_overlap"] == 1


# ------------------------------------------------------------------------------ Flow-GRPO's exact reward

POSITION = {"tag": "position", "include": [{"class": "circle", "count": 1},
                                           {"class": "square", "count": 1, "position": ["left of", 0]}],
            "prompt": "a photo of a square left of a circle"}
SINGLE = {"tag": "single_object", "include": [{"class": "square", "count": 1}], "prompt": "a photo of a square"}


def test_flow_grpo_exact_geneval_reward_by_name_and_by_reward_config():
    wrong_side = Scene([SceneObject("circle", "red", 4, 0), SceneObject("square", "blue", 4, 8)]).render()
    three = Scene([SceneObject("square", "red", 0, 0), SceneObject("square", "green", 6, 6),
                   SceneObject("square", "blue", 0, 8)]).render()
    good = scene_for_metadata(POSITION, 0).render()
    prompts, images, meta = [POSITION["prompt"], SINGLE["prompt"], POSITION["prompt"]], [wrong_side, three, good], [POSITION, SINGLE, POSITION]
    fixed = [o["score"] for o in REWARDS["geneval_partial"]()(prompts, images, metadata=meta)]
    exact = [o["score"] for o in REWARDS["geneval_flow_grpo"]()(prompts, images, metadata=meta)]
    # failed relation: fixed (1 + 1 + 0) / 3; the authors append 0 and then 1.0: (1 + 1 + 0 + 1) / 4
    # three squares for one: fixed max(1 - 2, 0) = 0; the authors 1 - |1 - 3| / 1 = -1
    assert fixed == pytest.approx([2 / 3, 0.0, 1.0])
    assert exact == pytest.approx([3 / 4, -1.0, 1.0])
    via_config = RewardSet(["geneval_partial"], geneval_partial={"flow_grpo_exact": True})(prompts, images, metadata=meta)
    assert via_config.total.tolist() == pytest.approx(exact)
    with pytest.raises(ValueError, match="flow_grpo_exact must be true or false"):
        REWARDS["geneval_partial"](flow_grpo_exact="yes")


def test_mmrl_train_gcpo_geneval_preset_trains_on_no_evaluation_prompt(tmp_path, monkeypatch):
    """`mmrl train configs/gcpo_janus_pro_7b_geneval.yaml` (tiny Janus weights): every prompt that reaches the
    reward is a training-suite prompt, none of the 553."""
    from mmrl.cli import main

    seen = tmp_path / "seen.jsonl"
    (tmp_path / "rec.py").write_text(
        "import json\n"
        "def record(prompts, completions, **kw):\n"
        f"    with open({str(seen)!r}, 'a') as f:\n"
        "        f.writelines(json.dumps(p) + '\\n' for p in prompts)\n"
        "    return [float(i % 3) for i in range(len(prompts))]\n")
    rc = main(["train", str(ROOT / "configs/gcpo_janus_pro_7b_geneval.yaml"), "model_name_or_path=tiny", "max_steps=3",
               "num_generations=2", "per_device_train_batch_size=8", f"output_dir={tmp_path / 'run'}",
               f"reward_funcs=[{tmp_path / 'rec.py'}:record]", "torch_dtype=float32", 'mixed_precision="no"', "save_steps=0"])
    assert rc in (0, None)
    prompts = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(prompts) == 3 * 8 and len(set(prompts)) == 12  # 4 prompts x 2 images per step
    train = {prompt_key(r["prompt"]) for r in training_suite()}
    assert all(prompt_key(p) in train and prompt_key(p) not in EVAL_PROMPTS for p in prompts)


# ------------------------------------------------------------------------------ STAGE and the KL masks


def test_stage_masks_on_a_hand_computed_group():
    from mmrl.algorithms.stage import opposite_advantage_similarity, stage_kl_mask, stage_token_masks, weighted_mean_weights

    # one group of 3 images of 2 tokens, 2-d code vectors; A = (1, -0.5, -0.5): image 0 is opposite to 1 and 2,
    # images 1 and 2 only to 0
    codes = torch.tensor([[[1.0, 0.0], [1.0, 0.0]],
                          [[0.0, 1.0], [-1.0, 0.0]],
                          [[2.0, 0.0], [0.0, 3.0]]])  # [N=3, T=2, C=2] (scale does not matter)
    adv = torch.tensor([1.0, -0.5, -0.5])
    sim = opposite_advantage_similarity(codes, adv, 3)
    # image 0: t0 (cos 0 + cos 1) / 2, t1 (cos -1 + cos 0) / 2; image 1: against 0 only; image 2: against 0 only
    assert close(sim, [[0.5, -0.5], [0.0, -1.0], [1.0, 0.0]])
    assert close(stage_token_masks(sim), [[0.25, 0.75], [0.5, 1.0], [0.0, 0.5]])
    assert close(stage_kl_mask(sim), [[1.0, 0.75], [1.0, 0.5], [1.0, 1.0]])
    # the mask-weighted token mean: masks sum to 3 over the group's 6 tokens, so w = m * 6 / (3 + 1e-6)
    w = weighted_mean_weights(stage_token_masks(sim), torch.ones(3, 2, dtype=torch.bool), 3)
    assert close(w, [[0.5, 1.5], [1.0, 2.0], [0.0, 1.0]])
    # a group of zero advantages: every image is "opposite" to every image, itself included (counted, cosine not
    # added), as the authors' `A_i A_j <= 0` pair mask
    sim0 = opposite_advantage_similarity(codes[:2], torch.zeros(2), 2)
    assert close(sim0, [[0.0, -0.5], [0.0, -0.5]])


def test_gcpo_t2i_kl_mask_and_the_weighted_kl_term():
    from mmrl.algorithms import policy_loss
    from mmrl.algorithms.stage import gcpo_kl_mask

    w = torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0, 3.0]])
    assert close(gcpo_kl_mask(w), [[1.0, 1.0, 1.0, 0.75, 0.5, 0.5]])
    # the KL term is beta * m * k3: with logp - ref = log 2 on every token, k3 = 1/2 - log(1/2) - 1 = log 2 - 1/2
    logp = torch.zeros(1, 6)
    ref = torch.full((1, 6), -float(torch.log(torch.tensor(2.0))))
    mask = torch.ones(1, 6, dtype=torch.bool)
    k3 = float(torch.log(torch.tensor(2.0))) - 0.5
    loss, m = policy_loss(logp, logp, torch.zeros(1), mask, ref_logp=ref, beta=0.03, kl_weights=gcpo_kl_mask(w))
    assert close(loss, [[0.03 * k3 * x for x in (1.0, 1.0, 1.0, 0.75, 0.5, 0.5)]], rtol=1e-5)
    assert float(m["kl"]) == pytest.approx(k3)  # the metric stays the unweighted KL


def test_advantage_epsilon_reaches_the_advantages():
    from types import SimpleNamespace

    from mmrl.config import load_config
    from mmrl.trainer import Trainer

    rewards = torch.tensor([0.0, 1e-3, 0.0, 1.0])  # a group of nearly equal rewards, and a clear one
    std = 1e-3 / 2 ** 0.5  # unbiased std of (0, 1e-3)
    for eps in (1e-6, 1e-4):
        cfg = load_config(None, dict(method="grpo", num_generations=2, advantage_epsilon=eps))
        adv = Trainer._advantages(SimpleNamespace(cfg=cfg, world=1), rewards, torch.ones(4, dtype=torch.bool))
        assert adv[:2].tolist() == pytest.approx([-5e-4 / (std + eps), 5e-4 / (std + eps)], rel=1e-5)
    # 1e-6: +-0.7061; the authors' 1e-4: +-0.6195 (the smaller push on near-ties)
    gcpo = load_config(ROOT / "configs/gcpo_janus_pro_7b_geneval.yaml")
    stage = load_config(ROOT / "configs/stage_janus_pro_7b_geneval.yaml")
    assert gcpo.advantage_epsilon == stage.advantage_epsilon == 1e-4 and gcpo.kl_reweight and stage.kl_reweight
    assert gcpo.reward_funcs == stage.reward_funcs == ["geneval_flow_grpo"]
    assert stage.method == "stage" and stage.num_generations == 8 and stage.beta == 0.03
    grpo = load_config(ROOT / "configs/grpo_janus_pro_7b_geneval.yaml")
    assert grpo.method == "grpo" and not grpo.kl_reweight
    with pytest.raises(Exception, match="kl_reweight=true weights the KL"):
        load_config(None, dict(method="grpo", kl_reweight=True))


@pytest.mark.parametrize("preset", ["stage_janus_pro_7b_geneval", "gcpo_janus_pro_7b_geneval"])
def test_stage_and_gcpo_presets_train_two_steps_with_their_kl_masks(tmp_path, preset, monkeypatch):
    from mmrl.algorithms import policy_loss as plain_policy_loss
    from mmrl.config import load_config
    from mmrl.methods import policy_gradient
    from mmrl.trainer import Trainer

    seen = []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("kl_weights"))
        return plain_policy_loss(*args, **kwargs)

    monkeypatch.setattr(policy_gradient, "policy_loss", recording)
    cfg = load_config(ROOT / f"configs/{preset}.yaml", dict(
        model_name_or_path="tiny", max_steps=2, num_generations=4, per_device_train_batch_size=4, save_steps=0,
        torch_dtype="float32", mixed_precision="no", output_dir=str(tmp_path / "run"), reward_funcs=[]))

    def reward(prompts, completions, **kw):
        return [float(i % 3) for i in range(len(prompts))]

    t = Trainer(cfg, reward_funcs=[reward])
    t.train()
    assert len(seen) == 2 and all(k is not None for k in seen)
    for k in seen:  # STAGE: 0.5 + 0.5 clamp(c + 1, 0, 1); GCPO: 0.5 + 0.5 clamp(2 - 2w, 0, 1): both in [0.5, 1]
        assert float(k.min()) >= 0.5 and float(k.max()) <= 1.0
    assert any(float(k.min()) < 1.0 for k in seen)


# ------------------------------------------------------------------------------ d1's bf16 Gumbel sampling


def test_bf16_gumbel_sampling_is_d1s_lower_entropy_draw():
    from mmrl.models.dllm_samplers import gumbel_argmax

    # exp(89) and exp(100) both overflow bfloat16 to inf and argmax takes the first: d1's draw picks token 0, whose
    # probability is e^-11 = 1.7e-5
    logits = torch.tensor([[89.0, 100.0]]).expand(64, 2)
    g = torch.Generator().manual_seed(0)
    assert gumbel_argmax(logits, 1.0, g, noise_dtype="bfloat16").tolist() == [0] * 64
    assert gumbel_argmax(logits, 1.0, g).tolist() == [1] * 64
    # a toy categorical of 256 tokens, logits 0 .. -12: the float64 draw has the entropy of softmax(logits)
    # (4.056 nats), d1's bf16 draw about 3.81
    logits = torch.linspace(0.0, -12.0, 256)
    p = torch.softmax(logits, -1)
    exact = float(-(p * p.log()).sum())
    assert exact == pytest.approx(4.056, abs=1e-3)
    big = logits.expand(100_000, 256).contiguous()

    def entropy(dtype):
        x = gumbel_argmax(big, 1.0, torch.Generator().manual_seed(1), noise_dtype=dtype)
        q = torch.bincount(x, minlength=256).double() / len(x)
        q = q[q > 0]
        return float(-(q * q.log()).sum())

    assert entropy("float64") == pytest.approx(exact, abs=0.02)
    assert entropy("bfloat16") < exact - 0.15
    with pytest.raises(ValueError, match="unknown gumbel noise dtype"):
        gumbel_argmax(big[:1], 1.0, noise_dtype="float16")


def test_gumbel_dtype_reaches_the_d1_sampler(monkeypatch):
    from mmrl.config import load_config
    from mmrl.models import adapter_class
    from mmrl.models import dllm_samplers

    d1 = load_config(ROOT / "configs/d1_diffu_grpo_llada_8b.yaml")
    assert d1.gumbel_dtype == "bfloat16"
    assert load_config(ROOT / "configs/dmpo_llada_8b.yaml").gumbel_dtype == "float64"  # DMPO: Fast-dLLM's float64
    dtypes = []
    plain = dllm_samplers.gumbel_argmax

    def recording(*a, noise_dtype="float64", **k):
        dtypes.append(noise_dtype)
        return plain(*a, noise_dtype=noise_dtype, **k)

    monkeypatch.setattr(dllm_samplers, "gumbel_argmax", recording)
    policy = adapter_class("masked_diffusion").tiny(seed=0)
    policy.sample(["ab"], 2, generator=torch.Generator().manual_seed(0), gen_length=8, steps=4, temperature=1.0,
                  gumbel_dtype="bfloat16")
    assert dtypes and set(dtypes) == {"bfloat16"}
    with pytest.raises(ValueError, match="gumbel_dtype='bfloat16' reproduces d1's low-confidence"):
        policy.sample(["ab"], 2, gen_length=8, steps=4, sampler="threshold", gumbel_dtype="bfloat16")
