"""GenEval training prompts apart from the 553 evaluation prompts, and Flow-GRPO's exact GenEval reward by name
(issue 26): the suite, the task's refusal, the reward against hand-computed scores, `mmrl train` on the GCPO preset."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmrl.tiny_world.shapes import Scene, SceneObject, scene_for_metadata
from mmrl.geneval.prompts import generate_suite, official_metadata, prompt_key, training_suite
from mmrl.rewards import REWARDS, RewardSet

ROOT = Path(__file__).resolve().parents[2]


def close(t: torch.Tensor, expected, rtol: float = 1e-6) -> bool:
    return torch.allclose(t.double(), torch.tensor(expected, dtype=torch.float64), rtol=rtol, atol=1e-7)


EVAL_PROMPTS = {prompt_key(m["prompt"]) for m in official_metadata()}

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


